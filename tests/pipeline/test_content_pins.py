"""Content, not metadata, pins what a plan read: a unit's bytes (text; Parquet: its row groups' column
chunks and the file's footer) and the model files' SHA-256. Rewrites that keep size and mtime (``cp -p``, ``rsync -t``,
``touch -r``) are caught: while a job is held (a real job, held at a gate after its first unit) and
between a stopped job and its resume."""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymt.pipeline import digests
from raymt.pipeline.outputs.ledger import model_files
from raymt.pipeline.inputs.parquet_pins import PinnedFile, plan_layout, read_pinned
from raymt.pipeline.inputs.passthrough import read_passthrough
from raymt.pipeline.storage import ModelChanged, model_reader
from raymt.pipeline.orchestration.units import Columns, InputChanged, plan_units, read_unit
from tests.conftest import ROOT
from tests.hold_gates import AFTER_COMMIT, gate_env


def rewrite_keeping_time(path: Path, old: bytes, new: bytes) -> None:
    """``sed s/old/new/`` with the same byte count, then the mtime put back (``touch -r``)."""
    assert len(old) == len(new)
    st = path.stat()
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


@pytest.mark.parametrize("name", ["in.txt", "in.txt.gz", "in.jsonl"])
def test_a_same_size_rewrite_with_its_time_restored_stops_the_unit_that_reads_it(tmp_path, name):
    lines = [f'{{"text": "Ein Mann {i}."}}' if name.endswith("jsonl") else f"Ein Mann {i}." for i in range(30)]
    data = ("\n".join(lines) + "\n").encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(data, compresslevel=0, mtime=0) if name.endswith(".gz") else data)
    plan = plan_units(str(path), Columns(), unit_rows=10)
    assert all(u.checksum for u in plan.units) and len({u.checksum for u in plan.units}) == 3
    assert read_unit(plan.units[0], Columns()).texts[0] in (b"Ein Mann 0.", "Ein Mann 0.")
    if name.endswith(".gz"):
        rewritten = gzip.compress(data.replace(b"Mann 25", b"Frau 25"), compresslevel=0, mtime=0)
        assert len(rewritten) == path.stat().st_size  # (stored, not deflated: the same size)
        st = path.stat()
        path.write_bytes(rewritten)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        rewrite_keeping_time(path, b"Mann 25", b"Frau 25")
    read_unit(plan.units[0], Columns())  # its own bytes are unchanged: it reads on
    with pytest.raises(InputChanged, match=rf"input {path} changed since the job planned it \(unit "
                                           r"00000-0000000020: the content of its rows 20\.\.30 differs"):
        read_unit(plan.units[2], Columns())
    assert plan_units(str(path), Columns(), unit_rows=10).versions[0]["content"] != plan.versions[0]["content"]


def test_a_parquet_file_rewritten_to_the_same_size_is_caught(tmp_path):
    path = tmp_path / "in.parquet"
    write = lambda word: pq.write_table(pa.table({"text": [f"Ein {word} {i}." for i in range(20)]}), path,  # noqa: E731
                                        compression="none", row_group_size=10)
    write("Mann")
    plan = plan_units(str(path), Columns(), unit_rows=10)
    st = path.stat()
    write("Frau")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size
    with pytest.raises(InputChanged, match=r"the content of its rows 10\.\.20 \(the column chunks of its row groups, "
                                           r"or the footer\) differs"):
        read_unit(plan.units[1], Columns())


def write_plain_parquet(path: Path, rows: int = 30, word: str = "Mann") -> None:
    """Row groups of 10 rows, stored as written (no compression, dictionary or statistics), so a
    value's letters can be changed in the data pages and the footer stays byte for byte the same."""
    table = pa.table({"id": [f"r{i:02d}" for i in range(rows)], "text": [f"Ein {word} geht {i}." for i in range(rows)],
                      "note": [f"n{i:02d}" for i in range(rows)]})
    pq.write_table(table, path, row_group_size=10, compression="none", use_dictionary=False, write_statistics=False)


def footer_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return data[-8 - int.from_bytes(data[-8:-4], "little"):]


@pytest.mark.parametrize("old, new", [(b"r15", b"x15"), (b"Mann geht 15.", b"Frau geht 15."), (b"n15", b"x15")],
                         ids=["id", "text", "passthrough"])
