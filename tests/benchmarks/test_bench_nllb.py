"""Smoke version of the NLLB peer benchmark (the full one is `python -m benchmarks.bench_nllb`): a tiny
shape, every system (ours float32 / shortlist / int8, CTranslate2 float32 / int8, HF generate) runs."""
from __future__ import annotations

import pytest

from tests.conftest import shared_path

pytest.importorskip("ctranslate2")
pytest.importorskip("transformers")


def test_bench_nllb_smoke_runs_every_system(tmp_path):
    shared_path("multi30k", "train.fr")
    from benchmarks.bench_nllb import main

    table = main(["--layers", "1", "--lines", "4", "--d-model", "32", "--heads", "4", "--ffn", "64", "--vocab", "5000",
                  "--repeats", "1", "--max-length", "8", "--threads", "1", "--work-dir", str(tmp_path)])
    assert [row["system"].split(" (")[0] for row in table] == [
        "ours float32", "ours float32 + shortlist", "ours int8", "CTranslate2 float32", "CTranslate2 int8",
        "HF generate float32"]
    assert table[0]["vs_ours_float32"] == 1.0 and all(row["target_tokens"] > 0 for row in table)
    assert table[0]["target_tokens"] == table[-1]["target_tokens"]  # ours and HF: the same search, the same tokens
