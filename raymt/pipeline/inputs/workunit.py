"""A work unit and what reading one gives: the types the planner (``pipeline/orchestration/units.py``) and the
input formats (``pipeline/inputs/input_formats.py``) share, what a format provides (``InputFormat``), and the
content check every read makes."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

    from raymt.pipeline.inputs.parquet_pins import ParquetLayout
    from raymt.pipeline.inputs.textfiles import TextLayout

from raymt.pipeline.errors import InputError, JobStopped
from raymt.pipeline.formats import input_kind
from raymt.pipeline.storage import file_version


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
    checksum: str | None = None  # of the bytes a unit reads (Parquet: its row groups and the footer): checked at every read


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


@dataclass(frozen=True, slots=True)
class FilePlan:
    """What planning one input file found: its rows, the id column to read (None: row numbers), and
    its ``layout``: a line layout (each unit's byte range and checksum, ``TextLayout``; checksums None
    until the unit size is known) or a Parquet one (the footer's and each row group's checksum,
    ``ParquetLayout``)."""

    rows: int
    id_column: str | None
    layout: TextLayout | ParquetLayout


@dataclass(frozen=True)
class InputFormat:
    """One input format, registered by file name (``pipeline/inputs/input_formats.py``):

    * ``plan(path, columns, unit_rows)``: check the file against the column flags and count its rows
      (``unit_rows``: the unit size when known, else None and ``relayout`` cuts it once it is);
    * ``read(unit, columns, rows)``: a unit's rows (``rows``: their global numbers), pinned content checked;
    * ``others(unit, columns)``: the unit's other input columns, already under their output names
      (None: the format or file has none);
    * ``from_lines(lines, columns, rows)``: rows of raw lines (line formats: what standard input streams);
    * ``relayout(path, unit_rows)``: a line layout once the unit size is known (line and CSV files)."""

    name: str
    plan: Callable[[str, Columns, int | None], FilePlan]
    read: Callable[[WorkUnit, Columns, list[int]], UnitRows]
    others: Callable[[WorkUnit, Columns], pa.Table | None]
    from_lines: Callable[[list[bytes], Columns, list[int]], UnitRows] | None = None
    relayout: Callable[[str, int], TextLayout] | None = None


def languages(cells: dict[str, list], name: str | None, n: int) -> list[str | None] | None:
    """A per-row language column's codes (None where a cell is null or empty, or the file lacks it)."""
    if not name:
        return None
    return [str(x) if x not in (None, "") else None for x in cells.get(name, [None] * n)]


def check_content(unit: WorkUnit, checksum: str) -> None:
    """Raise ``InputChanged`` unless what a unit read has the checksum the plan recorded."""
    if unit.checksum is not None and checksum != unit.checksum:
        what = f"rows {unit.start}..{unit.stop}"
        what += " (the column chunks of its row groups, or the footer)" if input_kind(unit.path) == "parquet" else ""
        raise InputChanged(f"input {unit.path} changed since the job planned it (unit {unit.name}: the content of its "
                           f"{what} differs, though its size and time may not): translating on would mix old and new "
                           f"text. Restore the file, or rerun with --restart to translate the new input afresh")

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
