"""The translate job's contract: .txt/.parquet in, .txt/.parquet out, input order, n-best."""
from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymt.jobs.translate import main
from tests.conftest import ROOT

SAMPLE = ROOT / "examples" / "sample.de.txt"


def test_txt_to_txt_keeps_line_count_and_order(demo_model_dir, tmp_path):
    out = tmp_path / "out.en.txt"
    main(["--in-process", "--model", str(demo_model_dir), "--input", str(SAMPLE), "--output", str(out), "--beam-size", "2"])
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    sources = SAMPLE.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len(sources)
    assert all(line.strip() for line in lines)
    assert "dog" in lines[3].lower()  # "Ein Hund rennt über eine grüne Wiese."


def test_parquet_to_parquet_with_ids_and_nbest(demo_model_dir, tmp_path):
    src = tmp_path / "in.parquet"
    texts = ["Ein Hund läuft.", "", "Zwei Männer spielen Fußball."]
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": texts}), src)
    out = tmp_path / "out.parquet"
    main(["--in-process", "--model", str(demo_model_dir), "--input", str(src), "--output", str(out),
          "--beam-size", "3", "--nbest", "3"])
    table = pq.read_table(out).to_pylist()
    assert [r["id"] for r in table] == ["a", "b", "c"]
    assert [r["source"] for r in table] == texts
    assert table[1]["translation"] == ""
    for row in (table[0], table[2]):
        assert len(row["nbest"]) == 3
        assert row["nbest"][0]["text"] == row["translation"]
        scores = [h["score"] for h in row["nbest"]]
        assert scores == sorted(scores, reverse=True)
    assert "beam:3" in table[0]["signature"]


def test_missing_text_column_names_columns(demo_model_dir, tmp_path):
    src = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"sentence": ["Hallo"]}), src)
    import pytest
    with pytest.raises(SystemExit, match=r"error: .*bad.parquet: no text column 'text'; columns found"):
        main(["--in-process", "--model", str(demo_model_dir), "--input", str(src), "--output", str(tmp_path / "o.txt")])


def test_streaming_batching_gives_the_batch_output(demo_model_dir, tmp_path):
    outputs = {}
    for mode, flags in (("batch", ["--static-step", "0"]), ("var-stream", ["--static-step", "0"]),
                        ("topup", ["--static-step", "0"]), ("topup", ["--static-step", "3"]),
                        ("topup", ["--static-step", "2", "--late-readback"])):
        out = tmp_path / f"{mode}-{len(outputs)}.txt"
        main(["--in-process", "--model", str(demo_model_dir), "--input", str(SAMPLE), "--output", str(out), "--beam-size", "3",
              "--batching", mode, "--max-batch-size", "4", *flags])
        outputs[mode, *flags] = out.read_text(encoding="utf-8")
    assert len(set(outputs.values())) == 1, outputs  # (the one-shape step, read back every 3 steps, or every 2 and late)


def test_fast_preset_is_the_measured_pruning_unless_heuristics_are_given():
    from raymt.jobs.translate import build_parser, search_config
    from raymt.workers.config import FAST_PRUNING
    base = ["--model", "m", "--input", "i", "--output", "o"]
    assert search_config(build_parser().parse_args(base)).pruning.active is False  # exact by default
    assert search_config(build_parser().parse_args([*base, "--fast"])).pruning == FAST_PRUNING
    assert search_config(build_parser().parse_args([*base, "--fast", "--ap", "2.5"])).pruning.signature() == "ap:2.5"


def test_batching_auto_is_topup_unless_batches_decide_the_output():
    from raymt.jobs.translate import build_parser, decode_config, scheduler_config
    from raymt.workers.decoder.scheduler import Policy
    base = ["--model", "m", "--input", "i", "--output", "o"]
    auto = build_parser().parse_args(base)
    assert scheduler_config(auto).policy is Policy.TOPUP and "|batching:topup" in decode_config(auto).signature("m")
    for extra in (["--shortlist", "lex.s2t"], ["--tune-batch"], ["--batching", "batch"]):
        assert scheduler_config(build_parser().parse_args([*base, *extra])) is None  # length-sorted batches
    assert scheduler_config(build_parser().parse_args([*base, "--batching", "fifo", "--tune-batch"])).policy is Policy.FIFO


