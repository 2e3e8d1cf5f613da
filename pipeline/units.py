"""Work units: the input corpus cut into deterministic row ranges, checked before any work starts.

A unit is (file, first row, end row) of one input file; its name is stable across runs, so a
rerun of the same command finds which units are already committed (``raymt.pipeline.sink``) and skips
them. Parquet files are planned from their footers only (row counts and schemas), so planning a
corpus of millions of lines reads kilobytes. Line files (text, TSV, JSON lines) are scanned once,
in chunks, for their line count and each unit's byte range, so a unit reads its own bytes, never the
whole file (it did: a 200 MB file of 2 million lines took 2.5 s and 484 MB per 2500-row unit, now
5 ms and 1 MB); compressed ones are planned by line ranges (``pipeline/textfiles.py``). A TSV or
JSONL line that cannot be parsed is a row with status ``invalid`` (``pipeline/formats.py``). CSV
files are planned and read by records (``pipeline/csvfiles.py``).
Ids are strings, one type for the whole job: an id column's values as text (int ids too); rows of an
input without ids (text, TSV, Parquet or CSV without an id column) get their global row number as
text, and a row of an input with ids that lacks its own (a JSON line without the id field or not
parsable, a null Parquet cell, an empty CSV cell) gets ``row:<n>``, n its global row number
(``formats.missing_id``), a form no numeric id takes; every output row also carries ``row``
(its global position), so input order is restorable.

Every unit is pinned to what the plan read: the file's size and version (mtime or ETag), checked
before and after a read, and the checksum of its content (``WorkUnit.checksum``: a line unit's
bytes, hashed in the planning pass; a Parquet file's footer), checked on the bytes it reads, so a
rewrite that keeps size and mtime stops the job naming the unit (``InputChanged``).

Checks made here, before any actor starts: every file's footer is readable (else
:class:`CorruptInput` naming the file, or the file is skipped and reported when asked), the text
column exists and holds strings (or bytes, decoded with replacement), and the id / reference
columns exist when named. Errors name the columns found.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Callable

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from raymt.pipeline.csvfiles import csv_layout, plan_csv, read_csv_unit
from raymt.pipeline.errors import InputError
from raymt.pipeline.workunit import Columns, InputChanged, UnitRows, WorkUnit, check_content  # noqa: F401
from raymt.pipeline.listing import check_apart, list_inputs  # noqa: F401 - (check_apart: re-exported)
from raymt.pipeline.ledger import file_version
from raymt.pipeline.formats import (ParsedRow, compression_of, input_kind, missing_id, parse_jsonl,
                                    parse_tsv)
from raymt.pipeline.storage import storage_options
from raymt.pipeline.textfiles import (TEXT_CHUNK, TextLayout, UnreadableText, check_text, read_line_bytes,  # noqa: F401
                                      read_line_range, read_text_bytes, read_text_lines, split_lines, text_layout,
                                      unit_checksum)

logger = logging.getLogger(__name__)



class CorruptInput(InputError):
    """A Parquet file whose footer cannot be read."""


@dataclass(frozen=True, slots=True)
class Plan:
    units: tuple[WorkUnit, ...]
    rows: int
    skipped_files: tuple[tuple[str, str], ...] = ()  # (path, reason) of corrupt files skipped
    files: tuple[str, ...] = ()  # every input file, in order (zero-row and skipped ones too)
    unit_rows: int = 0  # rows per unit it was cut into
    versions: tuple[dict, ...] = ()  # ``file_version`` of every file, as planned (the plan record's)


MIN_UNIT_ROWS = 100  # below this a unit's commit and start cost more than spreading it earns


def auto_unit_rows(rows: int, gpu: bool, decoders: int = 0) -> int:
    """Rows per work unit where ``--unit-rows`` is not given: at most 2500 on the CPU (a commit every
    ~40 s per decoder on 2 cores; smaller units made the pipeline slower, ``docs/results/pipeline-wmt22.md``).
    On a GPU a decoder's slots drain at the end of every unit, and with 1024 slots units of 2500 rows
    take 1.4x (Multi30k) to 3.1x (WMT22) the steps of one stream, 50,000 rows 1.0x
    (``docs/results/occupancy.md``); so 1/64 of the input (enough units to spread over many GPUs),
    within 2500..50000.

    The units are cut equal (3000 rows: 2 x 1500, not 2500 + 500) and, with ``decoders`` known, as
    many as a whole multiple of the decoders where the input has ``MIN_UNIT_ROWS`` rows for each:
    a 3000-row job on 2 CPU decoders ran its 2500-row unit on one core while the other finished its
    500 rows and idled (611 tokens/s end to end; the two decoders in one process reach ~1000)."""
    cap = min(max(rows // 64, 2500), 50_000) if gpu else 2500
    units = max(1, -(-rows // cap))
    if decoders > 1:
        units = max(units, min(-(-units // decoders) * decoders, rows // MIN_UNIT_ROWS))
    return max(1, -(-rows // units))


def plan_units(url: str, columns: Columns, unit_rows: int | Callable[[int], int], *,
               skip_corrupt: bool = False) -> Plan:
    """Check the input and cut it into units of at most ``unit_rows`` rows (never across files);
    ``unit_rows`` may be a function of the input's total rows (``auto_unit_rows``)."""
    if not callable(unit_rows) and unit_rows < 1:
        raise ValueError("unit_rows must be >= 1")
    files = list_inputs(url)
    found, skipped = [], []  # (file index, path, rows, id column, TextLayout or the footer's checksum)
    known = None if callable(unit_rows) else unit_rows  # text files are cut as they are counted when known
    versions = [file_version(path) for path in files]  # before reading: a file changed meanwhile is refused below
    for index, path in enumerate(files):
        if input_kind(path) == "csv":  # records, not lines: a quoted field may hold newlines
            rows, id_column, layout = plan_csv(path, columns, known)
            found.append((index, path, rows, id_column, layout))
            continue
        if input_kind(path) != "parquet":
            check_line_columns(path, columns)
            layout = _text_layout(path, known)
            found.append((index, path, layout.rows, None, layout))
            continue
        try:
            schema, rows, footer = _footer(path)
        except Exception as e:  # noqa: BLE001 - any unreadable footer is a corrupt file
            if not skip_corrupt:
                raise CorruptInput(f"{path}: not a readable Parquet file ({e})") from e
            logger.warning("skipping corrupt Parquet file %s: %s", path, e)
            skipped.append((path, str(e)))
            continue
        id_column = check_schema(path, schema, columns)
        found.append((index, path, rows, id_column, footer))
    total = sum(f[2] for f in found)
    size = unit_rows(total) if callable(unit_rows) else unit_rows
    if size < 1:
        raise ValueError("unit_rows must be >= 1")
    units, offset = [], 0
    for index, path, rows, id_column, layout in found:
        if isinstance(layout, TextLayout) and layout.checksums is None:
            layout = _second_layout(path, size)  # a second pass: the size depended on every file's rows
        pin = versions[index]
        sums = layout.checksums if isinstance(layout, TextLayout) else None
        pin["content"] = unit_checksum("".join(sums).encode()) if sums is not None else layout
        for k, start in enumerate(range(0, rows, size)):
            stop = min(start + size, rows)
            starts = layout.starts if isinstance(layout, TextLayout) else None
            span = (starts[k], starts[k + 1]) if starts is not None else (None, None)
            units.append(WorkUnit(f"{index:05d}-{start:010d}", path, start, stop, offset + start, id_column, *span,
                                  size=pin["size"], version=pin["version"],
                                  checksum=sums[k] if sums is not None else layout))
        offset += rows
    for before, path in zip(versions, files):
        check_pinned(path, before["size"], before["version"], "while it was being planned")
    return Plan(tuple(units), offset, tuple(skipped), tuple(files), unit_rows=size, versions=tuple(versions))


