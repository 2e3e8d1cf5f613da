"""The input formats, by file name: ``input_format(path)`` is the one object the planner, the unit
reader, the pass-through and the stream path ask (``InputFormat``: plan, read, other columns, raw
lines). A format is one file; adding one is that file and one entry here.

    .parquet                  ``pipeline/inputs/parquet_input.py``
    .csv (+ compression)      ``pipeline/inputs/csvfiles.py``
    .jsonl / .ndjson, .tsv, any other name (+ compression): ``pipeline/inputs/line_inputs.py``

Which name is which format is ``formats.input_kind`` (pure, with the output formats' names).
"""
from __future__ import annotations

from raymt.pipeline.inputs.csvfiles import CSV
from raymt.pipeline.formats import input_kind
from raymt.pipeline.inputs.line_inputs import JSONL, TEXT, TSV
from raymt.pipeline.inputs.parquet_input import PARQUET
from raymt.pipeline.inputs.workunit import InputFormat

FORMATS: dict[str, InputFormat] = {f.name: f for f in (PARQUET, CSV, JSONL, TSV, TEXT)}


def input_format(path: str) -> InputFormat:
    """The format a file is read as, by its name."""
    return FORMATS[input_kind(path)]
