"""Parquet as an input format (``PARQUET``): planned from its footer (row counts and schema) and one
hashing pass over its column chunks, read by the row groups that hold a unit (their column chunks
read whole, as the checksum covers them; only the columns needed parsed); the other columns pass
through under their output names.

The checks made at planning: the footer is readable (else ``CorruptInput`` naming the file), the
text column exists and holds strings (or bytes, decoded with replacement), the id / reference
columns exist when named and ids are strings or numbers. Errors name the columns found. A unit is
pinned to every byte its rows come from: the column chunks of its row groups and the footer
(``pipeline/inputs/parquet_pins.py``, which states the cost); a read parses the very bytes it checked, and
a file changed in place, whatever its size, time or footer, stops the job (``InputChanged``).
"""
from __future__ import annotations

from typing import Callable

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from raymt.pipeline.errors import InputError
from raymt.pipeline.formats import missing_id
from raymt.pipeline.inputs.parquet_pins import plan_layout, read_pinned
from raymt.pipeline.storage import storage_options
from raymt.pipeline.inputs.workunit import Columns, FilePlan, InputFormat, UnitRows, WorkUnit, check_content, languages
from raymt.pipeline.writers import output_name


class CorruptInput(InputError):
    """A Parquet file whose footer cannot be read."""


def plan_parquet(path: str, columns: Columns, unit_rows: int | None = None) -> FilePlan:
    try:
        with fsspec.open(path, "rb", **storage_options(path)) as f:
            meta, layout = plan_layout(f)
        schema = meta.schema.to_arrow_schema()
    except Exception as e:  # noqa: BLE001 - any unreadable footer or column chunk range is a corrupt file
        raise CorruptInput(f"{path}: not a readable Parquet file ({e})") from e
    return FilePlan(meta.num_rows, check_schema(path, schema, columns), layout)


def check_schema(path: str, schema: pa.Schema, columns: Columns) -> str | None:
    """The id column to use (or None); raises InputError naming the columns found."""
    found = schema.names
    if columns.text not in found:
        raise InputError(f"{path}: no text column {columns.text!r}; columns found: {found}")
    kind = schema.field(columns.text).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)):
        raise InputError(f"{path}: text column {columns.text!r} has type {kind}, expected string; columns found: "
                         f"{[f'{f.name}: {f.type}' for f in schema]}")
    for role, name in (("id", columns.id), ("reference", columns.reference)):
        if name is not None and name not in found:
            raise InputError(f"{path}: no {role} column {name!r}; columns found: {found}")
    id_column = columns.id if columns.id is not None else "id" if "id" in found else None
    if id_column is not None:
        kind = schema.field(id_column).type
        if pa.types.is_nested(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            raise InputError(f"{path}: id column {id_column!r} has type {kind}; ids must be strings or numbers "
                             f"(they are written as strings)")
    return id_column


def read_parquet_rows(unit: WorkUnit, pick: Callable[[list[str]], list[str]]) -> pa.Table | None:
    """A Parquet unit's rows, of the columns ``pick`` chooses from the file's names (None when it
    chooses none), parsed from the footer and row groups read once and checked against the plan."""
    with fsspec.open(unit.path, "rb", **storage_options(unit.path)) as f:
        pinned = read_pinned(f, unit.start, unit.stop)
    check_content(unit, pinned.checksum)
    pf = pq.ParquetFile(pinned.file, metadata=pinned.metadata, pre_buffer=False)
    names = pick(pf.schema_arrow.names)
    if not names:
        return None
    table = pf.read_row_groups(pinned.groups, columns=names)
    return table.slice(unit.start - pinned.first, unit.stop - unit.start)


def read_parquet_unit(unit: WorkUnit, columns: Columns, rows: list[int]) -> UnitRows:
    wanted = [c for c in (columns.text, unit.id_column, columns.reference) if c]
    langs = [c for c in (columns.source_lang, columns.target_lang) if c]  # optional: read where the file has them
    table = read_parquet_rows(unit, lambda names: list(dict.fromkeys(wanted + [c for c in langs if c in names])))
    texts = _cells(table.column(columns.text))
    ids = [missing_id(r) if x is None else str(x) for x, r in zip(table.column(unit.id_column).to_pylist(), rows)] \
        if unit.id_column else [str(r) for r in rows]
    refs = None
    if columns.reference:
        refs = ["" if r is None else str(r) for r in table.column(columns.reference).to_pylist()]
    cells = {name: table.column(name).to_pylist() for name in langs if name in table.column_names}
    return UnitRows(ids, rows, texts, refs, source_langs=languages(cells, columns.source_lang, len(rows)),
                    target_langs=languages(cells, columns.target_lang, len(rows)))


def _cells(column: pa.ChunkedArray) -> list:
    """Text cells as str (bytes when a string cell is not valid UTF-8, so the cleaner can report it)."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        return column.cast(pa.binary()).to_pylist()


def parquet_others(unit: WorkUnit, columns: Columns) -> pa.Table | None:
    """The columns the job does not read, under their output names."""
    used = {columns.text, unit.id_column, columns.reference}
    table = read_parquet_rows(unit, lambda names: [n for n in names if n not in used])
    if table is None:
        return None
    return table.rename_columns([output_name(n) for n in table.column_names])


PARQUET = InputFormat("parquet", plan_parquet, read_parquet_unit, parquet_others)
