"""One output part (an Arrow table in ``sink.OUTPUT_SCHEMA``, passed-through columns after it) as
lines of a text output format. Pure: tables in, text out; ``sink.assemble`` writes the text.

* text: the translation, a line per input row (newlines in a translation become spaces);
* Marian n-best (text with ``--nbest`` > 1): per input row ``K ||| hypothesis ||| F0= score ||| score``,
  K the row's 0-based position in the input, its hypotheses best first, at least one line per row
  (a row with no hypothesis, e.g. empty or invalid, gets one line with an empty hypothesis and
  score 0) -- what Marian writes with ``--n-best`` and its tools, fairseq's converters and
  distillation scripts read by splitting on `` ||| ``;
* JSON lines: an object per row: ``id``, the source under the input's text field name, the other
  fields of the input row (passed-through columns, or a JSONL input's other fields), ``translation``,
  ``score``, ``status``, ``reason`` when there is one, and with ``nbest`` > 1 ``nbest``: a list of
  ``{text, score}``;
* TSV: source, tab, translation (tabs and newlines inside either become spaces).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from raymt.pipeline.formats import OutputFormat

PART_COLUMNS = ("id", "row", "source", "translation", "score", "nbest", "status", "reason", "signature")
INPUT_JSON = "input_json"  # a JSONL input's other fields, as one JSON object text per row
EXTRA_OUTPUTS = ("reference", "token_logprobs")  # columns parts carry for distillation, not input fields
RESERVED = {*PART_COLUMNS, *EXTRA_OUTPUTS, INPUT_JSON, "length_ratio", "filters", "keep"}  # distillation's too


def output_name(name: str) -> str:
    """The output's name for a passed-through input column: itself, or ``input_<name>`` where the
    output has one."""
    while name in RESERVED:
        name = f"input_{name}"
    return name


def _flat(text: str | None) -> str:
    return (text or "").replace("\r", " ").replace("\n", " ")


@dataclass(frozen=True)
class LineWriter:
    """A line output format: the part columns it reads (None: all, passed-through ones included) and
    its lines of a part (each ending in a newline)."""

    columns: Callable[[OutputFormat], list[str] | None]
    lines: Callable[[pa.Table, OutputFormat], str]


def lines_of(part: pa.Table, fmt: OutputFormat) -> str:
    """The part's rows as ``fmt``'s lines (each ending in a newline)."""
    return LINE_WRITERS[fmt.kind].lines(part, fmt)


def part_columns(fmt: OutputFormat) -> list[str] | None:
    """The part columns ``fmt``'s lines read (None: every column)."""
    return LINE_WRITERS[fmt.kind].columns(fmt)


def text_lines(part: pa.Table, fmt: OutputFormat) -> str:
    """A translation a line, or Marian's n-best lines with ``nbest`` > 1."""
    if fmt.nbest > 1:
        return marian_nbest_lines(part)
    return "".join(_flat(t) + "\n" for t in part.column("translation").to_pylist())


def tsv_lines(part: pa.Table, fmt: OutputFormat) -> str:
    """Source, tab, translation (tabs and newlines inside either as spaces)."""
    return "".join(f"{_flat(s).replace(chr(9), ' ')}\t{_flat(t).replace(chr(9), ' ')}\n" for s, t in
                   zip(part.column("source").to_pylist(), part.column("translation").to_pylist()))


def _number(score: float | None) -> str:
    return f"{0.0 if score is None or not math.isfinite(score) else score:.6g}"


def marian_nbest_lines(part: pa.Table) -> str:
    """Marian's n-best lines of a part: ``K ||| hypothesis ||| F0= score ||| score`` per hypothesis."""
    out = []
    for row, nbest in zip(part.column("row").to_pylist(), part.column("nbest").to_pylist()):
        for h in nbest or [{"text": "", "score": 0.0}]:
            score = _number(h["score"])
            out.append(f"{row} ||| {_flat(h['text'])} ||| F0= {score} ||| {score}\n")
    return "".join(out)


def jsonl_lines(part: pa.Table, fmt: OutputFormat) -> str:
    """A JSON object per row: the input row's fields, then the translation and how it went."""
    names = [n for n in part.column_names if n not in PART_COLUMNS and n not in EXTRA_OUTPUTS]
    extras = {n: part.column(n).to_pylist() for n in names}
    out = []
    for i, r in enumerate(part.select(["id", "source", "translation", "score", "status", "reason", "nbest"])
                          .to_pylist()):
        obj = {"id": r["id"], fmt.text_name: r["source"]}
        for n in names:
            if n == INPUT_JSON:
                obj.update(json.loads(extras[n][i]) if extras[n][i] else {})
            else:
                obj[n] = extras[n][i]
        obj.update(translation=r["translation"], score=r["score"], status=r["status"])
        if r["reason"]:
            obj["reason"] = r["reason"]
        if fmt.nbest > 1:
            obj["nbest"] = r["nbest"] or []
        out.append(json.dumps(obj, ensure_ascii=False, default=str) + "\n")
    return "".join(out)


def read_marian_nbest(text: str) -> list[tuple[int, str, float]]:
    """Marian n-best lines -> (sentence index, hypothesis, total score), as Marian's and fairseq's
    n-best readers split them: four fields on `` ||| ``, the index an int, the last field a float."""
    got = []
    for line in text.splitlines():
        index, hypothesis, features, total = line.split(" ||| ")
        if not features.startswith("F0= "):
            raise ValueError(f"not a Marian n-best line: {line!r}")
        got.append((int(index), hypothesis, float(total)))
    return got


def _text_columns(fmt: OutputFormat) -> list[str]:
    return ["row", "source", "translation"] + (["nbest"] if fmt.nbest > 1 else [])


# The line output formats by ``OutputFormat.kind`` (``formats.output_format`` names them from the
# file name; ``.parquet`` is written whole by ``sink.assemble``).
LINE_WRITERS: dict[str, LineWriter] = {"jsonl": LineWriter(lambda fmt: None, jsonl_lines),
                                       "tsv": LineWriter(_text_columns, tsv_lines),
                                       "text": LineWriter(_text_columns, text_lines)}
