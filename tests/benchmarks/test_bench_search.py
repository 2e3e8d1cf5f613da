"""Smoke version of the search benchmark (the full one is `python -m benchmarks.bench_search`)."""
from __future__ import annotations

import json

from benchmarks.bench_search import main
from tests.conftest import SHARED_DATA, shared_path


def test_bench_search_smoke_writes_both_tables(demo_model_dir, tmp_path):
    shared_path("multi30k", "train.de")
    out = tmp_path / "search"
    main(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--sets", "multi30k", "--lines", "24",
          "--beams", "4", "--repeats", "1", "--train-lines", "300", "--self-built-lines", "16", "--out", str(out)])
    report = json.loads(out.with_suffix(".json").read_text())
    pruning = report["tables"]["multi30k/pruning/beam4"]
    assert pruning[0]["pruning"] == "none" and pruning[0]["speedup"] == 1.0 and pruning[0]["search_errors"] == 0
    assert len(pruning) == 8
    for row in pruning[1:]:
        assert row["tot_fan_out_per_sent"] <= pruning[0]["tot_fan_out_per_sent"]
    shortlist = report["tables"]["multi30k/shortlist"]
    assert shortlist[0]["system"] == "full vocabulary" and shortlist[0]["coverage"] == 1.0
    assert all(0.0 < row["coverage"] <= 1.0 for row in shortlist)
    assert all(row["mean_shortlist"] for row in shortlist[1:])
    assert "Freitag" in out.with_suffix(".md").read_text()
