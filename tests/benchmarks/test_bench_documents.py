"""Smoke version of the documents benchmark (the full one: `python -m benchmarks.bench_documents`)."""
from __future__ import annotations

import json

from benchmarks.bench_documents import group, joined, main, punctuated
from tests.conftest import SHARED_DATA, shared_path


def test_paragraphs_are_4_to_8_consecutive_lines_joined_as_written():
    lines = [f"Satz {i}." for i in range(40)]
    spans = group(lines, 4, 8)
    assert [b - a for a, b in spans] == [4, 5, 6, 7, 8, 4, 5, 1]
    assert joined(lines, spans)[0] == "Satz 0. Satz 1. Satz 2. Satz 3." and "\n" in joined(lines, spans)[4]
    assert punctuated("Ein Hund") == "Ein Hund." and punctuated("Wer?") == "Wer?"


def test_bench_documents_smoke(demo_model_dir, tmp_path):
    shared_path("multi30k", "test_2016_flickr.de")
    out = tmp_path / "documents"
    main(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--sets", "multi30k", "--lines", "24",
          "--rounds", "1", "--beam", "2", "--threads", "1", "--out", str(out)])
    [s] = json.loads(out.with_suffix(".json").read_text())["sets"]
    systems = s["systems"]
    assert (s["lines"], s["paragraphs"]) == (24, 5)  # 4 + 5 + 6 + 7 + 2
    assert systems["paragraphs"]["bleu"] == systems["sentences"]["bleu"]  # the same sentences, decoded alike
    assert systems["paragraphs, no split"]["bleu"] < systems["paragraphs"]["bleu"]
    assert systems["paragraphs"]["target_tokens"] == systems["sentences"]["target_tokens"]
