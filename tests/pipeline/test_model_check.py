"""The driver's model-directory check: hostile directories are refused quickly, with every problem
named, before anything large is read or allocated; real models pass in well under a second."""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from raymt.pipeline.decoders.model_check import ModelError, check_model
from tests.conftest import ROOT

BASE_MODEL = ROOT.parent / "shared" / "models" / "base-de-en"
SAMPLE = ROOT / "examples" / "sample.de.txt"
FC1 = "model.encoder.layers.0.fc1"
MIB = 1 << 20


@pytest.fixture
def model(tmp_path, demo_model_dir) -> Path:
    """A writable copy of the demo model, to corrupt."""
    return Path(shutil.copytree(demo_model_dir, tmp_path / "model"))


def edit_config(model: Path, **changes) -> None:
    hf = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**hf, **changes}))


def edit_weights(model: Path, edit) -> None:
    path = model / "model.safetensors"
    weights = load_file(path)
    edit(weights)
    save_file(weights, path, metadata={"format": "pt"})


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # bytes (Linux reports KiB)


def refused(model: Path) -> list[str]:
    """The problems check_model names, asserting it took < 2 s and raised the process's peak memory < 256 MiB."""
    peak, start = peak_rss(), time.perf_counter()
    with pytest.raises(ModelError) as err:
        check_model(str(model))
    assert time.perf_counter() - start < 2.0
    assert peak_rss() - peak < 256 * MIB
    assert str(err.value).startswith(f"model {model} cannot be used:")
    return err.value.problems


@pytest.mark.parametrize("name", ["demo", "base"])
def test_real_models_pass_in_well_under_a_second(name, demo_model_dir):
    path = demo_model_dir if name == "demo" else BASE_MODEL
    if not (path / "model.safetensors").exists():
        pytest.skip(f"{path} not found")
    check_model(str(path))  # warm: sentencepiece and torch's meta device paths loaded once
    start = time.perf_counter()
    check_model(str(path))
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(("changes", "problem"), [
    (dict(max_position_embeddings=10**9), "config.json: max_position_embeddings=1000000000 outside 1..65536"),
    (dict(d_model=10**6), "config.json: d_model=1000000 outside 1..16384"),
    (dict(max_position_embeddings=1e9), "config.json: max_position_embeddings=1000000000.0 is not an integer"),
    (dict(vocab_size=10**9, decoder_vocab_size=10**9), "config.json: vocab_size=1000000000 outside 1..1048576"),
    (dict(decoder_layers=10**6), "config.json: decoder_layers=1000000 outside 1..64"),
    (dict(encoder_ffn_dim=-4), "config.json: encoder_ffn_dim=-4 outside 1..65536"),
    (dict(max_position_embeddings=65536, d_model=1024, decoder_attention_heads=16, encoder_attention_heads=16),
     "config.json: max_position_embeddings * d_model = 65536 * 1024 over 16777216"),
    (dict(encoder_attention_heads=3), "config.json: d_model 256 not divisible by encoder_attention_heads=3"),
    (dict(decoder_attention_heads=6), "config.json: d_model 256 not divisible by decoder_attention_heads=6"),
    (dict(pad_token_id=8001), "config.json: pad_token_id=8001 outside the vocabulary (0..8000)"),
    (dict(eos_token_id="0"), "config.json: eos_token_id='0' is not an integer"),
])
def test_a_config_out_of_bounds_is_refused_before_anything_is_allocated(model, changes, problem):
    edit_config(model, **changes)
    problems = refused(model)
    assert problem in problems, problems


def test_a_truncated_safetensors_file_is_refused_with_both_sizes(model):
    path = model / "model.safetensors"
    size = path.stat().st_size
    os.truncate(path, size - 1000)
    assert refused(model) == [f"model.safetensors is truncated: {size - 1000} bytes, its header describes {size}"]
    with path.open("ab") as f:
        f.write(b"\0" * 1010)
    assert refused(model) == [f"model.safetensors has 10 bytes after the data its header describes "
                              f"({size + 10} bytes, expected {size})"]


def test_a_renamed_tensor_is_named_both_ways(model):
    edit_weights(model, lambda w: w.update({"model.encoder.layers.0.fc9.weight": w.pop(f"{FC1}.weight")}))
    assert refused(model) == ["model.safetensors: unexpected weight key 'model.encoder.layers.0.fc9.weight'",
                              f"model.safetensors: missing weight key '{FC1}.weight'"]


def test_a_misshaped_or_integer_tensor_is_named(model):
    def edit(w):
        w[f"{FC1}.bias"] = torch.zeros(1023, dtype=torch.float16)
        w["model.encoder.layers.0.fc2.bias"] = torch.zeros(256, dtype=torch.int32)
    edit_weights(model, edit)
    assert refused(model) == [
        "model.safetensors: tensor 'model.encoder.layers.0.fc2.bias' has dtype I32 (loadable: F16, BF16, F32, F64)",
        f"model.safetensors: '{FC1}.bias' has shape (1023,), model expects (1024,)"]