def test_a_parquet_value_changed_in_place_with_the_footer_unchanged_stops_the_unit_that_reads_it(tmp_path, old, new):
    path = tmp_path / "in.parquet"
    write_plain_parquet(path)
    plan = plan_units(str(path), Columns(), unit_rows=10)
    footer = footer_bytes(path)
    rewrite_keeping_time(path, old, new)
    assert footer_bytes(path) == footer  # only a data page changed
    assert read_unit(plan.units[0], Columns()).texts[0] == "Ein Mann geht 0."  # its row groups are unchanged
    read_passthrough(plan.units[2], Columns())
    refused = r"unit 00000-0000000010: the content of its rows 10\.\.20 \(the column chunks of its row groups"
    with pytest.raises(InputChanged, match=refused):
        read_unit(plan.units[1], Columns())
    with pytest.raises(InputChanged, match=refused):
        read_passthrough(plan.units[1], Columns())
    assert plan_units(str(path), Columns(), unit_rows=10).versions[0]["content"] != plan.versions[0]["content"]


@pytest.mark.parametrize("options", [{}, {"compression": "none", "use_dictionary": False, "write_statistics": False}],
                         ids=["dictionary-snappy", "plain"])
def test_a_parquet_checksum_is_the_footer_and_the_column_chunks_of_the_row_groups_a_unit_reads(tmp_path, options):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [f"Satz {i}." for i in range(25)], "n": list(range(25))}), path,
                   row_group_size=10, **options)
    data, meta = path.read_bytes(), pq.ParquetFile(path).metadata
    with path.open("rb") as f:
        _, layout = plan_layout(f)
    assert layout.group_rows == (10, 10, 5)
    for g in range(3):  # every column chunk's bytes, from the dictionary page where there is one
        chunks = [meta.row_group(g).column(c) for c in range(2)]
        starts = [c.dictionary_page_offset or c.data_page_offset for c in chunks]
        digest = hashlib.sha256(b"".join(data[a:a + c.total_compressed_size] for a, c in zip(starts, chunks)))
        assert layout.group_sums[g] == digest.hexdigest()[:32]
    assert layout.footer == hashlib.sha256(footer_bytes(path)).hexdigest()[:32]
    for start, stop, groups in [(0, 10, [0]), (5, 12, [0, 1]), (20, 25, [2]), (0, 25, [0, 1, 2])]:
        with path.open("rb") as f:
            pinned = read_pinned(f, start, stop)
        assert pinned.groups == groups and pinned.checksum == layout.checksum(start, stop)
        assert pinned.checksum == hashlib.sha256((layout.footer + "".join(layout.group_sums[g] for g in groups))
                                                 .encode()).hexdigest()[:32]
    assert layout.checksum(0, 10) != layout.checksum(10, 20) and layout.content == layout.checksum(0, 25)


def test_a_pinned_file_reads_only_the_bytes_it_holds():
    pinned = PinnedFile(100, [(10, memoryview(b"abcde")), (15, memoryview(b"fg")), (90, memoryview(b"0123456789"))])
    pinned.seek(11)
    assert pinned.read(6) == b"bcdefg" and pinned.seek(-4, 2) == 96 and pinned.read(10) == b"6789"
    pinned.seek(16)
    with pytest.raises(OSError, match=r"bytes 17\.\.19 were not read with the unit"):
        pinned.read(3)


