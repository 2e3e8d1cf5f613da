"""Smoke version of the batch-tuning benchmark (the full one is `python -m benchmarks.bench_tuning`)."""
from __future__ import annotations

from benchmarks.bench_tuning import main
from tests.conftest import SHARED_DATA, shared_path


def test_bench_tuning_smoke(demo_model_dir, tmp_path):
    shared_path("multi30k", "test_2016_flickr.de")
    report = main(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--set", "multi30k", "--lines", "40",
                   "--sizes", "4,8", "--start", "4", "--rounds", "1", "--beam-size", "2", "--threads", "1",
                   "--out", str(tmp_path / "tuning")])
    rows = {r["system"]: r for r in report["rows"]}
    assert set(rows) == {"batch 4", "batch 8", "tuned"}
    assert len({r["bleu"] for r in rows.values()}) == 1  # batch size never changes the translations
    assert report["tuned_over_best"] > 0 and report["tuned_sizes"][0] >= 1
    assert (tmp_path / "tuning.md").exists()
