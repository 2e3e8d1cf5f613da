"""The translate job on a real local Ray cluster: exactly once, equal to the in-process CoreDecoder,
resume, evaluation, bad input, a decoder actor SIGKILLed mid-job, a driver SIGKILLed and rerun."""
from __future__ import annotations

import json
import os
import re
import signal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sacrebleu

from raymt.jobs.translate import main
from raymt.pipeline.outputs.sink import OutputStore
from raymt.pipeline.reports.stats_plots import batch_histogram
from tests.pipeline.ray_helpers import (
    SAMPLE,
    assert_exactly_once,
    clean_corpus,
    spawn_driver,
    start_ray,
    wait_for_commits,
    write_corpus,
)
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.core_decoder import CoreDecoder

LONG = " ".join(SAMPLE * 6)  # > 512 source tokens: must be split to fit the model's positions
BAD = [None, "", "   ", "Ein\x00 Hund\x07 läuft.", LONG, "Zwei Hunde\tspielen."]


@pytest.fixture(scope="module")
def cluster():
    import ray
    address = start_ray(num_cpus=2)
    yield address
    ray.shutdown()


def job(model, inp, out, *extra) -> list[str]:
    return ["--model", str(model), "--input", str(inp), "--output", str(out), "--beam-size", "2", "--threads", "1",
            "--unit-rows", "10", *extra]


def test_round_trip_equals_in_process_and_resume_skips_committed(cluster, demo_model_dir, tmp_path, capsys):
    texts = clean_corpus(40) + BAD
    ids = [f"r{i:04d}" for i in range(len(texts))]
    src = write_corpus(tmp_path / "in.parquet", texts)
    out = tmp_path / "out"
    main(job(demo_model_dir, src, out))
    table = assert_exactly_once(str(out), ids).to_pylist()

    translator = CoreDecoder.load(str(demo_model_dir), max_batch_size=32)
    cfg = SearchConfig(beam_size=2, max_decoding_length=256, max_length_a=1.5, max_length_b=10)
    for start in range(0, 40, 10):  # the clean units: same rows, same batches -> identical output
        expected = [t.text for t in translator.translate(texts[start:start + 10], cfg)]
        assert [r["translation"] for r in table[start:start + 10]] == expected
    assert all(r["status"] == "ok" for r in table[:40])

    bad = {r["id"]: r for r in table[40:]}
    assert (bad["r0040"]["status"], bad["r0040"]["translation"], bad["r0040"]["source"]) == ("null", "", None)
    assert (bad["r0041"]["status"], bad["r0041"]["translation"]) == ("empty", "")
    assert bad["r0042"]["status"] == "empty"
    assert bad["r0043"]["status"] == "normalised" and "control" in bad["r0043"]["reason"]
    assert "dog" in bad["r0043"]["translation"].lower()
    assert bad["r0044"]["status"] == "split" and bad["r0044"]["reason"].endswith(" sentences")
    assert bad["r0044"]["reason"] == "72 sentences"  # one piece a sentence
    assert len(bad["r0044"]["translation"].split()) > 400
    assert bad["r0045"]["status"] == "normalised"
    stats = OutputStore(str(out)).read_stats().to_pylist()
    assert sum(s["sentences"] for s in stats) == len(texts)
    assert json.loads(stats[-1]["statuses"]) == {"null": 1, "empty": 2, "normalised": 2, "split": 1}

    # resume: lose one unit (part + marker), rerun the same command: only that unit is decoded again
    store = OutputStore(str(out))
    for lost in [*(out / "_manifest").glob("00000-0000000020-*.json"), *out.glob("part-00000-0000000020-*.parquet")]:
        os.remove(lost)
    capsys.readouterr()
    main(job(demo_model_dir, src, out))
    assert "(4 already committed)" in capsys.readouterr().out
    assert assert_exactly_once(str(out), ids).to_pylist() == table
    assert store.committed() == {f"00000-00000000{i}0" for i in range(5)}


def test_txt_in_txt_out_and_evaluation_from_summed_statistics(cluster, demo_model_dir, tmp_path, capsys):
    texts = clean_corpus(25)
    refs = ["A man rides a bike down a street."] * 25
    src = write_corpus(tmp_path / "in.parquet", texts, ref=refs)
    main(job(demo_model_dir, src, tmp_path / "out.txt", "--evaluate", "--reference-column", "ref", "--report"))
    lines = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 25
    printed = float(re.search(r"BLEU (\d+\.\d+)", capsys.readouterr().out).group(1))
    assert printed == pytest.approx(sacrebleu.corpus_bleu(lines, [refs]).score, abs=0.006)

    # --report: the PNG and a page that embeds it, with the per-actor table and the batch histogram
    png, page = tmp_path / "out.txt.report.png", (tmp_path / "out.txt.report.html").read_text(encoding="utf-8")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in page and "<th>tgt_tok_per_s</th>" in page and "sentences</b>: 25" in page
    stats = OutputStore(str(tmp_path / "out.txt.parts")).read_stats().to_pylist()
    assert sum(batch_histogram(stats).values()) == sum(s["steps"] for s in stats) > 0  # the Figure 8 panel's data


