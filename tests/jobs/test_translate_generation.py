"""The translate job on an M2M100 directory with its own generation settings (beam 5, early stopping
on): the flags left out take them and the outputs equal HF ``generate(**inputs)``; a flag given wins;
the signature (and so the plan a resume is checked against) records the effective values; settings
the decoder does not implement stop the job in one line; a Marian directory keeps the product's search."""
from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest

from raymt.jobs.translate import build_parser, decode_config, main, model_generation
from raymt.workers.decoder.decode_config import DEFAULTS
from raymt.workers.decoder.core_decoder import CoreDecoder

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from tests.workers.test_generation_defaults import (  # noqa: E402
    GENERATION, SOURCE, TARGET, held_out_lines, hf_reference, make_early_stopping_dir)

EFFECTIVE = "beam:5|nbest:1|lp:1.0|maxlen:0.0*src+23<= 23|early-stopping|prune:none"


@pytest.fixture(scope="module")
def early_dir(tmp_path_factory):
    return make_early_stopping_dir(tmp_path_factory.mktemp("m2m100-early"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "in.txt"
    path.write_text("\n".join(held_out_lines()) + "\n", encoding="utf-8")
    return path


def job(model, corpus, output, *flags: str) -> list[dict]:
    main(["--in-process", "--threads", "1", "--model", str(model), "--input", str(corpus), "--output", str(output),
          "--source-lang", SOURCE, *flags])
    return pq.read_table(output).to_pylist() if str(output).endswith(".parquet") else []


def texts(directory, seqs) -> list[str]:
    tok = CoreDecoder.load(str(directory)).checkpoint.tokenizer
    return [tok.decode(list(s)) for s in seqs]


def test_flags_left_out_take_the_models_settings_and_flags_given_win(early_dir, corpus, tmp_path):
    lines = held_out_lines()
    fr = transformers.M2M100Tokenizer.from_pretrained(str(early_dir)).get_lang_id(TARGET)
    rows = job(early_dir, corpus, tmp_path / "default.parquet", "--target-lang", TARGET)
    assert [r["translation"] for r in rows] == texts(early_dir, hf_reference(early_dir, lines, forced_bos_token_id=fr))
    assert rows[0]["signature"].split("|", 1)[1] == f"{EFFECTIVE}|batching:topup|langs:{SOURCE}>{TARGET}|sentences"
    rows = job(early_dir, corpus, tmp_path / "given.parquet", "--target-lang", TARGET, "--beam-size", "2",
               "--no-early-stopping")
    want = hf_reference(early_dir, lines, forced_bos_token_id=fr, num_beams=2, early_stopping=False)
    assert [r["translation"] for r in rows] == texts(early_dir, want)
    assert "|beam:2|nbest:1|lp:1.0|maxlen:0.0*src+23<= 23|prune:none|" in rows[0]["signature"]


def test_a_changed_generation_config_is_another_plan(early_dir, corpus, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(early_dir, model)
    out = tmp_path / "out/"
    job(model, corpus, out, "--target-lang", TARGET)
    (model / "generation_config.json").write_text(json.dumps({**GENERATION, "num_beams": 3}))
    with pytest.raises(SystemExit, match=r"(?s)error: .*started by another plan.*beam:3"):
        job(model, corpus, out, "--target-lang", TARGET)


def test_the_settings_target_language_is_the_default_and_refusals_are_one_line(early_dir, corpus, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(early_dir, model)
    fr = transformers.M2M100Tokenizer.from_pretrained(str(model)).get_lang_id(TARGET)
    (model / "generation_config.json").write_text(json.dumps({**GENERATION, "forced_bos_token_id": fr}))
    rows = job(model, corpus, tmp_path / "forced.parquet")  # no --target-lang: the model's
    assert [r["translation"] for r in rows] == texts(model, hf_reference(model, held_out_lines()))
    assert rows[0]["signature"].endswith(f"|langs:{SOURCE}>{TARGET}|sentences")
    with pytest.raises(SystemExit) as error:  # --nbest over the model's beam size: says where the beam comes from
        job(model, corpus, tmp_path / "nbest.txt", "--nbest", "6")
    assert error.value.code == 2 and "num_beams 5; give --beam-size" in capsys.readouterr().err
    (model / "generation_config.json").write_text(json.dumps({**GENERATION, "no_repeat_ngram_size": 3}))
    with pytest.raises(SystemExit) as error:
        job(model, corpus, tmp_path / "ngram.txt", "--target-lang", TARGET)
    message = str(error.value.code)
    assert message.startswith("error: the model's generation settings ask for no_repeat_ngram_size=3")
    assert "\n" not in message
    assert not (tmp_path / "ngram.txt").exists() and not (tmp_path / "ngram.txt.parts").exists()


def test_a_marian_directory_keeps_the_product_search(demo_model_dir):
    args = build_parser().parse_args(["--model", str(demo_model_dir), "--input", "i", "--output", "o"])
    generation = model_generation(args)
    assert generation is None and args.target_lang is None and decode_config(args, generation).search == DEFAULTS.search
