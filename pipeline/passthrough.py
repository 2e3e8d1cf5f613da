"""The input's other columns, carried to the output: a Parquet input's columns besides the text, id
and reference ones (typed, as they are), a CSV input's (as strings, exactly as written), a JSONL
input's other fields (one ``input_json`` column of JSON object text, which a ``.jsonl`` output
spreads back into each object).

They are read again when a unit commits, from the same pinned unit (size and version checked before
and after), rather than carried through the encoder and decoder: the decode path (Ray Data blocks,
the decoder's queue) holds token ids and the text only, however wide or heavy the other columns are,
and a unit's extra columns sit in memory only while its part is written. The cost is reading the
unit's rows a second time (for Parquet only the other columns of its row groups).

A column whose name the output already uses (``translation``, ``score``, ``status``, ...) is
renamed ``input_<name>``; ``--no-passthrough`` leaves them all out.
"""
from __future__ import annotations

import pyarrow as pa

from raymt.pipeline.csvfiles import read_csv_others
from raymt.pipeline.formats import input_kind, parse_jsonl
from raymt.pipeline.units import Columns, WorkUnit, check_pinned, read_parquet_rows, read_unit_lines
from raymt.pipeline.writers import EXTRA_OUTPUTS, INPUT_JSON, PART_COLUMNS

RESERVED = {*PART_COLUMNS, *EXTRA_OUTPUTS, INPUT_JSON, "length_ratio", "filters", "keep"}  # distillation's too


def output_name(name: str) -> str:
    """The output's name for an input column: itself, or ``input_<name>`` where the output has one."""
    while name in RESERVED:
        name = f"input_{name}"
    return name


def read_passthrough(unit: WorkUnit, columns: Columns) -> pa.Table | None:
    """The unit's other input columns, row for row (None: the input has none)."""
    check_pinned(unit.path, unit.size, unit.version)
    kind = input_kind(unit.path)
    if kind == "parquet":
        table = _parquet_columns(unit, columns)
    elif kind == "csv":
        table = read_csv_others(unit, columns)
        table = table.rename_columns([output_name(n) for n in table.column_names]) if table is not None else None
    elif kind == "jsonl":
        fields = [parse_jsonl(line, columns.text, columns.id).fields for line in read_unit_lines(unit)]
        table = pa.table({INPUT_JSON: pa.array(fields, pa.string())}) if any(fields) else None
    else:
        return None
    check_pinned(unit.path, unit.size, unit.version, "while a unit was read from it")
    return table


def _parquet_columns(unit: WorkUnit, columns: Columns) -> pa.Table | None:
    used = {columns.text, unit.id_column, columns.reference}
    table = read_parquet_rows(unit, lambda names: [n for n in names if n not in used])
    if table is None:
        return None
    return table.rename_columns([output_name(n) for n in table.column_names])


def with_passthrough(part: pa.Table, extra: pa.Table | None) -> pa.Table:
    """``part`` with ``extra``'s columns appended (same rows, same order)."""
    if extra is None:
        return part
    if extra.num_rows != part.num_rows:
        raise ValueError(f"the input's other columns hold {extra.num_rows} rows, the part {part.num_rows}")
    for name, column in zip(extra.column_names, extra.columns):
        part = part.append_column(name, column)
    return part
