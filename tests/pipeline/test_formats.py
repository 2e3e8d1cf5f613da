"""Corpus formats without a model: names -> formats, refusals, compressed planning and reading,
JSONL / TSV rows (bad ones become rows with a reason), and the line writers (Marian n-best, JSON
lines)."""
from __future__ import annotations

import bz2
import gzip
import json
import lzma

import pyarrow as pa
import pytest
import zstandard

from raymt.pipeline.formats import OutputFormat, UnsupportedOutput, input_kind, output_format, parse_jsonl, parse_tsv
from raymt.pipeline.outputs.guards import OutputRefused, check_output_format
from raymt.pipeline.inputs.passthrough import output_name
from raymt.pipeline.outputs.sink import output_table
from raymt.pipeline.orchestration.units import Columns, InputError, plan_units, read_unit
from raymt.pipeline.writers import jsonl_lines, lines_of, read_marian_nbest

COMPRESS = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress,
            "zst": lambda data: zstandard.ZstdCompressor().compress(data)}
LINES = [f"Zeile {i} mit Text." for i in range(23)] + ["", "letzte ohne Zeilenende"]


@pytest.mark.parametrize("name, kind", [("a.parquet", "parquet"), ("a.jsonl", "jsonl"), ("a.ndjson.gz", "jsonl"),
                                        ("a.tsv.zst", "tsv"), ("a.de", "text"), ("a.txt.xz", "text")])
def test_input_kind_by_name(name, kind):
    assert input_kind(name) == kind


@pytest.mark.parametrize("name, kind, compression", [("o.parquet", "parquet", None), ("o.jsonl.gz", "jsonl", "gzip"),
                                                     ("o.tsv", "tsv", None), ("o.en.zst", "text", "zstd"),
                                                     ("o.txt.bz2", "text", "bz2"), ("o.en", "text", None)])
def test_output_format_by_name(name, kind, compression):
    assert output_format(name) == OutputFormat(kind, compression)


@pytest.mark.parametrize("name", ["o.csv", "o.json", "o.xlsx", "o.parquet.gz", "o.csv.gz"])
def test_outputs_the_job_does_not_write_are_refused_naming_the_supported_ones(name):
    with pytest.raises(OutputRefused, match=r"cannot be written; supported outputs: .*\.parquet, \.jsonl, \.tsv"):
        check_output_format(name)
    with pytest.raises(UnsupportedOutput, match="--nbest 4"):
        output_format("o.tsv", nbest=4)  # one translation a row cannot hold four


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_compressed_text_plans_by_lines_and_reads_what_the_plain_file_reads(tmp_path, suffix):
    data = ("\ufeff" + "\n".join(LINES)).encode()  # a byte-order mark and no final newline
    (tmp_path / "in.txt").write_bytes(data)
    (tmp_path / f"in.txt.{suffix}").write_bytes(COMPRESS[suffix](data))
    read = {}
    for name in ("in.txt", f"in.txt.{suffix}"):
        plan = plan_units(str(tmp_path / name), Columns(), unit_rows=7)
        assert plan.rows == len(LINES) and [u.stop - u.start for u in plan.units] == [7, 7, 7, 4]
        assert all(u.size is not None for u in plan.units)  # pinned either way
        read[name] = [t for u in plan.units for t in read_unit(u, Columns()).texts]
    assert read["in.txt"] == read[f"in.txt.{suffix}"] == [line.encode() for line in LINES]


def test_a_compressed_name_on_other_data_and_compressed_utf16_are_refused_in_one_line(tmp_path):
    (tmp_path / "fake.txt.gz").write_text("plain text named .gz\n")
    with pytest.raises(InputError, match=r"fake.txt.gz is named as gzip-compressed but is not gzip data"):
        plan_units(str(tmp_path / "fake.txt.gz"), Columns(), unit_rows=10)
    (tmp_path / "u16.txt.gz").write_bytes(gzip.compress("Hallo Welt\n".encode("utf-16")))
    with pytest.raises(InputError, match=r"u16.txt.gz is UTF-16LE text"):  # the decompressed head is sniffed
        plan_units(str(tmp_path / "u16.txt.gz"), Columns(), unit_rows=10)
    (tmp_path / "in.txt").write_bytes(gzip.compress(b"Hallo\n"))
    with pytest.raises(InputError, match=r"is gzip-compressed, not text: gunzip -k .* \(name it .gz"):
        plan_units(str(tmp_path / "in.txt"), Columns(), unit_rows=10)
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(("Zeile\n" * 50000).encode())[:-40])
    with pytest.raises(InputError, match=r"cut.txt.gz: cannot be decompressed as gzip"):  # truncated stream
        plan_units(str(tmp_path / "cut.txt.gz"), Columns(), unit_rows=10)


