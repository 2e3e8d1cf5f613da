"""A work unit and what reading one gives: the types the planner (``pipeline/units.py``) and the
per-format readers (``pipeline/csvfiles.py``) share, and the content check every read makes."""
from __future__ import annotations

from dataclasses import dataclass

from raymt.pipeline.errors import InputError, JobStopped
from raymt.pipeline.formats import input_kind


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
    checksum: str | None = None  # of the unit's bytes (line files) or the file's footer (Parquet): checked at every read


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


def check_content(unit: WorkUnit, checksum: str) -> None:
    """Raise ``InputChanged`` unless what a unit read has the checksum the plan recorded."""
    if unit.checksum is not None and checksum != unit.checksum:
        what = "footer" if input_kind(unit.path) == "parquet" else f"rows {unit.start}..{unit.stop}"
        raise InputChanged(f"input {unit.path} changed since the job planned it (unit {unit.name}: the content of its "
                           f"{what} differs, though its size and time may not): translating on would mix old and new "
                           f"text. Restore the file, or rerun with --restart to translate the new input afresh")
