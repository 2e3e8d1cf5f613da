"""The line input formats: plain text (a sentence a line, ``TEXT``), TSV (``TSV``: the text in
``--column N``) and JSON lines (``JSONL``: an object a line), each plain or compressed.

A line file is scanned once, in chunks, for its line count and each unit's byte range and checksum,
so a unit reads its own bytes, never the whole file (a 200 MB file of 2 million lines: 5 ms and 1
MB a 2500-row unit); compressed ones are planned by line ranges (``pipeline/inputs/textfiles.py``). A TSV
or JSONL line that cannot be parsed is a row with status ``invalid`` and its reason
(``pipeline/formats.py``). Standard input streams through the same rows (``from_lines``).
"""
from __future__ import annotations

import json

import pyarrow as pa

from raymt.pipeline.errors import InputError
from raymt.pipeline.formats import ParsedRow, compression_of, missing_id, parse_jsonl, parse_tsv
from raymt.pipeline.inputs.textfiles import (TextLayout, UnreadableText, check_text, read_line_bytes, read_text_bytes,
                                      split_lines, text_layout, unit_checksum)
from raymt.pipeline.inputs.workunit import (Columns, FilePlan, InputChanged, InputFormat, UnitRows, WorkUnit, check_content,
                                     languages)
from raymt.pipeline.writers import INPUT_JSON

def text_file_layout(path: str, unit_rows: int | None) -> TextLayout:
    """A line file's layout (its rows; with ``unit_rows`` each unit's byte range and checksum)."""
    try:
        check_text(path)
        return text_layout(path, unit_rows)
    except UnreadableText as e:
        raise InputError(str(e)) from None


def read_unit_lines(unit: WorkUnit) -> list[bytes]:
    """A line file's unit: its own bytes (plain), or its line range (compressed); checked against the plan."""
    if compression_of(unit.path):
        data, first = read_line_bytes(unit.path, unit.start, unit.stop), unit.start == 0
    else:
        data, first = read_text_bytes(unit.path, unit.byte_start, unit.byte_stop), not unit.byte_start  # plan_units
    check_content(unit, unit_checksum(data))
    lines = split_lines(data, first)
    if len(lines) != unit.stop - unit.start:
        raise InputChanged(f"{unit.path}: rows {unit.start}..{unit.stop} hold {len(lines)} lines where the plan "
                           f"counted {unit.stop - unit.start}: the file changed after planning")
    return lines


def text_rows(lines: list[bytes], columns: Columns, rows: list[int]) -> UnitRows:
    return UnitRows([str(r) for r in rows], rows, lines, None)


def tsv_rows(lines: list[bytes], columns: Columns, rows: list[int]) -> UnitRows:
    parsed = [parse_tsv(line, columns.tsv_column) for line in lines]
    return UnitRows([str(r) for r in rows], rows, [p.text for p in parsed], None, [p.problem for p in parsed])


def jsonl_rows(lines: list[bytes], columns: Columns, rows: list[int]) -> UnitRows:
    parsed: list[ParsedRow] = [parse_jsonl(line, columns.text, columns.id) for line in lines]
    ids = [p.id if p.id is not None else missing_id(r) for p, r in zip(parsed, rows)]
    fields = [p.fields for p in parsed]
    objects = [json.loads(f) if f else {} for f in fields] if columns.source_lang or columns.target_lang else []
    cells = {name: [o.get(name) for o in objects] for name in (columns.source_lang, columns.target_lang) if name and objects}
    return UnitRows(ids, rows, [p.text for p in parsed], None, [p.problem for p in parsed], fields,
                    languages(cells, columns.source_lang, len(rows)), languages(cells, columns.target_lang, len(rows)))


def jsonl_others(unit: WorkUnit, columns: Columns) -> pa.Table | None:
    """A JSONL unit's other fields, one JSON object text a row (``INPUT_JSON``)."""
    fields = [parse_jsonl(line, columns.text, columns.id).fields for line in read_unit_lines(unit)]
    return pa.table({INPUT_JSON: pa.array(fields, pa.string())}) if any(fields) else None


def _line_format(name: str, rows_of, honours, refusal: str, others=lambda unit, columns: None) -> InputFormat:
    """A line format: its rows of lines, the column flags it honours (else ``refusal``) and its other columns."""
    def plan(path: str, columns: Columns, unit_rows: int | None) -> FilePlan:
        if not honours(columns):
            raise InputError(f"{path}: {refusal}")
        layout = text_file_layout(path, unit_rows)
        return FilePlan(layout.rows, None, layout)

    return InputFormat(name, plan, lambda unit, columns, rows: rows_of(read_unit_lines(unit), columns, rows),
                       others, from_lines=rows_of, relayout=text_file_layout)


# Plain text has no columns (rows are numbered), TSV numbered ones (--column), JSON lines fields
# (--text-column / --text-field, --id-column); a flag a format cannot honour is refused.
TEXT = _line_format("text", text_rows,
                    lambda c: (c.id, c.reference, c.text, c.tsv_column) == (None, None, "text", 1),
                    "a text file has no columns, so --text-column, --id-column, --reference-column and --column do "
                    "not apply (rows are numbered); use a Parquet, TSV or JSONL input")
TSV = _line_format("tsv", tsv_rows, lambda c: (c.id, c.reference, c.text) == (None, None, "text"),
                   "a TSV file's text is chosen by --column N; --text-column, --id-column and --reference-column do "
                   "not apply (rows are numbered)")
JSONL = _line_format("jsonl", jsonl_rows, lambda c: c.reference is None,
                     "--reference-column does not apply to JSON lines (use a Parquet input for --evaluate)", jsonl_others)
