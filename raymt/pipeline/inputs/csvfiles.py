"""CSV inputs (``.csv``, plain or compressed): a header record naming the columns, then one row a
record. A quoted field may hold commas, doubled quotes and newlines, so a CSV file is cut into units
of records, never of bytes or lines.

    layout = csv_layout(url, unit_rows)     # the header, the records, each unit's checksum
    table, checksum = read_records(url, start, stop)   # records start:stop, every column as bytes

Planning reads the file once with pyarrow's streaming reader (``pyarrow.csv.open_csv``): it checks
the header (``plan_csv``: the text column, and the id / reference columns when named) and counts the
records; a file pyarrow cannot parse (a record with a column too many or too few) is refused there,
before any work, naming it. pyarrow reads a quote left open to the end of the file as one field
(the records after it swallowed), so the same pass follows the quotes (``pipeline/inputs/csv_quotes.py``)
and refuses, in one line naming the file and the line the quote opened on:

* a quote never closed: the file ends inside a quoted field (``a quote opened on line 2 (record 1)
  is never closed``);
* a quoted field that spans lines and whose closing quote is followed by text, not a delimiter, a
  blank or a line end: a quote left open, closed by the opening quote of a later quoted field.

Quoted fields that hold newlines, commas and doubled quotes, closed where they end, are records as
always; a quote inside an unquoted field is text. A stray quote closed by another stray quote right
before a delimiter or a line end reads as a legitimate multi-line field and is not caught.

A unit reads its records ``start:stop`` the same way, from the file's start, skipping the records
before its own (a compressed line file is read alike, ``pipeline/inputs/textfiles.py``): parsing only,
about (units / 2) passes over the file in all, and only the unit's records are kept. A record
longer than the reader's block is read again with a block 4x larger (up to 1 GiB), so one huge row
is read, not refused.

Every cell is read as bytes, so a bad byte is one row's problem: the text is decoded row by row
(invalid UTF-8: status ``normalised``), ids, references and the other columns as UTF-8 with
replacement. The other columns pass through as strings, exactly as written (CSV has no types:
``007`` stays ``007``). Blank lines are not records. An empty id cell is a missing id
(``formats.missing_id``). Each unit's checksum covers every column of its records, so a unit whose
records changed after planning is refused (``units.check_content``).
"""
from __future__ import annotations

import hashlib
from typing import Callable, Iterator, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from raymt.pipeline.inputs.csv_quotes import QuoteScan, Tap
from raymt.pipeline.formats import missing_id
from raymt.pipeline.inputs.textfiles import TextLayout, UnreadableText, check_text, open_lines
from raymt.pipeline.errors import InputError
from raymt.pipeline.inputs.workunit import Columns, FilePlan, InputChanged, InputFormat, UnitRows, WorkUnit, check_content
from raymt.pipeline.writers import output_name

CSV_BLOCK = 1 << 22  # bytes pyarrow parses at a time
MAX_CSV_BLOCK = 1 << 30  # the longest record read (the block grows 4x at a time up to it)
_PARSE = pacsv.ParseOptions(newlines_in_values=True)
T = TypeVar("T")


class CsvRefused(InputError):
    """A CSV file pyarrow cannot parse, or whose header cannot give what the job asks for."""


def _growing(read: Callable[[int], T]) -> T:
    """``read(block_size)``, again with a 4x larger block while a record is longer than the block."""
    block = CSV_BLOCK
    while True:
        try:
            return read(block)
        except pa.ArrowInvalid as e:
            if not _straddling(e) or block >= MAX_CSV_BLOCK:
                raise
            block *= 4


def _straddling(e: pa.ArrowInvalid) -> bool:
    """Whether pyarrow failed on a record longer than its block (read again with a larger one)."""
    return "straddl" in str(e)


def _reader(f, block: int, names: list[str] | None) -> pacsv.CSVStreamingReader:
    """A streaming reader of ``f``; with ``names``, every column read as bytes (else types inferred)."""
    convert = pacsv.ConvertOptions(column_types={n: pa.binary() for n in names}) if names else None
    return pacsv.open_csv(f, read_options=pacsv.ReadOptions(block_size=block), parse_options=_PARSE,
                          convert_options=convert)


def csv_header(url: str) -> list[str]:
    """The file's column names (its first record); an empty file has none."""
    def read(block: int) -> list[str]:
        with open_lines(url) as f:
            try:
                return _reader(f, block, None).schema.names
            except pa.ArrowInvalid as e:  # raised here, not in ``open_lines`` (it would blame decompression)
                failure = e
        empty = "Empty CSV file" in str(failure)
        if not _straddling(failure) and (refusal := _quote_refusal(url, _scan_quotes(url), 0 if empty else None)):
            raise refusal
        if empty:
            return []
        raise failure
    return _growing(read)


