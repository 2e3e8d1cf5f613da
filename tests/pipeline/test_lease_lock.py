"""Every wait for the output's lock is bounded: a process paused (SIGSTOP) while it holds
``_LEASE.lock`` never hangs another job. Real processes, real ``flock``, real SIGSTOP/SIGCONT."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import fsspec
import pytest

from raymt.pipeline.outputs import disklock
from raymt.pipeline.outputs.lease import LEASE, LOCK, LOCK_WAIT_S, Lease, LeaseLost, OutputBusy, OutputLocked
from raymt.pipeline.outputs.sink import OutputStore
from tests.conftest import ROOT
from tests.pipeline.test_lease import part

# Takes the lease (ttl argv[2]) of the output argv[1], then a guarded write: paused (SIGSTOP) inside
# it with the lock held, just after the lease check. Resumed, it prints what became of its write.
PAUSED_IN_GUARD = r"""
import os, signal, sys
import fsspec
from raymt.pipeline.outputs import lease as L

root, ttl = sys.argv[1], float(sys.argv[2])
fs = fsspec.filesystem("file")
lease = L.Lease(fs, root, ttl_s=ttl)
lease.acquire()
check = L.Fence._check

def check_then_pause(self, fs, root):
    check(self, fs, root)
    os.kill(os.getpid(), signal.SIGSTOP)

L.Fence._check = check_then_pause
try:
    with lease.fence.guard(fs):
        with open(os.path.join(root, "late.txt"), "w") as f:
            f.write("written after the pause")
except L.LeaseLost as e:
    print("refused:", e, flush=True)
    sys.exit(3)
print("wrote", flush=True)
"""

# Takes the output's lock (and, when argv[2] is a ttl, the lease first), then pauses itself holding it.
PAUSED_HOLDER = r"""
import os, signal, sys
import fsspec
from raymt.pipeline.outputs import disklock
from raymt.pipeline.outputs.lease import Lease

root, ttl = sys.argv[1], float(sys.argv[2])
if ttl:
    Lease(fsspec.filesystem("file"), root, ttl_s=ttl).acquire()
held = disklock.lock(root, 5.0)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def start(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_stopped(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Until ``proc`` is stopped (state T in /proc/<pid>/stat)."""
    deadline = time.time() + timeout_s
    while True:
        assert proc.poll() is None, proc.communicate()[0]
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        assert time.time() < deadline, "the helper never paused"
        time.sleep(0.02)


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.communicate()


def lease_on(root: Path, ttl_s: float) -> Lease:
    return Lease(fsspec.filesystem("file"), str(root), ttl_s=ttl_s)


def until_expired(root: Path) -> None:
    time.sleep(max(json.loads((root / LEASE).read_text())["expires"] - time.time(), 0) + 0.2)


def test_a_paused_lock_holder_is_refused_named_then_taken_over_and_its_write_refused(tmp_path, caplog) -> None:
    out = tmp_path / "out"
    out.mkdir()
    helper = start(PAUSED_IN_GUARD, str(out), "6")
    try:
        wait_stopped(helper)
        assert disklock.holder_of(str(out / LOCK)).pid == helper.pid
        # (a) its lease is live: refused at once, naming it, not hung in flock
        began = time.monotonic()
        with pytest.raises(OutputBusy) as busy:
            lease_on(out, 30).acquire()
        assert time.monotonic() - began < LOCK_WAIT_S + 3
        message = str(busy.value)
        assert f":{helper.pid}" in message and "generation 1" in message and "lease expires in" in message, message
        assert f"its lock {LOCK} has been held by" in message and "holding it for" in message, message
        # (b) past its lease: the stuck lock is replaced, the lease taken at the next generation
        until_expired(out)
        taker = lease_on(out, 30)
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="raymt.pipeline.outputs.lease"):
            taker.acquire()
        assert time.monotonic() - began < LOCK_WAIT_S + 3
        assert taker.generation == 2
        assert any(f":{helper.pid}" in r.getMessage() and "replaced the lock" in r.getMessage()
                   for r in caplog.records), caplog.text
        store = OutputStore(str(out), plan="bbbbbbbb", fence=taker.fence)
        store.commit("u1", part(), None, {"unit": "u1"})  # the taker writes under the fresh lock
        # (c) resumed, the paused writer finds its lock replaced before it writes
        os.kill(helper.pid, signal.SIGCONT)
        log = helper.communicate(timeout=60)[0]
        assert helper.returncode == 3, log
        assert "paused past its lease while it held the output's lock" in log, log
        assert not (out / "late.txt").exists()
        assert json.loads((out / LEASE).read_text())["token"] == taker.token
        assert store.committed() == {"u1"}
        taker.release()
    finally:
        end(helper)


def test_a_write_and_a_renewal_blocked_by_a_paused_holder_give_up_in_bounded_time(tmp_path) -> None:
    out = tmp_path / "out"
    lease = lease_on(out, 4.0)
    lease.acquire()
    helper = start(PAUSED_HOLDER, str(out), "0")  # the lock only: a process paused inside it
    try:
        wait_stopped(helper)
        store = OutputStore(str(out), plan="aaaaaaaa", fence=lease.fence)
        began = time.monotonic()
        with pytest.raises(OutputLocked, match=rf":{helper.pid} \(holding it for .*still its own"):
            store.commit("u1", part(), None, {"unit": "u1"})  # the lease is this job's: the holder is named
        assert 0.9 < time.monotonic() - began < 3  # waited ttl/4, no more
        lease._thread.join(timeout=8)  # renewal never got the lock: it gives up at expiry, not hangs
        assert not lease._thread.is_alive()
        assert lease.lost and "expired at" in lease.lost
        with pytest.raises(LeaseLost, match="expired at"):
            store.commit("u1", part(), None, {"unit": "u1"})
        assert not list(out.glob("part-*"))
    finally:
        end(helper)


def test_two_takers_replacing_one_stuck_lock_never_both_hold_it(tmp_path) -> None:
    root = str(tmp_path)
    for _ in range(20):
        stuck = disklock.lock(root, 0.0)  # held on its own descriptor: a holder that never lets go
        try:
            with pytest.raises(disklock.LockBusy) as busy:
                disklock.lock(root, 0.05)
            gate, got = threading.Barrier(2), []

            def breaker() -> None:
                gate.wait()
                got.append(disklock.break_lock(root, busy.value))
            threads = [threading.Thread(target=breaker) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            held = [h for h in got if h is not None]
            assert len([h for h in held if h.intact()]) == 1, got
            assert not stuck.intact()
            for h in held:
                h.release()
        finally:
            stuck.release()
    assert not list(tmp_path.glob(f"{LOCK}.*"))  # no fresh file left behind


def test_a_translation_takes_over_an_output_whose_lock_a_paused_job_holds(tmp_path) -> None:
    out = tmp_path / "out"
    helper = start(PAUSED_HOLDER, str(out), "1")  # its lease expires in a second; paused holding the lock
    try:
        wait_stopped(helper)
        until_expired(out)
        try:
            job = subprocess.run([sys.executable, "-m", "raymt.jobs.translate", "--model", "models/demo-de-en",
                                  "--input", "examples/sample.de.txt", "--output", f"{out}/", "--beam-size", "1"],
                                 cwd=ROOT, capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"the job hung on the paused holder's lock: {e.stdout}{e.stderr}")
        log = job.stdout + job.stderr
        assert job.returncode == 0, log
        assert f":{helper.pid}" in log and "replaced the lock" in log, log
        assert (out / "_SUCCESS").exists()
        assert json.loads((out / LEASE).read_text())["generation"] == 2
    finally:
        end(helper)
