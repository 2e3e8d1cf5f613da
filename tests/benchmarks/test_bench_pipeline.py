"""Smoke run of the pipeline-overhead benchmark (the full one is a benchmark, not a timed test)."""
from __future__ import annotations

import json

from benchmarks.bench_pipeline import main
from tests.conftest import SHARED_DATA, shared_path


def test_bench_pipeline_smoke(demo_model_dir, tmp_path):
    import ray
    shared_path("wmt22", "generaltest2022.de-en.src.de")
    try:
        main(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--lines", "40", "--rounds", "2", "--unit-rows", "10",
              "--threads", "1", "--out", str(tmp_path / "report")])
    finally:
        ray.shutdown()
    report = json.loads((tmp_path / "report.json").read_text())
    tokens = [r["target_tokens"] for r in report["runs"]]
    assert len(tokens) == 3 and all(abs(t - tokens[0]) <= 0.02 * tokens[0] for t in tokens[1:])
    assert report["ratio"] > 0 and sum(a["units"] for a in report["actors"]) == 4  # 2 rounds x 2 units of 10 rows
    assert "pipeline ÷ in-process" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "report-stats.png").exists() and (tmp_path / "report-stats.html").exists()
