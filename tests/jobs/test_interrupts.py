"""Ctrl-C as a terminal sends it (SIGINT to the whole foreground process group, twice): the job
ends with its one-line message, no traceback, and leaves none of the local Ray cluster it was
starting running. Each case runs the real command in its own session."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT


def session_processes(sid: int) -> set[int]:
    """Pids of the processes in session ``sid`` (the job and every process it started)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ...
            if fields[0] != "Z" and int(fields[3]) == sid:
                found.add(int(entry.name))
    return found


def ray_started(sid: int) -> bool:
    for pid in session_processes(sid):
        try:
            if b"gcs_server" in (Path("/proc") / str(pid) / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


@pytest.mark.parametrize("when", ["while-ray-starts", "while-planning"])
def test_ctrl_c_twice_is_one_line_and_leaves_no_ray_process(demo_model_dir, tmp_path, when):
    src = tmp_path / "in.txt"
    src.write_text("".join(f"Ein Hund läuft über die Wiese Nummer {i:05d}.\n" for i in range(300)))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_JOB_ID")}
    proc = subprocess.Popen([sys.executable, "-m", "raymt.jobs.translate", "--model", str(demo_model_dir),
                             "--input", str(src), "--output", str(tmp_path / "out"), "--local-rows", "0",
                             "--threads", "1", "--beam-size", "1"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        if when == "while-ray-starts":
            while not ray_started(proc.pid) and time.time() < deadline and proc.poll() is None:
                time.sleep(0.02)
        else:
            while not (tmp_path / "out" / "_PLAN.json").exists() and time.time() < deadline and proc.poll() is None:
                time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.rstrip().splitlines()[-1] == "interrupted: every committed unit is kept; rerun the same command to resume"
    deadline = time.time() + 15
    while session_processes(proc.pid) and time.time() < deadline:
        time.sleep(0.2)
    left = session_processes(proc.pid)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"left running after the job ended: {left}"