def _scan_quotes(url: str) -> QuoteScan:
    """The whole file's quotes (``pipeline/inputs/csv_quotes.py``), read on their own."""
    quotes = QuoteScan()
    with open_lines(url) as f:
        Tap(f, quotes).drain()
    return quotes


def _quote_refusal(url: str, quotes: QuoteScan, records: int | None) -> CsvRefused | None:
    """The refusal of a file whose quotes swallowed records, or None; ``records``: the records read,
    so the number of the last, where a quote never closed is (0: in the header; None: unknown)."""
    if quotes.ran_on:
        return CsvRefused(f"{url}: {quotes.ran_on}")
    if not quotes.never_closed:
        return None
    where = "" if records is None else " (the header)" if records == 0 else f" (record {records})"
    return CsvRefused(f"{url}: a quote opened on line {quotes.opened_line}{where} is never closed")


def _batches(url: str, names: list[str], block: int, quotes: QuoteScan | None = None) -> Iterator[pa.RecordBatch]:
    """Every record, in order, a block at a time, every column as bytes; the bytes read are fed to ``quotes``."""
    if not names:
        return
    failure = None
    with open_lines(url) as f:
        source = f if quotes is None else Tap(f, quotes)
        try:
            yield from _reader(source, block, names)
        except pa.ArrowInvalid as e:  # raised below, not in ``open_lines`` (it would blame decompression)
            failure = e
        if quotes is not None and (failure is None or quotes.inside and not _straddling(failure)):
            source.drain()  # the reader may stop short of the end; the quotes' state is the end's
    if failure is not None:
        raise failure


