"""Smoke version of the batching benchmark (the full one is `python -m benchmarks.bench_batching`)."""
from __future__ import annotations

import json

from benchmarks.bench_batching import main
from tests.conftest import SHARED_DATA, shared_path


def test_bench_batching_smoke(demo_model_dir, tmp_path):
    shared_path("wmt22", "generaltest2022.de-en.src.de")
    out = tmp_path / "batching"
    main(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--lines", "16", "--beams", "3,20",
          "--wide-beam-lines", "6", "--batch-sentences", "6", "--repeats", "1", "--max-length", "20", "--threads", "1", "--out", str(out)])
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["targets"]["sorted/beam20"]["lines"] == 6 and report["targets"]["sorted/beam3"]["lines"] == 16
    for order, beam in [(o, b) for o in ("sorted", "shuffled") for b in (3, 20)]:
        rows = {r["system"]: r for r in report["tables"][f"{order}/beam{beam}"]}
        assert set(rows) == {"GREEDY", "FIXED", "VAR-BATCH", "VAR-STREAM", "VAR-STR-FIFO"}
        assert rows["VAR-STREAM"]["bleu"] == rows["VAR-BATCH"]["bleu"] == rows["VAR-STR-FIFO"]["bleu"]
        assert rows["FIXED"]["wall_ratio"] == 1.0
        assert rows["VAR-STREAM"]["expansions"] == rows["VAR-BATCH"]["expansions"]  # same search, other batching
    topup = {r["system"]: r for r in report["tables"]["topup"]}
    assert len({r["bleu"] for r in topup.values()}) == 1  # batching never changes exact-beam output
    assert sum(topup["top-up"]["batch_size_histogram"].values()) == topup["top-up"]["timesteps"]
