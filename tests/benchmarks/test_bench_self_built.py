"""Smoke version of the self-built shortlist sample-size study (the full one: `python -m benchmarks.bench_self_built`)."""
from __future__ import annotations

import json

from benchmarks.bench_self_built import main
from tests.conftest import SHARED_DATA, shared_path


def test_bench_self_built_smoke(demo_model_dir, tmp_path):
    shared_path("multi30k", "train.de")
    out = tmp_path / "self-built"
    main(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--sizes", "20,40", "--test-lines", "16",
          "--out", str(out)])
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [r["system"] for r in rows] == ["full vocabulary", "WA (bitext) M=10", "self-built M=10", "self-built M=10"]
    assert [r["lines"] for r in rows[2:]] == [20, 40]
    assert rows[0]["coverage"] == 1.0 and rows[0]["bleu_cost"] == 0.0
    assert all(0 < r["coverage"] <= 1 and r["mean_shortlist"] for r in rows[1:])