class _Digest:
    """The checksum of a run of records: per column, its cells' lengths and bytes, each hashed as
    one stream (so it does not depend on how the records were cut into batches)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.parts = [(hashlib.sha256(), hashlib.sha256()) for _ in names]  # (lengths, bytes) per column

    def feed(self, batch: pa.RecordBatch) -> None:
        for (lengths, data), column in zip(self.parts, batch.columns):
            ends = np.frombuffer(column.buffers()[1], np.int32)  # (rows of the whole buffer + 1,) cell offsets
            offsets = ends[column.offset:column.offset + len(column) + 1]  # (n + 1,) this slice's
            lengths.update(np.diff(offsets).astype("<i8").tobytes())
            if offsets[-1] > offsets[0]:
                data.update(memoryview(column.buffers()[2])[offsets[0]:offsets[-1]])

    def hexdigest(self) -> str:
        total = hashlib.sha256(repr(self.names).encode())
        for lengths, data in self.parts:
            total.update(lengths.digest() + data.digest())
        return total.hexdigest()[:32]


def csv_layout(url: str, unit_rows: int | None) -> TextLayout:
    """The file's records counted in one streaming pass and, with ``unit_rows``, the checksum of each
    unit of that many records (no byte offsets: a unit is read by records, ``read_records``)."""
    names = csv_header(url)

    def scan(block: int) -> TextLayout:
        rows, sums = 0, [] if unit_rows else None
        digest, quotes = _Digest(names), QuoteScan()
        for batch in _checked_quotes(url, _batches(url, names, block, quotes), quotes):
            if unit_rows:
                at = 0
                while at < batch.num_rows:  # cut the batch where units end
                    take = min(batch.num_rows - at, unit_rows - (rows + at) % unit_rows)
                    digest.feed(batch.slice(at, take))
                    at += take
                    if (rows + at) % unit_rows == 0:
                        sums.append(digest.hexdigest())
                        digest = _Digest(names)
            rows += batch.num_rows
        if unit_rows and rows % unit_rows:
            sums.append(digest.hexdigest())
        return TextLayout(rows, None, sums)
    return _growing(scan)


def _checked_quotes(url: str, batches: Iterator[pa.RecordBatch], quotes: QuoteScan) -> Iterator[pa.RecordBatch]:
    """``batches``, the whole file's, refused (``CsvRefused``) where its quotes swallowed records: a
    quote never closed (its record is the file's last), or a multi-line field run on past its closing quote."""
    records = 0
    try:
        for batch in batches:
            if quotes.ran_on:
                break
            records += batch.num_rows
            yield batch
    except pa.ArrowInvalid as e:  # a record cut short by a quote never closed has too few columns
        if _straddling(e) or not quotes.never_closed:  # a longer record than the block: read again (``_growing``)
            raise
        records = None
    if refusal := _quote_refusal(url, quotes, records):
        raise refusal


def read_records(url: str, start: int, stop: int) -> tuple[pa.Table, str]:
    """Records ``start:stop`` (every column as bytes) and their checksum; the records before them are
    parsed and dropped, and reading stops at ``stop``."""
    names = csv_header(url)

    def read(block: int) -> tuple[pa.Table, str]:
        kept, seen, digest = [], 0, _Digest(names)
        for batch in _batches(url, names, block):
            a, b = max(start - seen, 0), min(stop - seen, batch.num_rows)
            if a < b:
                kept.append(batch.slice(a, b - a))
                digest.feed(kept[-1])
            seen += batch.num_rows
            if seen >= stop:
                break
        schema = pa.schema([(n, pa.binary()) for n in names])
        return pa.Table.from_batches(kept, schema=schema), digest.hexdigest()
    return _growing(read)


def plan_csv(url: str, columns: Columns, unit_rows: int | None) -> tuple[int, str | None, TextLayout]:
    """Check a CSV file against the job's columns, then count its records (``csv_layout``): its
    rows, the id column to read (``--id-column``, else ``id`` when the header has it, else None: row
    numbers) and its layout; ``CsvRefused`` in one line, before any work."""
    try:
        check_text(url)
        names = csv_header(url)
        id_column = check_header(url, names, columns) if names else None  # an empty file: no rows
        layout = csv_layout(url, unit_rows)
    except UnreadableText as e:
        raise CsvRefused(str(e)) from None
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        raise CsvRefused(f"{url}: not readable as CSV (a header record naming the columns, then a row a "
                         f"record): {_short(e)}") from None
    return layout.rows, id_column, layout


def check_header(url: str, names: list[str], columns: Columns) -> str | None:
    """The id column to read (or None); ``CsvRefused`` naming the columns found."""
    if columns.tsv_column != 1:
        raise CsvRefused(f"{url}: a CSV file's text is chosen by --text-column (a name of its header); --column "
                         f"{columns.tsv_column} applies to .tsv files")
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise CsvRefused(f"{url}: the header names column(s) {twice} more than once; columns found: {names}")
    if columns.text not in names:
        raise CsvRefused(f"{url}: no text column {columns.text!r}; columns found: {names}")
    for role, name in (("id", columns.id), ("reference", columns.reference)):
        if name is not None and name not in names:
            raise CsvRefused(f"{url}: no {role} column {name!r}; columns found: {names}")
    return columns.id if columns.id is not None else "id" if "id" in names else None


def _short(e: Exception, limit: int = 300) -> str:
    """An error's message in one line, cut (pyarrow quotes the whole bad record, which may be huge)."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def unit_records(unit: WorkUnit) -> pa.Table:
    """A CSV unit's records, checked against the plan: as many as it counted, with its checksum."""
    table, checksum = read_records(unit.path, unit.start, unit.stop)
    if table.num_rows != unit.stop - unit.start:
        raise InputChanged(f"{unit.path}: records {unit.start}..{unit.stop} hold {table.num_rows} where the plan "
                           f"counted {unit.stop - unit.start}: the file changed after planning")
    check_content(unit, checksum)
    return table


def strings(column: pa.ChunkedArray) -> list[str]:
    """Byte cells as text (invalid UTF-8 replaced with U+FFFD)."""
    return [b.decode("utf-8", "replace") for b in column.to_pylist()]


def read_csv_unit(unit: WorkUnit, columns: Columns, rows: list[int]) -> UnitRows:
    """A CSV unit's rows: text cells as bytes (decoded row by row by the cleaner), ids (the id
    column's cells, an empty one ``row:<n>``; without an id column, row numbers), references and
    per-row languages as text (an empty language cell: the job's language)."""
    table = unit_records(unit)
    ids = [str(r) for r in rows] if unit.id_column is None else [
        cell or missing_id(r) for cell, r in zip(strings(table.column(unit.id_column)), rows)]
    refs = strings(table.column(columns.reference)) if columns.reference else None
    return UnitRows(ids, rows, table.column(columns.text).to_pylist(), refs,
                    source_langs=_codes(table, columns.source_lang), target_langs=_codes(table, columns.target_lang))


def _codes(table: pa.Table, name: str | None) -> list[str | None] | None:
    """A per-row language column's codes (None where a cell is empty, or every row where the file
    lacks the column: the job's language); None when no column is named."""
    if not name:
        return None
    if name not in table.column_names:
        return [None] * table.num_rows
    return [c or None for c in strings(table.column(name))]


def read_csv_others(unit: WorkUnit, columns: Columns) -> pa.Table | None:
    """A CSV unit's other columns (besides text, id and reference) as strings, row for row; None: none."""
    table = unit_records(unit)
    used = {columns.text, unit.id_column, columns.reference}
    others = [n for n in table.column_names if n not in used]
    if not others:
        return None
    return pa.table({n: pa.array(strings(table.column(n)), pa.string()) for n in others})


def plan_csv_file(url: str, columns: Columns, unit_rows: int | None) -> FilePlan:
    return FilePlan(*plan_csv(url, columns, unit_rows))


def csv_others(unit: WorkUnit, columns: Columns) -> pa.Table | None:
    """The columns the job does not read, under their output names."""
    table = read_csv_others(unit, columns)
    return None if table is None else table.rename_columns([output_name(n) for n in table.column_names])


CSV = InputFormat("csv", plan_csv_file, read_csv_unit, csv_others, relayout=csv_layout)
