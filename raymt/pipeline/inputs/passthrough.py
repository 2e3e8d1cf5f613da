"""The input's other columns, carried to the output: a Parquet input's columns besides the text, id
and reference ones (typed, as they are), a CSV input's (as strings, exactly as written), a JSONL
input's other fields (one ``input_json`` column of JSON object text, which a ``.jsonl`` output
spreads back into each object).

They are read again when a unit commits, from the same pinned unit (size and version checked before
and after), rather than carried through the encoder and decoder: the decode path (Ray Data blocks,
the decoder's queue) holds token ids and the text only, however wide or heavy the other columns are,
and a unit's extra columns sit in memory only while its part is written. The cost is reading the
unit's rows a second time (for Parquet its row groups, every column, which its checksum covers).

A column whose name the output already uses (``translation``, ``score``, ``status``, ...) is
renamed ``input_<name>``; ``--no-passthrough`` leaves them all out.
"""
from __future__ import annotations

import pyarrow as pa

from raymt.pipeline.inputs.input_formats import input_format
from raymt.pipeline.inputs.workunit import Columns, WorkUnit, check_pinned
from raymt.pipeline.writers import RESERVED, output_name  # noqa: F401 - (re-exported)


def read_passthrough(unit: WorkUnit, columns: Columns) -> pa.Table | None:
    """The unit's other input columns, row for row, under their output names (None: the input has
    none): the unit's format's ``others`` (``pipeline/inputs/input_formats.py``), the file pinned around it."""
    check_pinned(unit.path, unit.size, unit.version)
    table = input_format(unit.path).others(unit, columns)
    check_pinned(unit.path, unit.size, unit.version, "while a unit was read from it")
    return table


def with_passthrough(part: pa.Table, extra: pa.Table | None) -> pa.Table:
    """``part`` with ``extra``'s columns appended (same rows, same order)."""
    if extra is None:
        return part
    if extra.num_rows != part.num_rows:
        raise ValueError(f"the input's other columns hold {extra.num_rows} rows, the part {part.num_rows}")
    for name, column in zip(extra.column_names, extra.columns):
        part = part.append_column(name, column)
    return part
