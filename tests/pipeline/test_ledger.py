"""The output's plan record and lease: what a rerun may resume, and one job per output (local and S3)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import fsspec
import pytest

from raymt.pipeline.outputs.ledger import LEASE, Lease, OutputBusy, PlanRecord
from raymt.pipeline.storage import file_version
from raymt.pipeline.storage import storage_options


def record(**changes) -> PlanRecord:
    base = dict(inputs=({"path": "/in/a.parquet", "size": 10, "version": "1"},), columns={"text": "text"},
                unit_rows=500, units=6, rows=3000, signature="model:m|beam:1",
                model=({"path": "/m/model.safetensors", "size": 5, "version": "7"},))
    return PlanRecord(**{**base, **changes})


def test_plan_record_round_trips_and_names_each_difference() -> None:
    r = record()
    assert PlanRecord.from_json(r.to_json()) == r and PlanRecord.from_json(r.to_json()).digest == r.digest
    changed = record(unit_rows=2500, units=2, signature="model:n|beam:5",
                     inputs=({"path": "/in/a.parquet", "size": 11, "version": "2"},),
                     model=({"path": "/m/model.safetensors", "size": 5, "version": "8"},))
    lines = changed.differences(r)
    assert lines[0] == "--unit-rows 500 then, 2500 now"
    assert "search signature 'model:m|beam:1' then, 'model:n|beam:5' now" in lines
    assert any(x.startswith("input /in/a.parquet changed (size 10 -> 11") for x in lines)
    assert any(x.startswith("model file /m/model.safetensors changed") for x in lines)
    assert record().differences(r) == []


def test_file_version_changes_when_a_file_is_rewritten(tmp_path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("one\n")
    before = file_version(str(path))
    time.sleep(0.01)
    path.write_text("two\n")
    assert file_version(str(path)) != before


def lease_on(url: str, **kw) -> Lease:
    fs, root = fsspec.core.url_to_fs(url, **storage_options(url))
    return Lease(fs, root, settle_s=0.05, **kw)


def check_lease_cycle(url: str) -> None:
    first = lease_on(url, ttl_s=2.0)
    first.acquire()
    with pytest.raises(OutputBusy, match=rf"held by {socket.gethostname()}:\d+"):
        lease_on(url).acquire()  # a live owner (this process): refused
    time.sleep(1.2)  # the owner renews every ttl/4: still held after its first expiry time
    with pytest.raises(OutputBusy):
        lease_on(url).acquire()
    first.release()
    second = lease_on(url, ttl_s=2.0)
    second.acquire()  # released: free
    thief = lease_on(url)
    thief._write()  # another job overwrote it (a race both won): the owner finds out at its next renewal
    deadline = time.time() + 5
    while second.lost is None and time.time() < deadline:
        time.sleep(0.1)
    assert second.lost and "lost to" in second.lost
    second.release()
    thief.release()


def test_lease_refuses_a_second_job_and_its_owner_notices_a_lost_lease_on_local_disk(tmp_path) -> None:
    check_lease_cycle(str(tmp_path / "out"))


def test_lease_on_s3(s3) -> None:
    check_lease_cycle("s3://corpus-bucket/out")


def test_a_killed_owners_lease_is_stale_at_once_on_its_host_and_after_expiry_elsewhere(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    (out / LEASE).write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "job": "", "token": "x",
                                         "expires": time.time() + 3600}))
    lease = lease_on(str(out))
    lease.acquire()  # its owner is gone: taken over without waiting for the expiry
    lease.release()
    (out / LEASE).write_text(json.dumps({"host": "another-node", "pid": 1, "job": "raysubmit_1", "token": "x",
                                         "expires": time.time() + 3600}))
    with pytest.raises(OutputBusy, match=r"another-node:1 \(Ray job raysubmit_1\)"):
        lease_on(str(out)).acquire()  # another host: only its expiry frees it
    (out / LEASE).write_text(json.dumps({"host": "another-node", "pid": 1, "token": "x", "expires": time.time() - 1}))
    last = lease_on(str(out))
    last.acquire()
    last.release()