def test_jsonl_and_tsv_rows_bad_ones_with_their_reason():
    assert parse_jsonl(b'{"id": 5, "text": "Hallo", "n": 1}') == parse_jsonl(b'{"text": "Hallo", "n": 1, "id": 5}')
    row = parse_jsonl(b'{"id": 5, "src": "Hallo", "n": [1]}', "src")
    assert (row.text, row.id, json.loads(row.fields), row.problem) == ("Hallo", "5", {"n": [1]}, None)
    for line, says in ((b"{oops", "invalid JSON"), (b"[1]", "a JSON list, not an object"),
                       (b'{"txt": "x"}', "no field 'text'; fields found: ['txt']"),
                       (b'{"text": 3}', "field 'text' is a JSON int, not a string"), (b"\xff\xfe", "invalid JSON")):
        assert says in parse_jsonl(line).problem and parse_jsonl(line).text is None
    assert parse_tsv(b"Hallo\tHello", 1).text == b"Hallo" and parse_tsv(b"Hallo\tHello", 2).text == b"Hello"
    assert parse_tsv(b"nur eine", 2).problem == "1 tab-separated column(s), the text is asked from column 2"


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("line, text, ident, fields, problem", [
    (DEEP, None, None, None, "JSON nested deeper than 100 levels"),
    (b'{"id": 1, "text": ' + DEEP + b"}", None, None, None, "JSON nested deeper than 100 levels"),
    (b'{"text": "x", "n": ' + b"[" * 99 + b"]" * 99 + b"}", "x", None,
     {"n": json.loads(b"[" * 99 + b"]" * 99)}, None),
    (b'{"text": "x", "n": ' + b"[" * 100 + b"]" * 100 + b"}", None, None, None, "JSON nested deeper than 100 levels"),
    (b'{"text": "[[[[", "n": ' + b"[" * 99 + b"]" * 99 + b"}", "[[[[", None,  # brackets in strings are text
     {"n": json.loads(b"[" * 99 + b"]" * 99)}, None),
    (b'{"id": "a", "text": "a\\ud800b", "k": 1}', None, "a", {"k": 1},
     "field 'text' holds a lone surrogate (\\ud800) at position 1, not valid Unicode"),
    (b'{"id": "a", "text": "raw \xed\xa0\x80"}', None, "a", None,  # a surrogate's UTF-8 form: the same
     "field 'text' holds a lone surrogate (\\ud800) at position 4, not valid Unicode"),
    (b'{"id": "a\\uDC00", "text": "Hallo", "k": 1}', None, None, {"k": 1},
     "field 'id' holds a lone surrogate (\\udc00) at position 1, not valid Unicode"),
    (b'{"id": "a", "text": "Hallo", "meta": {"x": ["\\udfff"]}, "lang": "de"}', None, "a", {"lang": "de"},
     "field 'meta' holds a lone surrogate (\\udfff) in a nested string, not valid Unicode"),
    (b'{"id": "a", "text": "Hallo", "k\\ud800": 1}', None, "a", None,
     "field name 'k\\ud800' holds a lone surrogate (\\ud800), not valid Unicode"),
    (b'{"text": "Lachen \\ud83d\\ude00 und \\\\ud800"}', "Lachen \U0001f600 und \\ud800", None, None, None),  # a pair
])
def test_a_too_deep_or_not_unicode_json_line_is_an_invalid_row_keeping_what_is_valid(line, text, ident, fields,
                                                                                      problem):
    row = parse_jsonl(line)
    assert (row.text, row.id, row.problem) == (text, ident, problem)
    assert (json.loads(row.fields) if row.fields else None) == fields
    for value in (row.text, row.id, row.fields, row.problem):  # nothing an encoder would refuse
        assert value is None or value.encode("utf-8")


def test_jsonl_units_carry_no_lone_surrogate_into_ids_fields_or_languages(tmp_path):
    (tmp_path / "in.jsonl").write_bytes(b'{"id": "a", "text": "Eins", "lang": "de", "x": 1}\n'
                                        b'{"id": "b", "text": "Zwei", "lang": "e\\ud800n", "x": 2}\n'
                                        b'{"id": "c\\ud800", "text": "Drei", "lang": "fr"}\n' + DEEP + b"\n")
    columns = Columns(target_lang="lang")
    unit = plan_units(str(tmp_path / "in.jsonl"), columns, unit_rows=10).units[0]
    got = read_unit(unit, columns)
    assert got.ids == ["a", "b", "row:2", "row:3"] and got.texts == ["Eins", None, None, None]
    assert got.target_langs == ["de", None, "fr", None]
    fields = [json.loads(f) if f else None for f in got.fields]
    assert fields == [{"lang": "de", "x": 1}, {"x": 2}, {"lang": "fr"}, None]
    assert [p and p.split(" holds")[0] for p in got.problems] == [None, "field 'lang'", "field 'id'",
                                                                  "JSON nested deeper than 100 levels"]


