"""Work units: the input corpus cut into deterministic row ranges, checked before any work starts.

A unit is (file, first row, end row) of one input file; its name is stable across runs, so a
rerun of the same command finds which units are already committed (``raymt.pipeline.outputs.sink``) and skips
them. Each file is planned and read by its format (``pipeline/inputs/input_formats.py``: one object per
format, ``input_format(path)``): Parquet from its footer and one pass hashing its row groups, line
files (text, TSV, JSON lines) by one scan for each unit's byte range, CSV by records.
Ids are strings, one type for the whole job: an id column's values as text (int ids too); rows of an
input without ids (text, TSV, Parquet or CSV without an id column) get their global row number as
text, and a row of an input with ids that lacks its own (a JSON line without the id field or not
parsable, a null Parquet cell, an empty CSV cell) gets ``row:<n>``, n its global row number
(``formats.missing_id``), a form no numeric id takes; every output row also carries ``row``
(its global position), so input order is restorable.

Every unit is pinned to what the plan read: the file's size and version (mtime or ETag), checked
before and after a read, and the checksum of its content (``WorkUnit.checksum``: a line unit's
bytes, hashed in the planning pass; a Parquet unit's row groups' column chunks and the file's
footer, ``pipeline/inputs/parquet_pins.py``), checked on the bytes it reads, so a rewrite that keeps size
and mtime stops the job naming the unit (``InputChanged``).

Checks made by the formats here, before any actor starts: every Parquet footer is readable (else
:class:`CorruptInput` naming the file, or the file is skipped and reported when asked), the text
column exists and holds strings, the id / reference columns exist when named, and no column flag is
given that the format cannot honour. Errors name the columns found.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from raymt.pipeline.errors import InputError  # noqa: F401 - (re-exported)
from raymt.pipeline.inputs.input_formats import input_format
from raymt.pipeline.storage import file_version
from raymt.pipeline.inputs.listing import check_apart, list_inputs  # noqa: F401 - (check_apart: re-exported)
from raymt.pipeline.inputs.parquet_input import CorruptInput
from raymt.pipeline.inputs.parquet_pins import ParquetLayout
from raymt.pipeline.inputs.textfiles import (TEXT_CHUNK, TextLayout, read_line_range, read_text_lines,  # noqa: F401
                                      unit_checksum)
from raymt.pipeline.inputs.workunit import (Columns, InputChanged, UnitRows, WorkUnit, check_content,  # noqa: F401
                                            check_pinned)

logger = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class Plan:
    units: tuple[WorkUnit, ...]
    rows: int
    skipped_files: tuple[tuple[str, str], ...] = ()  # (path, reason) of corrupt files skipped
    files: tuple[str, ...] = ()  # every input file, in order (zero-row and skipped ones too)
    unit_rows: int = 0  # rows per unit it was cut into
    versions: tuple[dict, ...] = ()  # ``file_version`` of every file, as planned (the plan record's)


MIN_UNIT_ROWS = 100  # below this a unit's commit and start cost more than spreading it earns
CPU_UNIT_ROWS = 2500  # at most, on the CPU (``auto_unit_rows``)
GPU_UNIT_SHARE = 64  # on a GPU: 1/64 of the input a unit ...
GPU_UNIT_ROWS = (CPU_UNIT_ROWS, 50_000)  # ... within these rows


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
    low, high = GPU_UNIT_ROWS
    cap = min(max(rows // GPU_UNIT_SHARE, low), high) if gpu else CPU_UNIT_ROWS
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
    found, skipped = [], []  # (file index, path, rows, id column, TextLayout or ParquetLayout)
    known = None if callable(unit_rows) else unit_rows  # text files are cut as they are counted when known
    versions = [file_version(path) for path in files]  # before reading: a file changed meanwhile is refused below
    for index, path in enumerate(files):
        fmt = input_format(path)
        try:
            plan = fmt.plan(path, columns, known)
        except CorruptInput as e:
            if not skip_corrupt:
                raise
            logger.warning("skipping corrupt Parquet file %s: %s", path, e.__cause__)
            skipped.append((path, str(e.__cause__)))
            continue
        found.append((index, path, plan.rows, plan.id_column, plan.layout))
    total = sum(f[2] for f in found)
    size = unit_rows(total) if callable(unit_rows) else unit_rows
    if size < 1:
        raise ValueError("unit_rows must be >= 1")
    units, offset = [], 0
    for index, path, rows, id_column, layout in found:
        if isinstance(layout, TextLayout) and layout.checksums is None:
            layout = input_format(path).relayout(path, size)  # a second pass: the size depended on every file's rows
        pin = versions[index]
        pin["content"] = _content(layout)
        for k, start in enumerate(range(0, rows, size)):
            stop = min(start + size, rows)
            starts = layout.starts if isinstance(layout, TextLayout) else None
            span = (starts[k], starts[k + 1]) if starts is not None else (None, None)
            units.append(WorkUnit(f"{index:05d}-{start:010d}", path, start, stop, offset + start, id_column, *span,
                                  size=pin["size"], version=pin["version"], checksum=_checksum(layout, k, start, stop)))
        offset += rows
    for before, path in zip(versions, files):
        check_pinned(path, before["size"], before["version"], "while it was being planned")
    return Plan(tuple(units), offset, tuple(skipped), tuple(files), unit_rows=size, versions=tuple(versions))


def _content(layout: TextLayout | ParquetLayout) -> str:
    """A file's content checksum, as the plan record pins it."""
    if isinstance(layout, ParquetLayout):
        return layout.content
    return unit_checksum("".join(layout.checksums).encode())


def _checksum(layout: TextLayout | ParquetLayout, k: int, start: int, stop: int) -> str:
    """The checksum of unit ``k``, rows ``start:stop`` of its file."""
    return layout.checksum(start, stop) if isinstance(layout, ParquetLayout) else layout.checksums[k]




def read_unit(unit: WorkUnit, columns: Columns) -> UnitRows:
    """The rows of one unit (only the needed columns and row groups of its file are read)."""
    check_pinned(unit.path, unit.size, unit.version)
    got = _read_unit(unit, columns)
    check_pinned(unit.path, unit.size, unit.version, "while a unit was read from it")  # rewritten during the read
    return got


def _read_unit(unit: WorkUnit, columns: Columns) -> UnitRows:
    return input_format(unit.path).read(unit, columns, list(range(unit.offset, unit.offset + unit.stop - unit.start)))