def test_batching_defaults_follow_the_device_and_flags_win(tmp_path):
    from raymt.jobs.translate import build_parser, decode_config, pipeline_config
    from raymt.workers.decoder.device import CPU_DEFAULTS, GPU_DEFAULTS
    base = ["--model", "m", "--input", "i", "--output", str(tmp_path / "o")]

    def settings(*extra):
        args = build_parser().parse_args([*base, *extra])
        pc = pipeline_config(args, decode_config(args))
        return pc.decoder.decode, pc.unit_rows

    cpu, units = settings()
    assert (cpu.batching.max_batch_size, cpu.batching.static, cpu.batching.schedule.refill_threshold,
            cpu.runtime.device) == (32, None, 0.5, "cpu")
    assert cpu.batching.schedule.max_batch_sentences == CPU_DEFAULTS.max_batch_size and units is None  # (by input size)
    for gpu_flags in (["--device", "cuda"], ["--gpus-per-decoder", "1"], ["--device", "auto", "--gpus-per-decoder", "1"]):
        gpu, _ = settings(*gpu_flags)
        assert (gpu.batching.max_batch_size, gpu.batching.static.readback_every,
                gpu.batching.schedule.refill_threshold) == (
            GPU_DEFAULTS.max_batch_size, GPU_DEFAULTS.static_step, GPU_DEFAULTS.refill_threshold), gpu_flags
        assert gpu.batching.schedule.capacity == GPU_DEFAULTS.max_batch_size
    given, units = settings("--device", "cuda", "--max-batch-size", "256", "--static-step", "0", "--refill-threshold",
                            "0.5", "--unit-rows", "100")
    assert (given.batching.max_batch_size, given.batching.static, given.batching.schedule.refill_threshold, units) == (
        256, None, 0.5, 100)


@pytest.mark.parametrize("amx", [True, False])
def test_int8_on_amx_tiles_defaults_to_larger_batches_everywhere(tmp_path, monkeypatch, amx, demo_model_dir):
    """int8 where oneDNN runs it on AMX tiles: 64 sentences a batch by default (command line, Python
    API, ``CoreDecoder.load``); float32, and int8 without AMX, keep the CPU's 32; a flag still wins."""
    from raymt.jobs.translate import build_parser, decode_config
    from raymt.workers.kernels import speedups
    from raymt.workers.decoder.decode_config import batching_for
    from raymt.workers.decoder.device import CPU_DEFAULTS, CPU_INT8_AMX_DEFAULTS, batching_defaults_for
    monkeypatch.setattr(speedups, "amx_int8", lambda: amx)
    int8_size = CPU_INT8_AMX_DEFAULTS.max_batch_size if amx else CPU_DEFAULTS.max_batch_size
    assert int8_size == (64 if amx else 32)

    def cli(*extra):
        args = build_parser().parse_args(["--model", "m", "--input", "i", "--output", str(tmp_path / "o"), *extra])
        return decode_config(args).batching

    assert cli("--int8").max_batch_size == int8_size and cli("--int8").schedule.max_batch_sentences == int8_size
    assert cli().max_batch_size == CPU_DEFAULTS.max_batch_size
    assert cli("--int8", "--max-batch-size", "16").max_batch_size == 16
    assert batching_for(False, precision="int8").max_batch_size == int8_size
    assert batching_for(False).max_batch_size == CPU_DEFAULTS.max_batch_size
    assert batching_defaults_for(True, "int8").max_batch_size != int8_size  # (a GPU's own; int8 is refused there)
    from raymt.workers.decoder.core_decoder import CoreDecoder
    from raymt.workers.kernels.speedups import EXACT
    from dataclasses import replace
    assert CoreDecoder.load(str(demo_model_dir), speedups=replace(EXACT, int8=True)).max_batch_size == int8_size
    assert CoreDecoder.load(str(demo_model_dir)).max_batch_size == CPU_DEFAULTS.max_batch_size


def broken_model(tmp_path, demo_model_dir, drop=(), config: bytes | None = None):
    import shutil
    model = tmp_path / "model"
    shutil.copytree(demo_model_dir, model)
    for name in drop:
        (model / name).unlink()
    if config is not None:
        (model / "config.json").write_bytes(config)
    return model


