"""``ray job submit --working-dir . -- python -m jobs.translate ...`` against a real
``ray start --head`` cluster (its own ports and temp dir, stopped at the end)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_cli() -> list[str]:
    exe = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    if exe is None:
        pytest.skip("the ray CLI is not installed")
    return [exe]


def test_ray_job_submit_runs_the_translate_job(demo_model_dir, tmp_path):
    gcs, dash = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    head = subprocess.Popen([*ray_cli(), "start", "--head", "--block", f"--port={gcs}", "--num-cpus=2",
                             "--include-dashboard=true", f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1",
                             f"--temp-dir={tmp_path / 'ray'}"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out = tmp_path / "out.en.txt"
        cmd = [*ray_cli(), "job", "submit", f"--address=http://127.0.0.1:{dash}", "--working-dir", ".", "--",
               "python", "-m", "jobs.translate", "--model", "models/demo-de-en", "--input", "examples/sample.de.txt",
               "--output", str(out), "--beam-size", "2", "--threads", "1"]
        deadline, done = time.time() + 240, None
        while time.time() < deadline:  # the dashboard's job server needs a few seconds after start
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
            if "Failed to connect" not in done.stdout + done.stderr and "Connection refused" not in done.stderr:
                break
            time.sleep(2)
        assert done is not None and done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "succeeded" in done.stdout
        lines = out.read_text(encoding="utf-8").split("\n")[:-1]
        assert len(lines) == 12 and "dog" in lines[3].lower()
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
