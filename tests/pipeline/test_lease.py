"""Fencing: a job that lost its output's lease writes and deletes nothing (local disk and S3), and
two real jobs on one output, the first paused with SIGSTOP past its lease, never damage each other."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pyarrow as pa
import pytest

from raymt.pipeline.errors import StorageFull
from raymt.pipeline.outputs.lease import LEASE, LOCK, Lease, LeaseLost, OutputBusy
from raymt.pipeline.outputs.sink import OutputStore, output_table
from raymt.pipeline.storage import storage_options
from tests.conftest import ROOT

SAMPLE = ROOT / "examples" / "sample.de.txt"


def lease_on(url: str, **kw) -> Lease:
    fs, root = fsspec.core.url_to_fs(url, **storage_options(url))
    return Lease(fs, root, settle_s=0.05, url=url, **kw)


def part(n: int = 2) -> pa.Table:
    return output_table([str(i) for i in range(n)], list(range(n)), ["x"] * n, ["y"] * n, [0.0] * n, [[]] * n,
                        ["ok"] * n, [""] * n, "sig")


def check_fencing(url: str) -> None:
    fs, root = fsspec.core.url_to_fs(url, **storage_options(url))
    first = lease_on(url, ttl_s=30.0)
    first.acquire()
    assert first.generation == 1
    store = OutputStore(url, plan="aaaaaaaa", fence=first.fence)
    store.commit("u1", part(), None, {"unit": "u1"})
    first.release()  # released, never deleted: the next generation follows
    assert json.loads(fs.cat_file(f"{root}/{LEASE}"))["released"]
    with pytest.raises(LeaseLost, match="released"):  # a straggling writer of the ended job
        store.commit("u2", part(), None, {"unit": "u2"})
    second = lease_on(url, ttl_s=30.0)
    second.acquire()
    assert second.generation == 2
    with pytest.raises(LeaseLost, match=r"lost to .*generation 2.* this job \(generation 1\) wrote nothing after"):
        store.commit("u3", part(), None, {"unit": "u3"})
    with pytest.raises(LeaseLost):
        store.clear()  # nor any deletion
    assert store.committed() == {"u1"} and not fs.exists(f"{root}/part-u3-aaaaaaaa.parquet")
    theirs = OutputStore(url, plan="bbbbbbbb", fence=second.fence)
    theirs.commit("u1", part(3), None, {"unit": "u1"})
    assert theirs.committed() == {"u1"}
    with pytest.raises(OutputBusy, match="generation 2"):
        lease_on(url).acquire()
    second.release()


def test_a_job_that_lost_its_lease_writes_and_deletes_nothing_on_local_disk(tmp_path) -> None:
    check_fencing(str(tmp_path / "out"))


def test_a_job_that_lost_its_lease_writes_and_deletes_nothing_on_s3(s3) -> None:
    check_fencing("s3://corpus-bucket/out")


def test_a_lease_past_its_expiry_is_lost_even_if_nobody_took_it(tmp_path) -> None:
    url = str(tmp_path / "out")
    lease = lease_on(url, ttl_s=1.2)
    lease.acquire()
    lease._stop.set()  # the owner stops renewing (paused): its writers refuse once ttl/4 of life is left
    lease._thread.join()
    store = OutputStore(url, plan="aaaaaaaa", fence=lease.fence)
    store.commit("u1", part(), None, {"unit": "u1"})
    time.sleep(1.0)
    with pytest.raises(LeaseLost, match=r"expired at .* paused or cut off for longer than the lease"):
        store.commit("u2", part(), None, {"unit": "u2"})
    assert store.committed() == {"u1"}


def test_a_conditional_write_refuses_a_taker_that_lost_the_race_on_s3(s3) -> None:
    url = "s3://corpus-bucket/race"
    winner = lease_on(url, ttl_s=30.0)
    winner.acquire()
    loser = lease_on(url, ttl_s=30.0)
    loser.generation = 1
    with pytest.raises(OSError):  # If-Match an ETag that is no longer the lease's: 412, nothing written
        loser._write(etag='"0123456789abcdef0123456789abcdef"')
    winner.fence.check()
    winner.release()


def test_no_space_left_is_one_line_and_not_retried(tmp_path, monkeypatch) -> None:
    store = OutputStore(str(tmp_path / "out"), plan="aaaaaaaa")
    calls = []

    def full(*args, **kwargs):
        calls.append(1)
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(store.fs, "mv", full)
    with pytest.raises(StorageFull, match=r"No space left on device writing .*part-u1-aaaaaaaa.parquet \(errno 28\)"):
        store.commit("u1", part(), None, {"unit": "u1"})
    assert len(calls) == 1  # deterministic: no second attempt, nothing left behind
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


# -- two real jobs on one output -----------------------------------------------------------------------------
def translate(model: Path, src: Path, out: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "raymt.jobs.translate", "--in-process", "--model", str(model),
                             "--input", str(src), "--output", str(out), "--beam-size", "1", "--lease-ttl", "4",
                             "--progress-every", "1", *flags],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def pause_after_first_commit(job: subprocess.Popen, parts: Path) -> None:
    deadline = time.time() + 180
    while not (parts / "_manifest").exists() or not any((parts / "_manifest").iterdir()):
        assert job.poll() is None, job.communicate()[0]
        assert time.time() < deadline
        time.sleep(0.05)
    os.kill(job.pid, signal.SIGSTOP)
    lease = json.loads((parts / LEASE).read_text())
    time.sleep(max(lease["expires"] - time.time(), 0) + 0.5)  # paused past its lease's expiry


@pytest.fixture
def corpus(tmp_path) -> Path:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    src = tmp_path / "in.de.txt"
    src.write_text("\n".join(f"{lines[i % len(lines)]} ({i})" for i in range(400)) + "\n", encoding="utf-8")
    return src


@pytest.mark.parametrize("takeover", ["same plan", "restart with other units"])
def test_a_paused_job_that_lost_its_lease_stops_and_leaves_the_new_owners_output_alone(demo_model_dir, corpus,
                                                                                       tmp_path, takeover) -> None:
    out = tmp_path / "out.en.txt"
    parts = Path(f"{out}.parts")
    a = translate(demo_model_dir, corpus, out, "--unit-rows", "5")
    try:
        pause_after_first_commit(a, parts)
        flags = ["--unit-rows", "5"] if takeover == "same plan" else ["--unit-rows", "7", "--restart"]
        b = translate(demo_model_dir, corpus, out, *flags)
        b_log = b.communicate(timeout=300)[0]
        assert b.returncode == 0, b_log
        assert "generation 2" in b_log or json.loads((parts / LEASE).read_text())["generation"] == 2
        after_b = snapshot(parts)
        text_b = out.read_text(encoding="utf-8")
        assert len(text_b.splitlines()) == 400
    finally:
        os.kill(a.pid, signal.SIGCONT)
    a_log = a.communicate(timeout=120)[0]
    assert a.returncode != 0, a_log
    last = a_log.strip().splitlines()[-1]
    assert last.startswith("error: the output lease of") and "lost to" in last and "wrote nothing after" in last, a_log
    assert "Traceback" not in a_log
    after_a = snapshot(parts)
    lease = after_a.pop(LEASE)  # (A read it; B released it)
    lock = after_a.pop(LOCK)  # (A took the lock to check the lease: its holder record, written and emptied)
    assert after_a == {k: v for k, v in after_b.items() if k not in (LEASE, LOCK)} and lease == after_b[LEASE]
    assert lock[1] == after_b[LOCK][1]
    assert out.read_text(encoding="utf-8") == text_b


def test_a_paused_job_whose_lease_expired_stops_and_a_rerun_resumes(demo_model_dir, corpus, tmp_path) -> None:
    out = tmp_path / "out.en.txt"
    parts = Path(f"{out}.parts")
    a = translate(demo_model_dir, corpus, out, "--unit-rows", "5")
    pause_after_first_commit(a, parts)
    os.kill(a.pid, signal.SIGCONT)
    a_log = a.communicate(timeout=120)[0]
    assert a.returncode != 0 and "expired at" in a_log and "wrote nothing after" in a_log, a_log
    assert not out.exists()
    rerun = translate(demo_model_dir, corpus, out)
    log = rerun.communicate(timeout=300)[0]
    assert rerun.returncode == 0, log
    assert len(out.read_text(encoding="utf-8").splitlines()) == 400


def test_a_paused_job_that_lost_its_s3_lease_leaves_the_new_owners_output_alone(demo_model_dir, corpus, s3) -> None:
    out = "s3://corpus-bucket/out/"

    def listing() -> dict[str, str]:
        s3.invalidate_cache()
        return {p: s3.info(p)["ETag"] for p in s3.find("corpus-bucket/out") if not p.endswith(LEASE)}

    a = translate(demo_model_dir, corpus, out, "--unit-rows", "40")
    try:
        deadline = time.time() + 180
        while not s3.find("corpus-bucket/out/_manifest"):
            assert a.poll() is None and time.time() < deadline, a.communicate()[0]
            s3.invalidate_cache()
            time.sleep(0.1)
        os.kill(a.pid, signal.SIGSTOP)
        lease = json.loads(s3.cat_file(f"corpus-bucket/out/{LEASE}"))
        time.sleep(max(lease["expires"] - time.time(), 0) + 0.5)
        b = translate(demo_model_dir, corpus, out, "--unit-rows", "40")
        b_log = b.communicate(timeout=300)[0]
        assert b.returncode == 0, b_log
        after_b = listing()
    finally:
        os.kill(a.pid, signal.SIGCONT)
    a_log = a.communicate(timeout=120)[0]
    assert a.returncode != 0 and "lost to" in a_log and "wrote nothing after" in a_log, a_log
    assert listing() == after_b
    assert json.loads(s3.cat_file(f"corpus-bucket/out/{LEASE}"))["generation"] == 2
