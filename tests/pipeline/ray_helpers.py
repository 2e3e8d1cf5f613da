"""Shared pieces of the Ray pipeline tests: a real local cluster, corpora, exactly-once checks."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from raymt.pipeline.outputs.sink import OutputStore
from tests.conftest import ROOT

SAMPLE = [line for line in (ROOT / "examples" / "sample.de.txt").read_text(encoding="utf-8").split("\n") if line]


def start_ray(**kwargs) -> str:
    """A real local Ray cluster for this test process; returns its address for driver subprocesses."""
    import ray
    from ray.data import DataContext
    ray.init(include_dashboard=False, log_to_driver=False, **kwargs)
    DataContext.get_current().enable_progress_bars = False
    return ray.get_runtime_context().gcs_address


def clean_corpus(n: int) -> list[str]:
    """n distinct well-formed sentences built from the shipped sample."""
    return [SAMPLE[i % len(SAMPLE)] if i < len(SAMPLE) else f"{SAMPLE[i % len(SAMPLE)]} ({i})" for i in range(n)]


def write_corpus(path: Path, texts: list, ids: list | None = None, **extra) -> Path:
    ids = ids if ids is not None else [f"r{i:04d}" for i in range(len(texts))]
    pq.write_table(pa.table({"id": ids, "text": pa.array(texts, pa.string()), **extra}), path, row_group_size=16)
    return path


def assert_exactly_once(output: str, ids: list) -> pa.Table:
    table = OutputStore(output).read()
    got = table.column("id").to_pylist()
    assert sorted(got) == sorted(ids), "every input id exactly once"
    assert len(got) == len(set(got))
    assert table.column("row").to_pylist() == list(range(len(ids)))
    return table


def spawn_driver(address: str, args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "RAY_ADDRESS": address, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "raymt.jobs.translate", *args], cwd=ROOT, env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)


def wait_for_commits(output: str, count: int, proc: subprocess.Popen, timeout: float = 240) -> set[str]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = OutputStore(output).committed() if Path(output).exists() else set()
        if len(done) >= count:
            return done
        assert proc.poll() is None, "the driver ended before the units were committed"
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} units committed in {timeout}s")
