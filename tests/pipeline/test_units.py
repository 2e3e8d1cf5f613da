"""Work-unit planning and reading: stable names, global rows, schema checks before any work."""
from __future__ import annotations

import random
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymt.pipeline.inputs import textfiles
from raymt.pipeline.orchestration.units import (Columns, CorruptInput, InputError, auto_unit_rows, check_apart, plan_units,
                            read_text_lines, read_unit)


def write(path, n: int, start: int = 0, **extra) -> None:
    pq.write_table(pa.table({"id": [f"s{start + i}" for i in range(n)], "text": [f"Satz {start + i}." for i in range(n)],
                             **extra}), path, row_group_size=7)


def test_units_cover_every_row_once_across_files(tmp_path) -> None:
    write(tmp_path / "a.parquet", 23)
    write(tmp_path / "b.parquet", 5, start=23)
    plan = plan_units(str(tmp_path), Columns(), unit_rows=10)
    assert plan.rows == 28
    assert [(u.name, u.start, u.stop, u.offset) for u in plan.units] == [
        ("00000-0000000000", 0, 10, 0), ("00000-0000000010", 10, 20, 10), ("00000-0000000020", 20, 23, 20),
        ("00001-0000000000", 0, 5, 23)]
    rows = [read_unit(u, Columns()) for u in plan.units]
    assert [i for r in rows for i in r.ids] == [f"s{i}" for i in range(28)]
    assert [i for r in rows for i in r.rows] == list(range(28))
    assert rows[1].texts == [f"Satz {i}." for i in range(10, 20)]  # spans row groups 1 and 2
    assert plan == plan_units(str(tmp_path), Columns(), unit_rows=10)  # stable across runs


def test_default_unit_rows_follow_the_device_and_the_whole_input(tmp_path) -> None:
    assert auto_unit_rows(10**8, gpu=False) == 2500  # the CPU: at most 2500
    assert [auto_unit_rows(n, gpu=True) for n in (1000, 320_000, 1_000_000, 10**8)] == [1000, 5000, 15625, 50_000]
    assert auto_unit_rows(3000, gpu=False) == 1500  # equal units: 2 x 1500, not 2500 + 500
    # with the decoders known: a whole multiple of them, where each unit keeps MIN_UNIT_ROWS rows
    assert [auto_unit_rows(n, gpu=False, decoders=2) for n in (10, 250, 3000, 6000, 10**8)] == [10, 125, 1500, 1500, 2500]
    assert auto_unit_rows(3000, gpu=False, decoders=16) == 188  # 16 units
    assert auto_unit_rows(3000, gpu=False, decoders=64) == 100  # 30 units of MIN_UNIT_ROWS, not 64 smaller ones
    write(tmp_path / "a.parquet", 23)
    write(tmp_path / "b.parquet", 5, start=23)
    seen = []
    plan = plan_units(str(tmp_path), Columns(), unit_rows=lambda rows: seen.append(rows) or 4)
    assert seen == [28] and plan.unit_rows == 4  # sized by the total over every file, once
    assert [u.stop - u.start for u in plan.units] == [4, 4, 4, 4, 4, 3, 4, 1]


def test_row_numbers_are_ids_without_an_id_column(tmp_path) -> None:
    pq.write_table(pa.table({"text": ["a", "b", "c"]}), tmp_path / "x.parquet")
    plan = plan_units(str(tmp_path / "x.parquet"), Columns(), unit_rows=2)
    assert [read_unit(u, Columns()).ids for u in plan.units] == [["0", "1"], ["2"]]  # one id type: strings


def test_text_file_units(tmp_path) -> None:
    (tmp_path / "in.txt").write_bytes(b"eins\r\nzwei\n\ndrei \xff\n")
    plan = plan_units(str(tmp_path / "in.txt"), Columns(), unit_rows=3)
    assert [read_unit(u, Columns()).texts for u in plan.units] == [[b"eins", b"zwei", b""], [b"drei \xff"]]


TEXTS = [b"", b"\n", b"\n\n", b"a", b"a\n", b"a\nb", b"x\r\n\r\ny", b"eins\r\nzwei\n\ndrei \xff\n"]


@pytest.mark.parametrize("chunk", [1, 3, 1 << 24])
@pytest.mark.parametrize("data", TEXTS + [bytes(random.Random(seed).choice(b"ab\n\r\xff") for _ in range(60))
                                          for seed in range(20)])
def test_text_units_read_their_own_bytes_and_give_the_file_s_lines(tmp_path, monkeypatch, data, chunk) -> None:
    """Every unit of a text file reads only its byte range (planned in one streaming pass, scanned in
    chunks that cut lines and CRLFs anywhere), and together they give exactly the file's lines."""
    monkeypatch.setattr(textfiles, "TEXT_CHUNK", chunk)
    (tmp_path / "in.txt").write_bytes(data)
    whole = read_text_lines(str(tmp_path / "in.txt"))
    for size in (1, 2, 3, 7, 1000, lambda rows: 2):  # a size known up front, and one from the total rows
        plan = plan_units(str(tmp_path / "in.txt"), Columns(), unit_rows=size)
        assert plan.rows == len(whole)
        assert all(u.byte_start is not None for u in plan.units)
        assert [t for u in plan.units for t in read_unit(u, Columns()).texts] == whole