def test_bad_columns_fail_before_any_work(cluster, demo_model_dir, tmp_path):
    pq.write_table(pa.table({"sentence": ["Ein Hund."]}), tmp_path / "in.parquet")
    with pytest.raises(SystemExit, match=r"columns found: \['sentence'\]"):
        main(job(demo_model_dir, tmp_path / "in.parquet", tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_decoder_actor_killed_mid_job_loses_and_duplicates_nothing(cluster, demo_model_dir, tmp_path):
    texts = clean_corpus(240)
    src = write_corpus(tmp_path / "in.parquet", texts)
    out = tmp_path / "out"
    proc = spawn_driver(cluster, job(demo_model_dir, src, out, "--decoders", "1"), tmp_path / "driver.log")
    first = wait_for_commits(str(out), 2, proc)
    pid = int(json.loads(next((out / "_manifest").glob(f"{sorted(first)[0]}-*.json")).read_text())["actor"].split(":")[1])
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=300) == 0, (tmp_path / "driver.log").read_text()
    assert_exactly_once(str(out), [f"r{i:04d}" for i in range(240)])
    actors = {json.loads(p.read_text())["actor"] for p in (out / "_manifest").glob("*.json")}
    assert len(actors) >= 2, "a restarted decoder actor finished the job"


def test_driver_killed_mid_job_and_resubmitted_resumes(cluster, demo_model_dir, tmp_path, capsys):
    texts = clean_corpus(240)
    src = write_corpus(tmp_path / "in.parquet", texts)
    out = tmp_path / "out"
    proc = spawn_driver(cluster, job(demo_model_dir, src, out), tmp_path / "driver.log")
    wait_for_commits(str(out), 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    committed = len(OutputStore(str(out)).committed())
    assert 2 <= committed < 24
    capsys.readouterr()
    main(job(demo_model_dir, src, out))
    skipped = int(re.search(r"\((\d+) already committed\)", capsys.readouterr().out).group(1))
    assert skipped >= committed
    assert_exactly_once(str(out), [f"r{i:04d}" for i in range(240)])


def corrupt_row_group(path, group: int, column: int = 1) -> None:
    """Overwrite the header of one row group's text data page; the footer stays readable."""
    chunk = pq.ParquetFile(path).metadata.row_group(group).column(column)
    data = bytearray(path.read_bytes())
    data[chunk.data_page_offset:chunk.data_page_offset + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("encoders", ["1", "0"])
def test_unreadable_unit_fails_alone_after_its_attempts_and_the_rest_is_committed(cluster, demo_model_dir, tmp_path,
                                                                                 encoders):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"r{i:04d}" for i in range(40)], "text": clean_corpus(40)}), src,
                   row_group_size=10, compression="snappy")
    corrupt_row_group(src, 2)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"1 unit\(s\) failed every attempt(.|\n)*00000-0000000020: \w+"):
        main(job(demo_model_dir, src, out, "--encoders", encoders))
    store = OutputStore(str(out))
    assert store.committed() == {"00000-0000000000", "00000-0000000010", "00000-0000000030"}
    assert not (out / "_SUCCESS").exists()


def test_skip_corrupt_writes_an_unreadable_units_rows_with_their_status(cluster, demo_model_dir, tmp_path, capsys):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": clean_corpus(30)}), src, row_group_size=10, compression="snappy")
    corrupt_row_group(src, 1, column=0)
    out = tmp_path / "out"
    main(job(demo_model_dir, src, out, "--skip-corrupt"))
    assert "unreadable unit 00000-0000000010" in capsys.readouterr().out
    table = assert_exactly_once(str(out), [str(i) for i in range(30)]).to_pylist()  # no id column: row numbers
    assert [r["status"] for r in table[10:20]] == ["unreadable"] * 10
    assert all(r["translation"] == "" and "could not be read" in r["reason"] for r in table[10:20])
    assert all(r["status"] == "ok" and r["translation"] for r in table[:10] + table[20:])
    assert "00000-0000000010" in json.loads((out / "_SUCCESS").read_text())["unreadable_units"]
    main(job(demo_model_dir, src, out, "--skip-corrupt"))  # a rerun: nothing to do, the summary keeps the gap
    assert "00000-0000000010" in json.loads((out / "_SUCCESS").read_text())["unreadable_units"]


def test_in_process_and_ray_routes_give_identical_output_tables(cluster, demo_model_dir, tmp_path):
    texts = clean_corpus(14) + BAD
    src = write_corpus(tmp_path / "in.parquet", texts)
    main(job(demo_model_dir, src, tmp_path / "ray.parquet"))
    main(job(demo_model_dir, src, tmp_path / "here.parquet", "--in-process"))
    ray_table, here = pq.read_table(tmp_path / "ray.parquet"), pq.read_table(tmp_path / "here.parquet")
    assert ray_table.equals(here)  # same cleaning, splitting, statuses, reasons, columns and translations
    assert ray_table.num_rows == len(texts) and set(ray_table.column("status").to_pylist()) == {
        "ok", "null", "empty", "normalised", "split"}
