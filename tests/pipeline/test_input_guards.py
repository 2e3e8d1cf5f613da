"""Inputs the job must not translate as given: text that is not UTF-8 or not text at all (refused
by name before any work), and an input changed after planning (refused when a unit reads it, so an
output never mixes old and new text) — local and on the moto S3 server, and end to end."""
from __future__ import annotations

import gzip
import re
import os
import time

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import raymt.pipeline.orchestration.units as units
from raymt.jobs.translate import main
from raymt.pipeline.outputs.sink import OutputStore
from raymt.pipeline.inputs.sniff import refusal
from raymt.pipeline.storage import storage_options
from raymt.pipeline.orchestration.units import Columns, InputChanged, InputError, plan_units, read_unit
from tests.conftest import ROOT

SAMPLE = ROOT / "examples" / "sample.de.txt"
TEXT = SAMPLE.read_text(encoding="utf-8")


@pytest.mark.parametrize("data, says", [
    (TEXT.encode("utf-16"), "UTF-16LE text (byte-order mark), not UTF-8: convert it first, e.g. iconv -f UTF-16LE"),
    (b"\xfe\xff" + TEXT.encode("utf-16-be"), "UTF-16BE text (byte-order mark)"),
    (TEXT.encode("utf-32"), "UTF-32LE text (byte-order mark)"),
    (TEXT.encode("utf-16-le"), "UTF-16LE text (NUL at every other byte)"),
    (gzip.compress(TEXT.encode()), "is gzip-compressed, not text: gunzip -k"),
    (b"\x28\xb5\x2f\xfd" + os.urandom(200), "is zstd-compressed"),
    (b"PK\x03\x04" + os.urandom(200), "is a zip archive"),
    (bytes([0, 0, 0, 7, 1, 0, 9, 0, 0, 3] * 200), "holds binary data"),
])
def test_text_that_is_not_utf8_text_is_refused_by_name_before_any_work(tmp_path, data, says) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    with pytest.raises(InputError, match=re.escape("in.txt is " + says) if says[0].isupper() else re.escape("in.txt " + says)):
        plan_units(str(path), Columns(), unit_rows=10)


def test_parquet_data_named_txt_is_refused_and_a_directory_names_the_file(tmp_path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text(TEXT, encoding="utf-8")
    pq.write_table(pa.table({"text": ["Hallo"]}), tmp_path / "in" / "b.txt")
    with pytest.raises(InputError, match=r"in/b.txt is Parquet data, not text: name it .parquet first"):
        plan_units(str(tmp_path / "in"), Columns(), unit_rows=10)


def test_utf8_with_a_bom_or_a_bad_byte_is_text_and_the_bom_is_not_translated(tmp_path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"\xef\xbb\xbf" + TEXT.encode() + b"Ein \xff Hund.\n")
    plan = plan_units(str(path), Columns(), unit_rows=5)
    texts = [t for u in plan.units for t in read_unit(u, Columns()).texts]
    assert texts[0] == TEXT.splitlines()[0].encode() and len(texts) == len(TEXT.splitlines()) + 1
    assert refusal("x", "Bzh… BZh Grüße".encode()) is None and refusal("x", b"BZh is a word here\n") is None


def rewrite(path, table) -> None:
    time.sleep(0.01)  # a new mtime even on coarse clocks
    pq.write_table(table, path)


def test_a_parquet_input_rewritten_after_planning_is_refused_when_a_unit_reads_it(tmp_path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["Ein Hund.", "Eine Katze."]}), path)
    plan = plan_units(str(path), Columns(), unit_rows=1)
    assert read_unit(plan.units[0], Columns()).texts == ["Ein Hund."]
    rewrite(path, pa.table({"id": ["a", "b"], "text": ["Ein Pferd.", "Eine Maus."]}))  # same ids, same rows
    with pytest.raises(InputChanged, match=r"input .*in.parquet changed since the job planned it \(size .* version"):
        read_unit(plan.units[1], Columns())


def test_a_text_input_appended_to_after_planning_is_refused(tmp_path) -> None:
    path = tmp_path / "in.txt"
    path.write_text(TEXT, encoding="utf-8")
    plan = plan_units(str(path), Columns(), unit_rows=4)
    with path.open("a", encoding="utf-8") as f:
        f.write("Noch ein Satz.\n")
    with pytest.raises(InputChanged, match="in.txt changed since the job planned it"):
        read_unit(plan.units[0], Columns())


def test_an_s3_input_rewritten_after_planning_is_refused(s3) -> None:
    url = "s3://corpus-bucket/in/a.parquet"
    fs = fsspec.filesystem("s3", **storage_options(url))
    for texts in (["Ein Hund.", "Eine Katze."], ["Ein Pferd.", "Eine Maus."]):
        with fs.open(url, "wb") as f:
            pq.write_table(pa.table({"text": texts}), f)
        if texts[0] == "Ein Hund.":
            plan = plan_units(url, Columns(), unit_rows=1)
            assert read_unit(plan.units[0], Columns()).texts == ["Ein Hund."]
    with pytest.raises(InputChanged, match=r"a.parquet changed since the job planned it .* version \"?[0-9a-f]+"):
        read_unit(plan.units[1], Columns())


def test_a_job_whose_input_is_rewritten_mid_run_fails_and_mixes_nothing(demo_model_dir, tmp_path, monkeypatch) -> None:
    src = tmp_path / "in.parquet"
    old = [f"Ein Hund läuft ({i})." for i in range(12)]
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(12)], "text": old}), src)
    read = units.read_unit
    calls = []

    def rewritten_after_the_first_unit(unit, columns):
        calls.append(unit.name)
        if len(calls) == 2:  # the first unit is committed: the file is rewritten (same ids, other text)
            rewrite(src, pa.table({"id": [f"r{i}" for i in range(12)], "text": [f"Eine Katze ({i})." for i in range(12)]}))
        return read(unit, columns)
    monkeypatch.setattr("raymt.pipeline.orchestration.actors.read_unit", rewritten_after_the_first_unit)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"error: input .*in.parquet changed since the job planned it"):
        main(["--in-process", "--model", str(demo_model_dir), "--input", str(src), "--output", str(out),
              "--beam-size", "1", "--unit-rows", "4"])
    assert len(calls) == 2  # not retried: no attempt can mend it
    table = OutputStore(str(out)).read()
    assert table.num_rows == 4 and table.column("source").to_pylist() == old[:4]
    assert not (out / "_SUCCESS").exists()
