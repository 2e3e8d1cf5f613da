"""``ray job submit --working-dir . -- python -m raymt.jobs.translate ...`` against a real
``ray start --head`` cluster (its own ports, temp dir and home, stopped at the end by its own process
group), exactly as the README writes it: ``RAY_AUTH_MODE=token`` exported, ``ray get-auth-token
--generate``, ``ray start --head``, ``ray job submit`` (``ray start`` in this Ray turns token
authentication on by itself whenever a token is saved in ``~/.ray``, and the CLI then needs the
variable), from a home with no token yet; then ``ray job logs``."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

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


def wait_for_job_server(url: str, head: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert head.poll() is None, "ray start --head exited"
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except urllib.error.HTTPError:
            return  # it answers (401 when Ray's token authentication is on: the CLI sends the token)
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"the job server at {url} did not come up in {timeout}s")


def test_ray_job_submit_runs_the_translate_job(demo_model_dir, tmp_path):
    gcs, dash = free_port(), free_port()
    short_tmp = tempfile.mkdtemp(prefix="rj", dir="/tmp")  # Ray's socket paths must stay < 108 chars
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0", HOME=str(tmp_path / "home"), RAY_AUTH_MODE="token")  # as the README
    subprocess.run([*ray_cli(), "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=60)
    head = subprocess.Popen([*ray_cli(), "start", "--head", "--block", f"--port={gcs}", "--num-cpus=2",
                             "--include-dashboard=true", f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1",
                             f"--temp-dir={short_tmp}"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out = tmp_path / "out.en.txt"
        submit_env = {**env, "RAY_ADDRESS": f"http://127.0.0.1:{dash}"}
        job_id = f"raymt-test-{os.getpid()}"
        cmd = [*ray_cli(), "job", "submit", "--submission-id", job_id, "--working-dir", ".", "--",
               "python", "-m", "raymt.jobs.translate", "--model", "models/demo-de-en", "--input", "examples/sample.de.txt",
               "--output", str(out), "--beam-size", "2", "--threads", "1"]
        wait_for_job_server(f"http://127.0.0.1:{dash}/api/version", head)
        done = subprocess.run(cmd, cwd=ROOT, env=submit_env, capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "succeeded" in done.stdout
        lines = out.read_text(encoding="utf-8").split("\n")[:-1]
        assert len(lines) == 12 and "dog" in lines[3].lower()
        logs = subprocess.run([*ray_cli(), "job", "logs", job_id], cwd=ROOT, env=submit_env, capture_output=True,
                              text=True, timeout=120)
        assert logs.returncode == 0 and "translated 12 rows" in logs.stdout, logs.stdout[-2000:] + logs.stderr[-2000:]
        assert ", ray (decoding" in logs.stdout  # submitted to a cluster: decoded there, not in-process
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGTERM)
            head.wait(timeout=60)
        shutil.rmtree(short_tmp, ignore_errors=True)
