"""Work units: the input corpus cut into deterministic row ranges, checked before any work starts.

A unit is (file, first row, end row) of one input file; its name is stable across runs, so a
rerun of the same command finds which units are already committed (``raymt.pipeline.sink``) and skips
them. Parquet files are planned from their footers only (row counts and schemas), so planning a
corpus of millions of lines reads kilobytes. Line files (text, TSV, JSON lines) are scanned once,
in chunks, for their line count and each unit's byte range, so a unit reads its own bytes, never the
whole file (it did: a 200 MB file of 2 million lines took 2.5 s and 484 MB per 2500-row unit, now
5 ms and 1 MB); compressed ones are planned by line ranges (``pipeline/textfiles.py``). A TSV or
JSONL line that cannot be parsed is a row with status ``invalid`` (``pipeline/formats.py``).
Ids are strings, one type for the whole job: an id column's values as text (int ids too), and rows
without an id column get their global row number as text; every output row also carries ``row``
(its global position), so input order is restorable.

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

from raymt.pipeline.errors import JobStopped
from raymt.pipeline.ledger import file_version
from raymt.pipeline.formats import ParsedRow, compression_of, input_kind, is_input_file, parse_jsonl, parse_tsv
from raymt.pipeline.storage import storage_options
from raymt.pipeline.textfiles import (TEXT_CHUNK, UnreadableText, check_text, read_line_range,  # noqa: F401
                                      read_text_lines, text_layout)

logger = logging.getLogger(__name__)



class InputError(ValueError):
    """The input cannot be translated as asked (missing / mistyped column); raised before any work."""


class CorruptInput(InputError):
    """A Parquet file whose footer cannot be read."""


class InputChanged(InputError, JobStopped):
    """An input file is not what the plan recorded: translating on would mix old and new text."""


@dataclass(frozen=True, slots=True)
class Columns:
    text: str = "text"
    id: str | None = None  # None: use "id" if present, else the global row number
    reference: str | None = None
    tsv_column: int = 1  # a TSV input's text column, 1-based (as ``cut -f``)
    source_lang: str | None = None  # M2M100 / NLLB: a Parquet column / JSONL field of per-row source languages
    target_lang: str | None = None  # ... and of per-row target languages (an empty cell: the job's language)


@dataclass(frozen=True, slots=True)
class WorkUnit:
    name: str  # stable: "<file index>-<first row>"
    path: str  # fsspec URL of the file
    start: int  # first row within the file
    stop: int  # one past the last row
    offset: int  # global row number of ``start``
    id_column: str | None  # resolved: the id column to read, or None for row numbers
    byte_start: int | None = None  # text files: the byte range of rows ``start:stop`` (read alone)
    byte_stop: int | None = None
    size: int | None = None  # the file's size and version (mtime or ETag) when planned: checked at every read
    version: str | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    units: tuple[WorkUnit, ...]
    rows: int
    skipped_files: tuple[tuple[str, str], ...] = ()  # (path, reason) of corrupt files skipped
    files: tuple[str, ...] = ()  # every input file, in order (zero-row and skipped ones too)
    unit_rows: int = 0  # rows per unit it was cut into
    versions: tuple[dict, ...] = ()  # ``file_version`` of every file, as planned (the plan record's)


def list_inputs(url: str) -> list[str]:
    """A file, or every ``.parquet`` and ``.txt`` / ``.tsv`` / ``.jsonl`` (plain or compressed) file under a
    directory (sorted), as fsspec URLs.
    Hidden and ``_`` paths under a directory (``.crc``, ``_SUCCESS``, ``_manifest/``) are not input;
    any other file is refused by name, never skipped without a word."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    if fs.isdir(path):
        root = path.rstrip("/") + "/"
        visible = [p for p in sorted(fs.find(path))
                   if not any(part.startswith(("_", ".")) for part in p[len(root):].split("/"))]
        files = [p for p in visible if is_input_file(p)]
        if others := [p for p in visible if not is_input_file(p)]:
            raise InputError(f"{url}: a directory input is read for its .parquet, .txt, .tsv and .jsonl files (plain "
                             f"or .gz / .bz2 / .xz / .zst), and it also holds "
                             f"{len(others)} other file(s), which would not be translated: "
                             f"{', '.join(others[:5])}{' ...' if len(others) > 5 else ''}; move them out (hidden and "
                             f"_ files are ignored) or name the files to translate")
        if not files:
            raise InputError(f"{url}: a directory with no .parquet, .txt, .tsv or .jsonl files")
    elif fs.exists(path):
        files = [path]
    else:
        raise InputError(f"{url}: no such file or directory")
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return [p if protocol in ("file", "local") else f"{protocol}://{p}" for p in files]