def test_a_model_file_digest_is_cached_but_never_across_a_rewrite(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYMT_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "m.bin"
    model.write_bytes(b"a" * 1000)
    old = os.stat(model)
    os.utime(model, (old.st_atime - 10, old.st_mtime - 10))
    monkeypatch.setattr(digests, "RACY_S", 0.0)
    first = digests.file_digest(str(model))
    assert first == digests.bytes_digest(b"a" * 1000)
    [entry] = (tmp_path / "cache" / "digests").iterdir()
    entry.write_text("from-the-cache")
    assert digests.file_digest(str(model)) == "from-the-cache"  # a resume reads the cache, not the file
    time.sleep(0.05)  # (a later ctime tick)
    rewrite_keeping_time(model, b"a" * 10, b"b" * 10)  # same size, same mtime: the ctime differs
    assert digests.file_digest(str(model)) == digests.bytes_digest(b"b" * 1000)


def test_a_fresh_file_is_not_cached(tmp_path, monkeypatch):
    """A file changed within the last moments could change again within one ctime tick: hashed, not cached."""
    monkeypatch.setenv("RAYMT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "m.bin").write_bytes(b"x")
    digests.file_digest(str(tmp_path / "m.bin"))
    assert not (tmp_path / "cache" / "digests").exists()


def test_a_decoder_refuses_model_bytes_other_than_the_plan_recorded(demo_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(demo_model_dir, model)
    pins = tuple((f["path"].rsplit("/", 1)[-1], f["sha256"]) for f in model_files(str(model)))
    assert dict(pins).keys() >= {"config.json", "model.safetensors"}
    model_reader(str(model), pins)("model.safetensors")  # the planned bytes: read
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelChanged, match=r"model file .*model.safetensors changed since the job planned it"):
        model_reader(str(model), pins)("model.safetensors")


def job(model: Path, src: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "raymt.jobs.translate", "--in-process", "--model", str(model), "--input", str(src),
            "--output", str(out), "--unit-rows", "10", "--beam-size", "2", *extra]


def held_job(args: list[str], gate: Path, out: Path, log: Path) -> subprocess.Popen:
    """The job started with its decoder held after each committed unit while ``gate`` exists; returns
    once its first unit is committed."""
    gate.touch()
    proc = subprocess.Popen(args, cwd=ROOT, env={**os.environ, **gate_env(AFTER_COMMIT, gate)}, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while not list((out / "_manifest").glob("*.json")) if (out / "_manifest").exists() else True:
        assert proc.poll() is None, log.read_text()
        assert time.time() < deadline, "no unit committed in 120 s"
        time.sleep(0.05)
    return proc


def test_an_input_rewritten_while_the_job_is_held_stops_it_naming_the_unit(demo_model_dir, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("".join(f"Ein Mann geht {i}.\n" for i in range(30)), encoding="utf-8")
    out, gate = tmp_path / "out", tmp_path / "gate"
    proc = held_job(job(demo_model_dir, src, out), gate, out, tmp_path / "log")
    try:
        rewrite_keeping_time(src, b"Mann geht 15.", b"Frau geht 15.")
        gate.unlink()
        assert proc.wait(timeout=120) == 1
    finally:
        proc.kill()
    log = (tmp_path / "log").read_text()
    assert f"error: input {src} changed since the job planned it (unit 00000-0000000010" in log, log
    assert "Traceback" not in log and not (out / "_SUCCESS").exists()


def committed_sources(out: Path) -> list[str]:
    return sorted(s for part in out.glob("*.parquet")
                  for s in pq.read_table(part, columns=["source"])["source"].to_pylist())


@pytest.mark.parametrize("when", ["while-held", "before-the-resume"])
def test_a_parquet_data_page_changed_in_place_stops_the_job_and_mixes_nothing(demo_model_dir, tmp_path, when):
    src, out, gate = tmp_path / "in.parquet", tmp_path / "out", tmp_path / "gate"
    write_plain_parquet(src)
    footer = footer_bytes(src)
    proc = held_job(job(demo_model_dir, src, out), gate, out, tmp_path / "log")
    try:
        if when == "before-the-resume":
            proc.kill()
            proc.wait()
        rewrite_keeping_time(src, b"Mann geht 15.", b"Frau geht 15.")  # a data page of the second unit's
        assert footer_bytes(src) == footer
        gate.unlink()
        if when == "while-held":
            assert proc.wait(timeout=120) == 1
            log = (tmp_path / "log").read_text()
            assert f"error: input {src} changed since the job planned it (unit 00000-0000000010: the content of its " \
                   f"rows 10..20" in log, log
        else:
            rerun = subprocess.run(job(demo_model_dir, src, out), cwd=ROOT, capture_output=True, text=True, timeout=120)
            log = rerun.stdout + rerun.stderr
            assert rerun.returncode == 1
            assert f"input {src} changed content (same size {src.stat().st_size}" in log, log
    finally:
        proc.kill()
    assert "Traceback" not in log and not (out / "_SUCCESS").exists()
    sources = committed_sources(out)
    assert sources and all("Mann" in s for s in sources), sources  # the old file's rows only


def test_a_model_swapped_between_a_kill_and_the_resume_is_refused(demo_model_dir, tmp_path):
    model, src = tmp_path / "model", tmp_path / "in.txt"
    shutil.copytree(demo_model_dir, model)
    src.write_text("".join(f"Ein Hund läuft {i}.\n" for i in range(30)), encoding="utf-8")
    out, gate = tmp_path / "out", tmp_path / "gate"
    proc = held_job(job(model, src, out), gate, out, tmp_path / "log")
    proc.kill()
    proc.wait()
    weights = model / "model.safetensors"
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # another model of the same size
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    gate.unlink()
    rerun = subprocess.run(job(model, src, out), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 1
    assert f"model file {weights} changed content (same size {st.st_size}" in rerun.stderr, rerun.stderr
    assert "Traceback" not in rerun.stderr