def test_a_config_that_does_not_match_the_weights_lists_the_first_tensors_and_counts_the_rest(model):
    edit_config(model, encoder_ffn_dim=2048, decoder_ffn_dim=2048)  # in bounds: 7 layers x fc1 weight, bias, fc2 weight
    problems = refused(model)
    assert problems[0] == f"model.safetensors: '{FC1}.weight' has shape (1024, 256), model expects (2048, 256)"
    assert len(problems) == 13 and problems[-1] == "... and 9 more of the same kind", problems


def test_garbage_tokenizer_files_are_named_one_line_each(model):
    (model / "source.spm").write_bytes(os.urandom(4096))
    (model / "target.spm").write_bytes(b"")
    (model / "vocab.json").write_text(json.dumps(["</s>", "<unk>", "<pad>"]))
    assert refused(model) == ["source.spm is not a sentencepiece model (it does not parse)", "target.spm is empty",
                              "vocab.json is not a JSON object of piece -> id (it is a list)"]


@pytest.mark.parametrize(("vocab", "problem"), [
    ({"</s>": 0, "<unk>": 1, "a": "2", "<pad>": 3}, "vocab.json: 1 piece(s) without a non-negative integer id "
                                                     "(first: 'a': '2')"),
    ({"</s>": 0, "<unk>": 1}, "vocab.json lacks special tokens ['<pad>']"),
    ({"</s>": 0, "<unk>": 1, "<pad>": 9000}, "vocab.json has ids up to 9000, outside the model's vocabulary of 8001"),
    ("{not json", "vocab.json is not valid JSON"),
])
def test_a_vocabulary_that_would_fail_later_is_refused(model, vocab, problem):
    (model / "vocab.json").write_text(vocab if isinstance(vocab, str) else json.dumps(vocab))
    problems = refused(model)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_every_problem_is_listed_in_one_error(model):
    edit_config(model, d_model=10**6, max_position_embeddings=10**9)
    (model / "source.spm").write_bytes(b"garbage")
    (model / "vocab.json").write_text("[]")
    (model / "target.spm").unlink()
    os.truncate(model / "model.safetensors", 100)
    problems = refused(model)
    assert problems[:5] == ["config.json: d_model=1000000 outside 1..16384",
                            "config.json: max_position_embeddings=1000000000 outside 1..65536",
                            "tokenizer file(s) missing: target.spm",
                            "source.spm is not a sentencepiece model (it does not parse)",
                            "vocab.json is not a JSON object of piece -> id (it is a list)"]
    assert problems[5].startswith("model.safetensors is not a readable safetensors file"), problems


def test_a_local_pytorch_model_bin_is_checked_by_its_shapes(model):
    weights = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    torch.save(weights, model / "pytorch_model.bin")
    check_model(str(model))
    weights[f"{FC1}.weight"] = weights[f"{FC1}.weight"][:, :10].contiguous()
    torch.save(weights, model / "pytorch_model.bin")
    assert refused(model) == [f"'{FC1}.weight' has shape (1024, 10), model expects (1024, 256)"]
    (model / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")  # a bare pickle: not torch.save's zip
    assert refused(model)[0].startswith("pytorch_model.bin is not a zip archive")


def test_the_cli_refuses_a_hostile_model_in_one_message_without_a_traceback_or_output(model, tmp_path):
    edit_config(model, max_position_embeddings=10**9)
    os.truncate(model / "model.safetensors", (model / "model.safetensors").stat().st_size - 1000)
    out = tmp_path / "out.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_JOB_ID")}
    done = subprocess.run([sys.executable, "-m", "raymt.jobs.translate", "--in-process", "--model", str(model), "--input",
                           str(SAMPLE), "--output", str(out)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert lines[0] == f"error: model {model} cannot be used:", done.stderr
    assert lines[1:] == ["  - config.json: max_position_embeddings=1000000000 outside 1..65536",
                         f"  - model.safetensors is truncated: {(model / 'model.safetensors').stat().st_size} bytes, "
                         f"its header describes {(model / 'model.safetensors').stat().st_size + 1000}"], done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not any(p.name.startswith("out.txt") for p in tmp_path.iterdir())


def test_a_model_on_an_object_store_is_checked_from_its_header(s3, model):
    s3.put(str(model), "corpus-bucket/model", recursive=True)
    check_model("s3://corpus-bucket/model")
    s3.pipe_file("corpus-bucket/bad/config.json", (model / "config.json").read_bytes())
    for name in ("source.spm", "target.spm", "vocab.json"):
        s3.pipe_file(f"corpus-bucket/bad/{name}", (model / name).read_bytes())
    weights = (model / "model.safetensors").read_bytes()
    s3.pipe_file("corpus-bucket/bad/model.safetensors", weights[:-1000])
    with pytest.raises(ModelError) as err:
        check_model("s3://corpus-bucket/bad")
    assert err.value.problems == [f"model.safetensors is truncated: {len(weights) - 1000} bytes, "
                                  f"its header describes {len(weights)}"]
    s3.rm("corpus-bucket/bad/model.safetensors")
    s3.pipe_file("corpus-bucket/bad/pytorch_model.bin", b"PK\x03\x04" + bytes(1000))  # remote: magic and size only
    with pytest.raises(ModelError, match=r"pytorch_model.bin is 1004 bytes, too small for the 8367616 weights"):
        check_model("s3://corpus-bucket/bad")