def _second_layout(path: str, unit_rows: int) -> TextLayout:
    """A line or CSV file's layout once the unit size is known."""
    if input_kind(path) == "csv":
        return csv_layout(path, unit_rows)
    return _text_layout(path, unit_rows)


def _text_layout(path: str, unit_rows: int | None) -> TextLayout:
    try:
        check_text(path)
        return text_layout(path, unit_rows)
    except UnreadableText as e:
        raise InputError(str(e)) from None


def check_line_columns(path: str, columns: Columns) -> None:
    """Refuse column flags a line file cannot honour: plain text has no columns (rows are numbered),
    TSV has numbered ones (--column), JSON lines have fields (--text-column/--text-field, --id-column)."""
    kind = input_kind(path)
    if kind == "jsonl" and columns.reference is None:
        return
    if kind == "tsv" and (columns.id, columns.reference, columns.text) == (None, None, "text"):
        return
    if kind == "text" and (columns.id, columns.reference, columns.text, columns.tsv_column) == (None, None, "text", 1):
        return
    what = {"jsonl": "--reference-column does not apply to JSON lines (use a Parquet input for --evaluate)",
            "tsv": "a TSV file's text is chosen by --column N; --text-column, --id-column and --reference-column "
                   "do not apply (rows are numbered)",
            "text": "a text file has no columns, so --text-column, --id-column, --reference-column and --column do "
                    "not apply (rows are numbered); use a Parquet, TSV or JSONL input"}[kind]
    raise InputError(f"{path}: {what}")


