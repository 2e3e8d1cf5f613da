"""The GPU runbook (``benchmarks/gpu_checks.sh``) run here, tiny and on the CPU (``SMOKE=1 DEVICE=cpu``):
every stage's commands and arguments, checked before they run on a GPU. Slow
(about two minutes: it builds ``data-gpu/`` with eflomal and runs the benchmark three times), so
CI skips it; run it with ``python -m pytest -m slow tests/benchmarks/test_gpu_checks.py`` before a GPU run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import shared_path

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_every_stage_of_the_gpu_runbook_runs_here_in_smoke_mode(tmp_path):
    shared_path("multi30k", "train.de")  # (skips with the reason when ../shared is absent)
    env = dict(os.environ, SMOKE="1", DEVICE="cpu", OUT=str(tmp_path),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if not (ROOT / "data-gpu" / "lex.s2t").exists():
        subprocess.run(["bash", "benchmarks/gpu_prepare.sh"], cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    logs = [subprocess.run(["bash", "benchmarks/gpu_checks.sh", stage], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=900).stdout for stage in "123"]
    assert "defaults = dynamic output" in logs[0]
    for log, reports in zip(logs, (["m30k"], ["m30k-seeds"], ["m30k-bf16", "wmt22"])):
        for report in reports:
            assert f"bench_gpu {report}: exit 0" in log, log[-3000:]
            tables = json.loads((tmp_path / f"gpu-cpu-{report}.json").read_text())["tables"]
            assert tables, report
    seeds = json.loads((tmp_path / "gpu-cpu-m30k-seeds.json").read_text())["tables"]
    assert {"multi30k/batching/beam2", "multi30k/topup/beam2", "multi30k/search/beam3"} <= set(seeds)
    assert seeds["multi30k/search/beam3"]["shortlist"] == "data-gpu/lex.s2t"