def test_a_broken_model_is_refused_up_front_with_every_problem(demo_model_dir, tmp_path):
    import json

    import pytest
    import ray
    model = broken_model(tmp_path, demo_model_dir, drop=("config.json", "vocab.json", "model.safetensors"))
    with pytest.raises(SystemExit) as e:
        main(["--model", str(model), "--input", str(SAMPLE), "--output", str(tmp_path / "o.txt"), "--local-rows", "0"])
    message = str(e.value)
    assert message.startswith(f"error: model {model} cannot be used:")
    for problem in ("config.json missing", "tokenizer file(s) missing: vocab.json", "no weights"):
        assert problem in message
    assert not ray.is_initialized() and not (tmp_path / "o.txt.parts").exists()  # before Ray, before any output

    model = broken_model(tmp_path / "2", demo_model_dir, config=b"{not json")
    with pytest.raises(SystemExit, match=r"config.json is not valid JSON"):
        main(["--model", str(model), "--input", str(SAMPLE), "--output", str(tmp_path / "o.txt")])
    hf = json.loads((demo_model_dir / "config.json").read_text())
    model = broken_model(tmp_path / "3", demo_model_dir,
                         config=json.dumps({**hf, "model_type": "bart", "normalize_before": True}).encode())
    with pytest.raises(SystemExit, match=r"model_type='bart'(.|\n)*normalize_before=True"):
        main(["--model", str(model), "--input", str(SAMPLE), "--output", str(tmp_path / "o.txt")])


def test_any_file_name_is_assembled_and_a_directory_is_asked_for_by_slash_or_no_extension(demo_model_dir, tmp_path):
    main(["--model", str(demo_model_dir), "--input", str(SAMPLE), "--output", str(tmp_path / "out.en"), "--beam-size", "1"])
    assert len((tmp_path / "out.en").read_text(encoding="utf-8").split("\n")[:-1]) == 12  # a text file, not parts
    main(["--model", str(demo_model_dir), "--input", str(SAMPLE), "--output", f"{tmp_path / 'parts.d'}/",
          "--beam-size", "1"])
    assert (tmp_path / "parts.d" / "_SUCCESS").exists()
    main(["--model", str(demo_model_dir), "--input", str(SAMPLE), "--output", str(tmp_path / "plain"), "--beam-size", "1"])
    assert (tmp_path / "plain" / "_SUCCESS").exists()