def check_pinned(path: str, size: int | None, version: str | None, when: str = "since the job planned it") -> None:
    """Raise ``InputChanged`` unless the file at ``path`` still has the size and version the plan
    recorded (one metadata call; nothing to check for a unit planned without them)."""
    if size is None:
        return
    now = file_version(path)
    if (now["size"], now["version"]) != (size, version):
        raise InputChanged(f"input {path} changed {when} (size {size} -> {now['size']}, version {version} -> "
                           f"{now['version']}): translating on would mix old and new text. Restore the file, or rerun "
                           f"with --restart to translate the new input afresh")


def _footer(path: str) -> tuple[pa.Schema, int, str]:
    """The schema, rows and footer checksum of a Parquet file."""
    with fsspec.open(path, "rb", **storage_options(path)) as f:
        meta = pq.ParquetFile(f).metadata
        return meta.schema.to_arrow_schema(), meta.num_rows, footer_checksum(f)


def footer_checksum(f) -> str:
    """The checksum of a Parquet file's footer (its metadata: every row group's column chunks, their
    offsets, sizes and statistics), read from the open file ``f``: a rewritten file has another."""
    f.seek(-8, 2)
    tail = f.read(8)  # (4-byte little-endian footer length, b"PAR1")
    length = int.from_bytes(tail[:4], "little")
    f.seek(-8 - length, 2)
    return unit_checksum(f.read(length) + tail)


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


def read_unit(unit: WorkUnit, columns: Columns) -> UnitRows:
    """The rows of one unit (only the needed columns and row groups of its file are read)."""
    check_pinned(unit.path, unit.size, unit.version)
    got = _read_unit(unit, columns)
    check_pinned(unit.path, unit.size, unit.version, "while a unit was read from it")  # rewritten during the read
    return got


def read_parquet_rows(unit: WorkUnit, pick: Callable[[list[str]], list[str]]) -> pa.Table | None:
    """A Parquet unit's rows (only the row groups that hold them are read), of the columns ``pick``
    chooses from the file's names; None when it chooses none."""
    with fsspec.open(unit.path, "rb", **storage_options(unit.path)) as f:
        check_content(unit, footer_checksum(f))
        pf = pq.ParquetFile(f)
        names = pick(pf.schema_arrow.names)
        if not names:
            return None
        groups, first, seen = [], None, 0
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if seen + n > unit.start and seen < unit.stop:
                groups.append(g)
                first = seen if first is None else first
            seen += n
        table = pf.read_row_groups(groups, columns=names)
    return table.slice(unit.start - first, unit.stop - unit.start)


def _read_unit(unit: WorkUnit, columns: Columns) -> UnitRows:
    rows = list(range(unit.offset, unit.offset + unit.stop - unit.start))
    if input_kind(unit.path) == "csv":
        return read_csv_unit(unit, columns, rows)
    if input_kind(unit.path) != "parquet":
        return line_rows(unit, columns, read_unit_lines(unit), rows)
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
    return UnitRows(ids, rows, texts, refs, source_langs=_languages(cells, columns.source_lang, len(rows)),
                    target_langs=_languages(cells, columns.target_lang, len(rows)))


def _languages(cells: dict[str, list], name: str | None, n: int) -> list[str | None] | None:
    """A per-row language column's codes (None where a cell is null or empty, or the file lacks it)."""
    if not name:
        return None
    return [str(x) if x not in (None, "") else None for x in cells.get(name, [None] * n)]


def _cells(column: pa.ChunkedArray) -> list:
    """Text cells as str (bytes when a string cell is not valid UTF-8, so the cleaner can report it)."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        return column.cast(pa.binary()).to_pylist()


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


def line_rows(unit: WorkUnit, columns: Columns, lines: list[bytes], rows: list[int]) -> UnitRows:
    kind = input_kind(unit.path)
    if kind == "text":
        return UnitRows([str(r) for r in rows], rows, lines, None)
    parsed: list[ParsedRow] = [parse_jsonl(line, columns.text, columns.id) for line in lines] if kind == "jsonl" \
        else [parse_tsv(line, columns.tsv_column) for line in lines]
    ids = [p.id if p.id is not None else missing_id(r) if kind == "jsonl" else str(r) for p, r in zip(parsed, rows)]
    fields = [p.fields for p in parsed] if kind == "jsonl" else None
    objects = [json.loads(f) if f else {} for f in fields] if fields and (columns.source_lang or columns.target_lang) else []
    cells = {name: [o.get(name) for o in objects] for name in (columns.source_lang, columns.target_lang) if name and objects}
    return UnitRows(ids, rows, [p.text for p in parsed], None, [p.problem for p in parsed], fields,
                    _languages(cells, columns.source_lang, len(rows)) if kind == "jsonl" else None,
                    _languages(cells, columns.target_lang, len(rows)) if kind == "jsonl" else None)