def check_apart(input_url: str, output_url: str) -> None:
    """Refuse an output inside the input directory: a rerun would read the job's own parts as input."""
    fs, inp = fsspec.core.url_to_fs(input_url, **storage_options(input_url))
    out_fs, out = fsspec.core.url_to_fs(output_url, **storage_options(output_url))
    if type(fs) is type(out_fs) and fs.isdir(inp) and (out.rstrip("/") + "/").startswith(inp.rstrip("/") + "/"):
        raise InputError(f"--output {output_url} is inside the --input directory {input_url}: its parts would be "
                         f"read as input; write the output elsewhere")


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
    found, skipped = [], []  # (file index, path, rows, id column, byte offsets of unit starts or None)
    known = None if callable(unit_rows) else unit_rows  # text files are cut as they are counted when known
    versions = [file_version(path) for path in files]  # before reading: a file changed meanwhile is refused below
    for index, path in enumerate(files):
        if input_kind(path) != "parquet":
            check_line_columns(path, columns)
            try:
                check_text(path)
                rows, starts = text_layout(path, known)
            except UnreadableText as e:
                raise InputError(str(e)) from None
            found.append((index, path, rows, None, starts))
            continue
        try:
            schema, rows = _footer(path)
        except Exception as e:  # noqa: BLE001 - any unreadable footer is a corrupt file
            if not skip_corrupt:
                raise CorruptInput(f"{path}: not a readable Parquet file ({e})") from e
            logger.warning("skipping corrupt Parquet file %s: %s", path, e)
            skipped.append((path, str(e)))
            continue
        id_column = check_schema(path, schema, columns)
        found.append((index, path, rows, id_column, None))
    total = sum(f[2] for f in found)
    size = unit_rows(total) if callable(unit_rows) else unit_rows
    if size < 1:
        raise ValueError("unit_rows must be >= 1")
    units, offset = [], 0
    for index, path, rows, id_column, starts in found:
        if input_kind(path) != "parquet" and known is None and not compression_of(path):
            starts = text_layout(path, size)[1]  # a second pass: the size depended on every file's rows
        pin = versions[index]
        for k, start in enumerate(range(0, rows, size)):
            stop = min(start + size, rows)
            span = (starts[k], starts[k + 1]) if starts is not None else (None, None)
            units.append(WorkUnit(f"{index:05d}-{start:010d}", path, start, stop, offset + start, id_column, *span,
                                  size=pin["size"], version=pin["version"]))
        offset += rows
    for before, path in zip(versions, files):
        check_pinned(path, before["size"], before["version"], "while it was being planned")
    return Plan(tuple(units), offset, tuple(skipped), tuple(files), unit_rows=size, versions=tuple(versions))


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


def _footer(path: str) -> tuple[pa.Schema, int]:
    with fsspec.open(path, "rb", **storage_options(path)) as f:
        meta = pq.ParquetFile(f).metadata
        return meta.schema.to_arrow_schema(), meta.num_rows


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


@dataclass(frozen=True, slots=True)
class UnitRows:
    ids: list[str | None]
    rows: list[int]
    texts: list  # str | bytes | None
    references: list[str] | None
    problems: list[str | None] | None = None  # per row: why its line could not be parsed (TSV / JSONL), or None
    fields: list[str | None] | None = None  # per row: a JSONL line's other fields (a JSON object's text)
    source_langs: list[str | None] | None = None  # per row: its source language (``Columns.source_lang``)
    target_langs: list[str | None] | None = None  # per row: its target language (``Columns.target_lang``)


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
    if input_kind(unit.path) != "parquet":
        return line_rows(unit, columns, read_unit_lines(unit), rows)
    wanted = [c for c in (columns.text, unit.id_column, columns.reference) if c]
    langs = [c for c in (columns.source_lang, columns.target_lang) if c]  # optional: read where the file has them
    table = read_parquet_rows(unit, lambda names: list(dict.fromkeys(wanted + [c for c in langs if c in names])))
    texts = _cells(table.column(columns.text))
    ids = [None if x is None else str(x) for x in table.column(unit.id_column).to_pylist()] if unit.id_column \
        else [str(r) for r in rows]
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
        lines = read_line_range(unit.path, unit.start, unit.stop)
    else:
        lines = read_text_lines(unit.path, unit.byte_start, unit.byte_stop)  # its own bytes (plan_units)
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
    ids = [p.id if p.id is not None else str(r) for p, r in zip(parsed, rows)]
    fields = [p.fields for p in parsed] if kind == "jsonl" else None
    objects = [json.loads(f) if f else {} for f in fields] if fields and (columns.source_lang or columns.target_lang) else []
    cells = {name: [o.get(name) for o in objects] for name in (columns.source_lang, columns.target_lang) if name and objects}
    return UnitRows(ids, rows, [p.text for p in parsed], None, [p.problem for p in parsed], fields,
                    _languages(cells, columns.source_lang, len(rows)) if kind == "jsonl" else None,
                    _languages(cells, columns.target_lang, len(rows)) if kind == "jsonl" else None)