def test_a_small_job_without_a_cluster_runs_in_process_without_starting_ray(demo_model_dir, tmp_path):
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_JOB_ID")}
    out = subprocess.run([sys.executable, "-m", "raymt.jobs.translate", "--model", str(demo_model_dir), "--input", str(SAMPLE),
                          "--output", str(tmp_path / "o.txt"), "--beam-size", "2"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "in-process (decoding" in out.stdout and "Started a local Ray instance" not in out.stderr
    assert len((tmp_path / "o.txt").read_text(encoding="utf-8").split("\n")[:-1]) == 12


def test_debug_gives_the_traceback_instead_of_one_line(demo_model_dir, tmp_path):
    import pytest

    from raymt.pipeline.decoders.model_check import ModelError
    model = broken_model(tmp_path, demo_model_dir, drop=("vocab.json",))
    with pytest.raises(ModelError, match="tokenizer file"):
        main(["--model", str(model), "--input", str(SAMPLE), "--output", str(tmp_path / "o.txt"), "--debug"])


def test_an_in_process_job_prints_progress_inside_its_unit(demo_model_dir, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.pipeline.ray_helpers import clean_corpus
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": clean_corpus(400)}), src)
    main(["--model", str(demo_model_dir), "--input", str(src), "--output", str(tmp_path / "o.txt"), "--beam-size", "4",
          "--threads", "1", "--progress-every", "0.5"])
    out = capsys.readouterr().out
    assert "(units 0/1 committed)  decoding" in out and "ETA ~" in out and "in-process (decoding" in out


def test_a_progress_line_comes_while_a_unit_is_read_and_tokenised(demo_model_dir, tmp_path, capsys, monkeypatch):
    """No decoding step moves while a huge row is tokenised and split: the line still comes, saying so
    (the reading is slowed here, as a row of megabytes would take it)."""
    from raymt.pipeline.orchestration.actors import EncoderWorker
    real = EncoderWorker.encode_unit

    def slow(self, unit):
        time.sleep(1.5)
        return real(self, unit)
    monkeypatch.setattr(EncoderWorker, "encode_unit", slow)
    main(["--model", str(demo_model_dir), "--input", str(ROOT / "examples" / "sample.de.txt"), "--output",
          str(tmp_path / "o.txt"), "--beam-size", "1", "--progress-every", "0.3"])
    assert "(units 0/1 committed)  decoding 0 tokens/s  (reading and tokenising unit 00000-0000000000)" \
        in capsys.readouterr().out


def test_one_model_spelled_two_ways_has_one_signature_and_bad_options_are_usage_errors(capsys):
    from raymt.jobs.translate import build_parser, decode_config

    def sig(model: str) -> str:
        args = build_parser().parse_args(["--model", model, "--input", "i", "--output", "o"])
        return decode_config(args).signature(args.model).split("|")[0]
    assert sig("models/demo-de-en") == sig("./models/demo-de-en/") == "model:models/demo-de-en"
    assert sig("s3://b/m/") == "model:s3://b/m"
    with pytest.raises(SystemExit) as e:
        main(["--model", "m", "--input", "i", "--output", "o", "--nbest", "6"])
    assert e.value.code == 2 and "error: num_hypotheses must be in [1, beam_size=5], got 6" in capsys.readouterr().err


def test_rows_not_translated_as_given_are_counted_by_status(demo_model_dir, tmp_path, capsys):
    import json
    (tmp_path / "in.txt").write_text("Ein Hund.\n\n   \nZwei Männer.\n", encoding="utf-8")
    main(["--model", str(demo_model_dir), "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt")])
    assert "rows by status: empty 2, ok 2" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.txt.parts" / "_SUCCESS").read_text())["rows_by_status"] == {"ok": 2, "empty": 2}


def test_every_flag_default_is_the_table_of_defaults():
    from raymt.jobs.translate import build_parser, decode_config
    from raymt.workers.decoder.decode_config import DEFAULTS, SCHEDULE
    args = build_parser().parse_args(["--model", "m", "--input", "i", "--output", "o"])
    decode = decode_config(args)
    assert decode.search == DEFAULTS.search and decode.runtime == DEFAULTS.runtime and decode.shortlist is None
    assert decode.batching.schedule == SCHEDULE and decode.batching.max_batch_size == DEFAULTS.batching.max_batch_size


def test_help_lists_user_flags_first_and_research_knobs_last():
    from raymt.jobs.translate import build_parser
    text = build_parser().format_help()
    text = text[text.index("\noptions:"):]  # after the usage line and the description
    titles = ["input and output columns:", "search:", "shortlist vocabulary", "scheduling and batching",
              "fault tolerance and resume:", "research:"]
    positions = [text.index(t) for t in titles]
    assert positions == sorted(positions), titles
    user = text[: positions[0]]
    for flag in ("--model", "--input", "--output", "--beam-size", "--nbest", "--device", "--decoders", "--threads"):
        assert flag in user, flag
    research = text[positions[-1]:]
    assert all(f in research for f in ("--rp", "--ap", "--fast", "--epsilon", "--flush-every"))
    assert "--rp" not in text[: positions[-1]] and "--max-batch-size" not in user


@pytest.mark.parametrize("device_flags", [["--device", "cuda"], ["--device", "cuda:1"], ["--gpus-per-decoder", "1"],
                                          ["--device", "auto", "--gpus-per-decoder", "1"]])
def test_int8_on_a_gpu_is_refused_in_one_line_before_any_work(demo_model_dir, tmp_path, device_flags):
    """int8 is CPU quantisation: on a GPU it would decode in float32 under an int8 signature."""
    out = tmp_path / "o.txt"
    with pytest.raises(SystemExit) as e:
        main(["--model", str(demo_model_dir), "--input", str(SAMPLE), "--output", str(out), "--int8", *device_flags])
    message = str(e.value.code)
    assert message.startswith("error: int8 runs on the CPU only") and "\n" not in message
    assert "--bf16" in message and not out.exists() and not (tmp_path / "o.txt.parts").exists()


def test_the_signature_names_the_precision_the_decoders_run():
    import dataclasses

    from raymt.jobs.translate import build_parser, decode_config

    def sig(*flags: str, runtime: dict | None = None) -> str:
        args = build_parser().parse_args(["--model", "m", "--input", "i", "--output", "o", *flags])
        decode = decode_config(args)
        if runtime is not None:
            decode = dataclasses.replace(decode, runtime=dataclasses.replace(decode.runtime, **runtime))
        return decode.signature(args.model)

    assert "|int8" in sig("--int8") and "|bf16" in sig("--bf16", "--device", "cuda") and "|fp16" in sig("--fp16")
    assert not {"|int8", "|bf16", "|fp16"} & set(sig().split("|"))
    from raymt.workers.kernels.speedups import EXACT
    assert "int8" not in sig("--int8", runtime={"speedups": EXACT})  # the runtime's precision, not the flag's


def test_sampling_flags_draw_n_samples_a_row_the_same_however_the_job_is_cut(demo_model_dir, tmp_path, capsys):
    """``--num-samples 3 --sampling-topk 20``: three samples a row in its n-best list, the translation
    the best of them; the same samples in one unit of 12 rows and in units of 4 rows decoded 2 at a
    time (a row's draws are keyed by the seed and its own text), others with another seed."""
    src = tmp_path / "in.txt"
    src.write_text(SAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    base = ["--in-process", "--model", str(demo_model_dir), "--input", str(src), "--num-samples", "3",
            "--sampling-topk", "20"]

    def run(name: str, *extra: str) -> list[dict]:
        main([*base, "--output", str(tmp_path / name), *extra])
        return pq.read_table(tmp_path / name).to_pylist()
    whole = run("a.parquet")
    assert all(len(r["nbest"]) == 3 and r["nbest"][0]["text"] == r["translation"] for r in whole)
    assert "sample:t1.0|k20|p1.0|seed0" in whole[0]["signature"] and "beam:3" in whole[0]["signature"]
    def samples(rows: list[dict]) -> list[list[str]]:
        return [[h["text"] for h in r["nbest"]] for r in rows]
    cut = run("b.parquet", "--unit-rows", "4", "--max-batch-size", "2")
    assert samples(cut) == samples(whole)  # (scores: equal up to float sums over other batch shapes)
    assert all(abs(a["score"] - b["score"]) < 1e-4 for x, y in zip(cut, whole) for a, b in zip(x["nbest"], y["nbest"]))
    other = run("c.parquet", "--sampling-seed", "7")
    assert samples(other) != samples(whole)
    with pytest.raises(SystemExit) as e:
        main([*base, "--output", str(tmp_path / "d.parquet"), "--beam-size", "4"])
    assert e.value.code == 2 and "with sampling flags give --num-samples" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--sampling-temperature", "inf"], "sampling temperature must be in [0.0001, 10000], got inf"),
    (["--sampling-temperature", "1e-300"], "sampling temperature must be in [0.0001, 10000], got 1e-300"),
    (["--sampling-temperature", "1e300"], "sampling temperature must be in [0.0001, 10000], got 1e+300"),
    (["--sampling-temperature", "nan"], "sampling temperature must be in [0.0001, 10000], got nan"),
    (["--sampling-topp", "nan"], "sampling top-p must be in (0, 1], got nan"),
    (["--sampling-topk", "-1"], "sampling top-k must be an integer >= 0"),
    (["--num-samples", "100000"], "num_samples (sampling's beam_size) must be in [1, 1024], got 100000"),
    (["--num-samples", "0"], "num_samples (sampling's beam_size) must be in [1, 1024], got 0"),
    (["--beam-size", "100000"], "beam_size must be in [1, 1024], got 100000")])
def test_search_values_the_decoder_cannot_use_are_one_error_line_before_any_work(demo_model_dir, tmp_path, capsys,
                                                                                 flags, message):
    import ray
    out = tmp_path / "o.txt"
    with pytest.raises(SystemExit) as e:
        main(["--model", str(demo_model_dir), "--input", str(SAMPLE), "--output", str(out), *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1 and err.endswith("\n")
    assert not out.exists() and not (tmp_path / "o.txt.parts").exists() and not ray.is_initialized()
