"""The per-part profile (``benchmarks.parts``): its arithmetic recovers known parts, and a small run
of every system over the shape variants reports every part."""
from __future__ import annotations

import json

import pytest

from benchmarks.parts import main, part_table, variants
from benchmarks.shapes import Shape
from tests.conftest import SHARED_DATA, shared_path

SHAPE = Shape(512, 8, 2048, 58101, "swish")


def test_the_differences_recover_each_part():
    """Times built from known parts (linear in the vocabulary and the layer counts) give them back."""
    enc_layer, dec_layer, per_word, rest = 2e-6, 30e-6, 5e-9, 40e-6

    def seconds(s: Shape) -> float:
        return s.encoder_layers * enc_layer + s.decoder_layers * dec_layer + s.vocab * per_word + rest

    times = {("ours", name): (seconds(s), seconds(s) * 1.01) for name, s in variants(SHAPE).items()}
    flops = {"encoder": 1e6, "decoder layers": 2e7, "output layer": 3e7}
    rows = {r["part"]: r for r in part_table(times, SHAPE, flops, 100.0, ["ours"])}
    assert rows["encoder"]["ms_per_1k_tokens"] == pytest.approx(6 * enc_layer * 1e6, rel=1e-3)
    assert rows["decoder layers"]["ms_per_1k_tokens"] == pytest.approx(6 * dec_layer * 1e6, rel=1e-3)
    assert rows["output layer"]["ms_per_1k_tokens"] == pytest.approx(58101 * per_word * 1e6, rel=1e-3)
    assert rows["the rest"]["ms_per_1k_tokens"] == pytest.approx(rest * 1e6, rel=1e-3)
    assert rows["output layer"]["gflop_per_s"] == pytest.approx(3e7 / (58101 * per_word) / 1e9, rel=1e-3)
    assert sum(r["share"] for r in rows.values() if r["part"] != "whole step") == pytest.approx(1.0)


def test_a_small_run_reports_every_part_for_ours_and_ctranslate2(tmp_path):
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    shared_path("multi30k", "test_2016_flickr.de")
    shared_path("..", "models", "base-de-en", "vocab.json")
    out = tmp_path / "parts"
    main(["--shape", "tiny", "--data", str(SHARED_DATA), "--lines", "4", "--beam", "2", "--repeats", "1",
          "--max-tokens", "4", "--systems", "ours-exact,ct2-float32", "--work", str(tmp_path / "work"),
          "--out", str(out)])
    report = json.loads(out.with_suffix(".json").read_text())
    parts = {(r["system"], r["part"]) for r in report["parts"]}
    assert parts == {(s, p) for s in ("ours-exact", "ct2-float32")
                     for p in ("encoder", "decoder layers", "output layer", "the rest", "whole step")}
    assert len(report["runs"]) == 8