def test_jsonl_and_tsv_units_keep_every_row(tmp_path):
    (tmp_path / "in.jsonl.gz").write_bytes(gzip.compress(b'{"id": "a", "text": "Eins", "x": 1}\nkaputt\n'
                                                         b'{"text": "Drei"}\n'))
    plan = plan_units(str(tmp_path / "in.jsonl.gz"), Columns(), unit_rows=2)
    rows = [read_unit(u, Columns()) for u in plan.units]
    assert [i for r in rows for i in r.ids] == ["a", "row:1", "row:2"]  # no id of their own: never a real id's form
    assert [t for r in rows for t in r.texts] == ["Eins", None, "Drei"]
    assert rows[0].problems[1].startswith("invalid JSON") and rows[0].fields[0] == '{"x": 1}'
    (tmp_path / "in.tsv").write_text("Hallo\tHello\nkaputt\n")
    units = plan_units(str(tmp_path / "in.tsv"), Columns(tsv_column=2), unit_rows=5).units
    got = read_unit(units[0], Columns(tsv_column=2))
    assert got.texts == [b"Hello", None] and got.problems[1].startswith("1 tab-separated column")
    (tmp_path / "in.txt.gz").write_bytes(gzip.compress(b"x\n"))
    with pytest.raises(InputError, match="a text file has no columns"):
        plan_units(str(tmp_path / "in.txt.gz"), Columns(text="src"), unit_rows=2)


def _part(rows: list[int], nbest: list[list[dict]], **extra) -> pa.Table:
    n = len(rows)
    table = output_table([str(r) for r in rows], rows, [f"Quelle {r}" for r in rows],
                         [h[0]["text"] if h else "" for h in nbest], [h[0]["score"] if h else 0.0 for h in nbest],
                         nbest, ["ok" if h else "empty" for h in nbest], ["" if h else "empty" for h in nbest], "sig")
    for name, values in extra.items():
        table = table.append_column(name, pa.array(values))
    assert table.num_rows == n
    return table


def test_marian_nbest_lines_parse_as_marian_tools_read_them():
    part = _part([10, 11, 12], [[{"text": "a b", "score": -0.5}, {"text": "a c", "score": -1.25}], [],
                                [{"text": "line\nbreak", "score": -2.0}]])
    got = read_marian_nbest(lines_of(part, OutputFormat("text", nbest=2)))
    assert got == [(10, "a b", -0.5), (10, "a c", -1.25), (11, "", 0.0), (12, "line break", -2.0)]
    assert lines_of(part, OutputFormat("text")) == "a b\n\nline break\n"  # 1-best: a translation a line


def test_jsonl_lines_carry_the_input_fields_translation_and_nbest():
    part = _part([0, 1], [[{"text": "Hi", "score": -0.5}], []], input_json=['{"lang": "de"}', None], domain=["x", "y"])
    got = [json.loads(line) for line in jsonl_lines(part, OutputFormat("jsonl", nbest=2, text_name="src"))
           .splitlines()]
    assert got[0] == {"id": "0", "src": "Quelle 0", "lang": "de", "domain": "x", "translation": "Hi", "score": -0.5,
                      "status": "ok", "nbest": [{"text": "Hi", "score": -0.5}]}
    assert got[1]["reason"] == "empty" and got[1]["nbest"] == [] and "lang" not in got[1]
    assert output_name("score") == "input_score" and output_name("lang") == "lang"


def test_a_directory_reads_every_line_format_compressed_or_not_and_empty_streams(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt.gz").write_bytes(gzip.compress(b"eins\nzwei\n"))
    (tmp_path / "in" / "b.jsonl").write_text('{"text": "drei"}\n')
    (tmp_path / "in" / "c.tsv.xz").write_bytes(lzma.compress(b"vier\tfour\n"))
    for suffix, compress in COMPRESS.items():
        (tmp_path / "in" / f"d.txt.{suffix}").write_bytes(b"")  # zero bytes, not even a stream header: no rows
    plan = plan_units(str(tmp_path / "in"), Columns(), unit_rows=1)
    assert plan.rows == 4 and [t for u in plan.units for t in read_unit(u, Columns()).texts] == [b"eins", b"zwei",
                                                                                              "drei", b"vier"]
    (tmp_path / "in" / "e.xlsx").write_text("x\n")
    with pytest.raises(InputError, match=r"also holds 1 other file\(s\), which would not be translated: .*e.xlsx"):
        plan_units(str(tmp_path / "in"), Columns(), unit_rows=1)


def test_every_input_format_is_one_registered_object_found_by_file_name():
    """``input_format``: the one object the planner, the reader, the pass-through and the stream ask."""
    from raymt.pipeline.inputs.input_formats import FORMATS, input_format
    names = {"a.parquet": "parquet", "a.csv": "csv", "a.csv.gz": "csv", "a.jsonl": "jsonl", "a.ndjson.zst": "jsonl",
             "a.tsv.xz": "tsv", "a.txt": "text", "a.de": "text", "a.parquet.gz": "text"}
    assert {name: input_format(name).name for name in names} == names
    assert set(FORMATS) == set(names.values())
    assert {f.name for f in FORMATS.values() if f.from_lines} == {"jsonl", "tsv", "text"}  # what standard input streams
    assert all(f.relayout for f in FORMATS.values() if f.name != "parquet")  # cut by rows once the unit size is known
