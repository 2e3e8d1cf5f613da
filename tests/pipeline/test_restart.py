"""A job deletes only what its output's records name (``--restart``, pruning), and a job refused
before any work leaves no file of its own (lease files included) in the output."""
from __future__ import annotations

import json
import os
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymt.pipeline.orchestration import run as run_module
from raymt.pipeline.outputs.lease import LEASE, LOCK, Lease
from raymt.pipeline.outputs.ledger import PlanRecord
from raymt.pipeline.outputs.sink import OutputStore
from tests.pipeline.test_sink import part

HEX = "0123456789abcdef" * 2  # a temporary name's random part


def parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def user_files(out: Path) -> dict[str, bytes]:
    """Files of the user's own, some named like raymt's parts, written into ``out``; their bytes."""
    files = {"part-00000-0000000000.parquet": parquet(pa.table({"mine": [1, 2]})), "notes.txt": b"my notes\n",
             "notes.tmp": b"a draft\n", "mine/part-00000-0000000000.parquet": b"kept",
             "_stats/mine.csv": b"a,b\n", "distilled/part-mine.parquet": b"kept"}
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return files


def files_in(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_clear_removes_only_the_files_the_output_s_records_name(tmp_path) -> None:
    out = tmp_path / "out"
    record = PlanRecord(inputs=({"path": "in.txt", "size": 9, "version": "1"},), columns={}, unit_rows=2, units=3,
                        rows=6, signature="sig", model=())
    store = OutputStore(str(out), plan=record.digest)
    store.write_plan(record)
    store.commit("00000-0000000000", part([0, 1]), pa.table({"sentences": [2]}), {})
    store.commit("00000-0000000002", part([2, 3]), pa.table({"sentences": [2]}), {})
    store.write_bytes(f"part-00000-0000000004{store.tag}.parquet", b"a part whose marker never came")
    store.write_bytes(f"_stats/00000-0000000004{store.tag}.parquet", b"its stats")
    OutputStore(str(out), plan="f" * 16).commit("00000-0000000000", part([0]), None, {})  # another plan's, marked
    store.write_bytes("distilled/part-00000-0000000000.parquet", b"distilled")
    store.write_bytes("distilled/_SUMMARY.json", b"{}")
    store.write_bytes("_SUCCESS", b"{}")
    for name in (f"part-00000-0000000002{store.tag}.parquet.{HEX}.tmp", f"_PLAN.json.{HEX}.tmp",
                 f"_manifest/00000-0000000004{store.tag}.json.{HEX}.tmp", f"_WRITABLE-{HEX}.tmp"):
        (out / name).write_bytes(b"an interrupted write")
    (out / LEASE).write_text("{}")
    (out / LOCK).write_bytes(b"")
    mine = user_files(out)

    left = store.clear()
    assert files_in(out) == {**mine, LEASE: b"{}", LOCK: b""}
    assert not (out / "_manifest").exists()
    assert sorted(p.rsplit("/", 1)[-1] for p in left) == sorted(["part-00000-0000000000.parquet", "notes.txt",
                                                                  "notes.tmp", "mine", "mine.csv", "part-mine.parquet"])


def test_prune_removes_only_other_plans_files_that_a_marker_names(tmp_path) -> None:
    out = tmp_path / "out"
    ours = OutputStore(str(out), plan="a" * 16)
    ours.commit("00000-0000000000", part([0]), pa.table({"sentences": [1]}), {})
    OutputStore(str(out), plan="b" * 16).commit("00000-0000000000", part([0]), pa.table({"sentences": [1]}), {})
    ours.write_bytes("part-00000-0000000000-cccccccc.parquet", b"a late part of a third plan, never marked")
    mine = user_files(out)
    assert ours.prune() == 3  # the other plan's marker, part and stats
    assert set(files_in(out)) == {*mine, "part-00000-0000000000-aaaaaaaa.parquet", "_manifest/00000-0000000000-aaaaaaaa.json",
                                  "_stats/00000-0000000000-aaaaaaaa.parquet", "part-00000-0000000000-cccccccc.parquet"}
    assert all(files_in(out)[name] == data for name, data in mine.items())


def test_a_lease_discarded_by_a_refused_job_leaves_the_output_as_it_found_it(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fs = fsspec.filesystem("file")
    lease = Lease(fs, str(out), ttl_s=30)
    lease.acquire()
    lease.release(discard=True)  # it created them: gone
    assert os.listdir(out) == []
    Lease(fs, str(out), ttl_s=30).acquire()  # (never released: its process is this one, alive; expired below)
    (out / LEASE).write_text(json.dumps({**json.loads((out / LEASE).read_text()), "expires": 0}))
    second = Lease(fs, str(out), ttl_s=30)
    second.acquire()
    second.release(discard=True)  # an output that had a lease: released, never removed (generations go on)
    assert json.loads((out / LEASE).read_text())["released"] and second.generation == 2
    assert (out / LOCK).exists()


# -- the command line ---------------------------------------------------------------------------------------
@pytest.fixture
def job(demo_model_dir, tmp_path):
    from raymt.jobs.translate import main
    src = tmp_path / "in.txt"
    src.write_text("Ein Hund.\nZwei Männer.\nEine Frau liest.\nKinder spielen.\n", encoding="utf-8")

    def translate(out: Path, *flags: str) -> None:
        main(["--in-process", "--threads", "1", "--beam-size", "1", "--model", str(demo_model_dir), "--input",
              str(src), "--output", f"{out}/", *flags])
    return translate


def test_restart_keeps_a_user_s_files_in_the_output(job, tmp_path, caplog) -> None:
    out = tmp_path / "out"
    job(out, "--unit-rows", "2")
    before = files_in(out)
    mine = user_files(out)
    job(out, "--unit-rows", "1", "--restart")  # another plan: the old one's files go, the user's stay
    after = files_in(out)
    assert all(after[name] == data for name, data in mine.items())
    assert not [name for name in before if name.startswith(("part-", "_manifest/", "_stats/")) and name in after]
    store = OutputStore(str(out))
    assert len(store.committed()) == 4 and store.read().column("row").to_pylist() == [0, 1, 2, 3]
    assert "kept 6 file(s)" in caplog.text and "part-00000-0000000000.parquet" in caplog.text


def test_an_output_of_foreign_files_is_refused_leaving_it_as_it_was_and_restart_keeps_them(job, tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    mine = user_files(out)
    with pytest.raises(SystemExit, match="holds output without a plan record"):
        job(out)
    assert files_in(out) == mine  # no _LEASE.json, no _LEASE.lock, nothing else
    job(out, "--restart")
    after = files_in(out)
    assert all(after[name] == data for name, data in mine.items()) and "_SUCCESS" in after


def test_a_refusal_under_the_lease_removes_the_lease_files_the_job_created(job, tmp_path, monkeypatch) -> None:
    """A plan recorded by another job between the check and the lease: refused under the lease, and
    the lease files this job created on an output that had none are removed."""
    out = tmp_path / "out"
    out.mkdir()
    mine = user_files(out)
    real, calls = run_module.plan_refusal, []

    def not_yet_the_first_time(*args):
        calls.append(1)
        return None if len(calls) == 1 else real(*args)
    monkeypatch.setattr(run_module, "plan_refusal", not_yet_the_first_time)
    with pytest.raises(SystemExit, match="holds output without a plan record"):
        job(out)
    assert len(calls) == 2 and files_in(out) == mine