def test_a_text_file_changed_after_planning_fails_its_unit_clearly(tmp_path) -> None:
    (tmp_path / "in.txt").write_bytes(b"a\nb\nc\nd\n")
    plan = plan_units(str(tmp_path / "in.txt"), Columns(), unit_rows=2)
    (tmp_path / "in.txt").write_bytes(b"a\nb\n\nd\n" .replace(b"\n\n", b"\nx"))  # rows 2..4 now hold one line
    with pytest.raises(InputError, match=r"in.txt changed since the job planned it \(size 8 -> 7"):
        read_unit(plan.units[1], Columns())


def test_a_large_text_file_is_planned_and_read_in_bounded_memory(tmp_path, monkeypatch) -> None:
    """200,000 lines (12 MB): planning holds one scan chunk, not the lines; a unit reads its bytes only."""
    monkeypatch.setattr(textfiles, "TEXT_CHUNK", 1 << 20)
    line = b"Ein Satz aus einem sehr grossen Korpus, Zeile fuer Zeile.\n"
    (tmp_path / "big.txt").write_bytes(line * 200_000)
    tracemalloc.start()
    plan = plan_units(str(tmp_path / "big.txt"), Columns(), unit_rows=2500)
    planned = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    rows = read_unit(plan.units[40], Columns())
    read = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert (plan.rows, len(plan.units), rows.rows[0], rows.texts[0]) == (200_000, 80, 100_000, line[:-1])
    assert planned < 5 * textfiles.TEXT_CHUNK  # the file's lines would take 10x that
    assert read < 20 * len(line) * 2500  # one unit, never the file


@pytest.mark.parametrize("table, columns, message", [
    (pa.table({"sentence": ["a"]}), Columns(), "no text column 'text'; columns found: ['sentence']"),
    (pa.table({"text": [1, 2]}), Columns(), "text column 'text' has type int64, expected string"),
    (pa.table({"text": ["a"]}), Columns(id="key"), "no id column 'key'; columns found: ['text']"),
    (pa.table({"text": ["a"]}), Columns(reference="ref"), "no reference column 'ref'"),
])
def test_bad_columns_fail_before_any_work_naming_the_columns(tmp_path, table, columns, message) -> None:
    pq.write_table(table, tmp_path / "x.parquet")
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan_units(str(tmp_path), columns, unit_rows=10)


def test_corrupt_parquet_names_the_file_or_is_skipped(tmp_path) -> None:
    write(tmp_path / "a.parquet", 3)
    (tmp_path / "b.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(CorruptInput, match="b.parquet"):
        plan_units(str(tmp_path), Columns(), unit_rows=10)
    plan = plan_units(str(tmp_path), Columns(), unit_rows=10, skip_corrupt=True)
    assert plan.rows == 3 and len(plan.skipped_files) == 1 and plan.skipped_files[0][0].endswith("b.parquet")


def test_missing_input_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(InputError, match="no such file"):
        plan_units(str(tmp_path / "nope.parquet"), Columns(), unit_rows=10)


def test_text_units_on_s3_read_their_byte_ranges(s3) -> None:
    data = b"".join(f"Zeile {i}\r\n".encode() if i % 3 else b"\n" for i in range(50)) + b"letzte"
    s3.pipe("corpus-bucket/in/text.txt", data)
    plan = plan_units("s3://corpus-bucket/in/text.txt", Columns(), unit_rows=7)
    texts = [t for u in plan.units for t in read_unit(u, Columns()).texts]
    assert texts == [line.rstrip(b"\r") for line in data.split(b"\n")] and plan.rows == 51


def test_a_directory_input_reads_parquet_and_text_files_and_refuses_others_by_name(tmp_path) -> None:
    write(tmp_path / "a.parquet", 3)
    (tmp_path / "b.txt").write_bytes(b"eins\nzwei\n")
    (tmp_path / "_SUCCESS").write_bytes(b"")  # markers and hidden files are not input
    (tmp_path / ".a.parquet.crc").write_bytes(b"")
    (tmp_path / "_stats").mkdir()
    write(tmp_path / "_stats" / "x.parquet", 2)
    plan = plan_units(str(tmp_path), Columns(), unit_rows=10)
    assert plan.rows == 5 and [u.path.rsplit("/", 1)[-1] for u in plan.units] == ["a.parquet", "b.txt"]
    (tmp_path / "c.de").write_bytes(b"drei\n")  # was skipped without a word: 1 row lost
    with pytest.raises(InputError, match=r"also holds 1 other file\(s\), which would not be translated: .*c\.de"):
        plan_units(str(tmp_path), Columns(), unit_rows=10)


@pytest.mark.parametrize("columns", [Columns(reference="ref"), Columns(id="key"), Columns(text="de")])
def test_column_options_on_a_text_file_are_refused_not_ignored(tmp_path, columns) -> None:
    (tmp_path / "in.txt").write_bytes(b"eins\n")
    with pytest.raises(InputError, match="a text file has no columns"):
        plan_units(str(tmp_path / "in.txt"), columns, unit_rows=10)


def test_an_output_inside_the_input_directory_is_refused(tmp_path) -> None:
    write(tmp_path / "a.parquet", 3)
    for inside in ("out/", "out", "all.txt.parts"):
        with pytest.raises(InputError, match="is inside the --input directory"):
            check_apart(str(tmp_path), str(tmp_path / inside))
    check_apart(str(tmp_path), str(tmp_path.parent / "elsewhere"))
    check_apart(str(tmp_path / "a.parquet"), str(tmp_path / "out"))  # a file input: its directory may hold output
