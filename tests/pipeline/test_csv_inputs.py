"""CSV inputs: a header row names the columns, quoted fields may hold commas, quotes and newlines,
units are ranges of records (plain or compressed), the header is checked before any work, and a
unit whose records changed after planning is refused. Ids: a row without its own id in an input with
ids is ``row:<n>``, never a real id's form."""
from __future__ import annotations

import gzip
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymt.pipeline.inputs import csvfiles
from raymt.pipeline.formats import input_kind, is_input_file
from raymt.pipeline.inputs.passthrough import read_passthrough
from raymt.pipeline.orchestration.units import Columns, InputChanged, InputError, plan_units, read_unit

CSV = (b'id,text,domain\n'
       b'a1,"Hallo, Welt.",news\n'
       b'a2,"Zwei\nZeilen ""zitiert"".",web\n'
       b'\n'  # a blank line: not a record
       b',Ohne Kennung.,007\n'
       b'a4,\xff kaputt,\n')
TEXTS = [b"Hallo, Welt.", b'Zwei\nZeilen "zitiert".', b"Ohne Kennung.", b"\xff kaputt"]


def rows_of(url: str, unit_rows, columns: Columns = Columns()) -> tuple[list, list, list]:
    plan = plan_units(url, columns, unit_rows)
    got = [read_unit(u, columns) for u in plan.units]
    others = [r for u in plan.units for r in (read_passthrough(u, columns) or pa.table({})).to_pylist()]
    return [i for g in got for i in g.ids], [t for g in got for t in g.texts], others


@pytest.mark.parametrize("unit_rows", [1, 3, 100, lambda rows: 2])
@pytest.mark.parametrize("name", ["in.csv", "in.csv.gz"])
def test_csv_rows_are_records_quoted_newlines_and_all(tmp_path, name, unit_rows):
    (tmp_path / name).write_bytes(gzip.compress(CSV) if name.endswith(".gz") else CSV)
    assert input_kind(name) == "csv" and is_input_file(name)
    ids, texts, others = rows_of(str(tmp_path / name), unit_rows)
    assert texts == TEXTS  # bytes: the cleaner decodes each row (a bad byte: that row's ``normalised``)
    assert ids == ["a1", "a2", "row:2", "a4"]  # an empty id cell: the row's own, not a number a real id could be
    assert others == [{"domain": "news"}, {"domain": "web"}, {"domain": "007"}, {"domain": ""}]  # text, as written


def test_csv_without_an_id_column_numbers_rows_and_picks_its_columns(tmp_path):
    (tmp_path / "a.csv").write_text("src,ref,lang\nEins.,One.,de\nZwei.,Two.,\n")
    (tmp_path / "b.csv").write_text("src,ref,lang\nDrei.,Three.,fr\n")
    columns = Columns(text="src", reference="ref", target_lang="lang")
    plan = plan_units(str(tmp_path), columns, unit_rows=5)
    got = [read_unit(u, columns) for u in plan.units]
    assert [g.ids for g in got] == [["0", "1"], ["2"]] and [g.texts for g in got] == [[b"Eins.", b"Zwei."], [b"Drei."]]
    assert [g.references for g in got] == [["One.", "Two."], ["Three."]]
    assert [g.target_langs for g in got] == [["de", None], ["fr"]]  # an empty cell: the job's language
    assert read_passthrough(plan.units[0], columns).column_names == ["lang"]


def test_a_record_longer_than_the_reader_s_block_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(csvfiles, "CSV_BLOCK", 64)
    long = "Ein sehr langer Satz, " * 50
    (tmp_path / "in.csv").write_text(f'text\nkurz\n"{long}"\nauch kurz\n')
    ids, texts, _ = rows_of(str(tmp_path / "in.csv"), 2)
    assert texts == [b"kurz", long.encode(), b"auch kurz"] and ids == ["0", "1", "2"]


@pytest.mark.parametrize("content, columns, message", [
    (b"id,src\n1,a\n", Columns(), r"in.csv: no text column 'text'; columns found: \['id', 'src'\]"),
    (b"text\na\n", Columns(id="key"), r"no id column 'key'; columns found: \['text'\]"),
    (b"text\na\n", Columns(reference="ref"), r"no reference column 'ref'"),
    (b"text\na\n", Columns(tsv_column=2), r"--column 2 applies to .tsv files"),
    (b"text,text\na,b\n", Columns(), r"names column\(s\) \['text'\] more than once"),
    (b"id,text\n1,a\n2,b,c\n", Columns(), r"in.csv: not readable as CSV .*Expected 2 columns, got 3: 2,b,c"),
    (b"\xff\xfet\x00e\x00x\x00t\x00\n\x00", Columns(), r"UTF-16LE text"),
])
def test_a_csv_the_job_cannot_read_as_asked_is_refused_before_any_work(tmp_path, content, columns, message):
    (tmp_path / "in.csv").write_bytes(content)
    with pytest.raises(InputError, match=message):
        plan_units(str(tmp_path / "in.csv"), columns, unit_rows=10)


KATZEN = "".join(f"{i},Zwei Katzen {i}.\n" for i in range(2, 21))


@pytest.mark.parametrize("name, content, message", [
    ("in.csv", f'id,text\n1,"Ein Hund\n{KATZEN}', r"in.csv: a quote opened on line 2 \(record 1\) is never closed$"),
    ("in.csv.gz", f'id,text\n1,"Ein Hund\n{KATZEN}', r"in.csv.gz: a quote opened on line 2 \(record 1\) is never"),
    ("in.csv", f'id,text\n1,Eins.\n{KATZEN}21,"Ein Hund', r"on line 22 \(record 21\) is never closed$"),
    ("in.csv", f'text,id\n"Ein Hund,1\n{KATZEN}',  # a record of too few cells: its number unknown
     r"in.csv: a quote opened on line 2 is never closed$"),
    ("in.csv", f'id,"text\n{KATZEN}', r"in.csv: a quote opened on line 1 \(the header\) is never closed$"),
    ("in.csv", f'id,text\n1,"Ein Hund\n{KATZEN}21,"Ein Vogel"\n',
     r"in.csv: a quote opened on line 2 closes on line 22 with text after it \('Ein Vogel\"'\), not a delimiter"),
])
@pytest.mark.parametrize("block", [csvfiles.CSV_BLOCK, 64])
def test_a_quote_that_swallows_records_is_refused_naming_its_line(tmp_path, monkeypatch, name, content, message,
                                                                   block):
    monkeypatch.setattr(csvfiles, "CSV_BLOCK", block)  # 64: the records come in many blocks, the field grows
    data = content.encode()
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(csvfiles.CsvRefused, match=message) as refused:
        plan_units(str(tmp_path / name), Columns(), unit_rows=5)
    assert "\n" not in str(refused.value)


def test_quoted_fields_over_many_lines_and_blocks_are_still_records(tmp_path, monkeypatch):
    monkeypatch.setattr(csvfiles, "CSV_BLOCK", 64)
    long = "Zeile, mit ""Zitat"".\n" * 30
    (tmp_path / "in.csv").write_text(f'id,text\n1,"{long}"\n2,Er sagte "hallo\n3,"kurz"\n')
    ids, texts, _ = rows_of(str(tmp_path / "in.csv"), 2)
    assert ids == ["1", "2", "3"] and texts == [long.replace('""', '"').encode(), b'Er sagte "hallo', b"kurz"]


def test_a_csv_input_is_translated_by_the_job_not_streamed():
    from raymt.pipeline.orchestration.stream import stream_format

    with pytest.raises(InputError, match=r"in.csv.gz: a CSV input is translated by the job, not as a stream"):
        stream_format("in.csv.gz")


def test_empty_and_header_only_csv_files_have_no_rows(tmp_path):
    (tmp_path / "a.csv").write_bytes(b"")
    (tmp_path / "b.csv").write_text("id,text\n")
    (tmp_path / "c.csv").write_text("text\nEins.\n")
    plan = plan_units(str(tmp_path), Columns(), unit_rows=10)
    assert plan.rows == 1 and [read_unit(u, Columns()).texts for u in plan.units] == [[b"Eins."]]


def test_a_csv_unit_whose_records_changed_after_planning_is_refused(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("id,text\n1,Eins.\n2,Zwei.\n3,Drei.\n")
    plan = plan_units(str(path), Columns(), unit_rows=2)
    stat = path.stat()
    path.write_text("id,text\n1,Eins.\n2,Zwei.\n3,Dr3i.\n")  # same size; its time set back below
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert read_unit(plan.units[0], Columns()).texts == [b"Eins.", b"Zwei."]  # its own records did not change
    with pytest.raises(InputChanged, match="changed since the job planned it"):
        read_unit(plan.units[1], Columns())


def test_rows_without_their_own_id_never_repeat_a_real_one(tmp_path):
    """JSON lines with ids "0", "1", ... and a line that cannot be parsed or lacks its id; a Parquet
    id column with a null cell: every id in the output is distinct."""
    lines = [json.dumps({"id": str(i), "text": f"Satz {i}."}) for i in range(4)]
    lines[1], lines[3] = "{kaputt", json.dumps({"text": "Ohne Kennung."})
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    ids, _, _ = rows_of(str(tmp_path / "in.jsonl"), 2)
    assert ids == ["0", "row:1", "2", "row:3"] and len(set(ids)) == 4
    pq.write_table(pa.table({"id": pa.array([0, None, 1]), "text": ["a", "b", "c"]}), tmp_path / "x.parquet")
    plan = plan_units(str(tmp_path / "x.parquet"), Columns(), unit_rows=10)
    assert read_unit(plan.units[0], Columns()).ids == ["0", "row:1", "1"]
    (tmp_path / "in.txt").write_text("a\nb\n")  # no ids at all: row numbers, as before
    plan = plan_units(str(tmp_path / "in.txt"), Columns(), unit_rows=10)
    assert read_unit(plan.units[0], Columns()).ids == ["0", "1"]
