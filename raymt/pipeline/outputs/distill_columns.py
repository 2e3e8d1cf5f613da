"""Training-ready distillation data from a finished translate job's committed parts.

Every input row stays; the filters users apply before training are recorded as columns:

    length_ratio   target words / source words of the best translation
    filters        the filters a row fails: "status" (null / empty source), "empty" (no translation),
                   "length_ratio" (outside [1/r, r]), "score" (length-normalised log-prob below the
                   threshold), "duplicate" (the same source and translation as an earlier row)
    keep           no filter failed

Parts are read in row order, so "earlier" is input order and the result is the same on every
rerun; only the (source, translation) hashes of kept pairs are held in memory.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from raymt.pipeline.outputs.sink import OutputStore

DROP_STATUSES = {"null", "empty"}


@dataclass(frozen=True, slots=True)
class Filters:
    max_length_ratio: float = 3.0
    min_score: float = float("-inf")


def row_filters(source: str | None, translation: str, score: float, status: str, f: Filters,
                seen: set[bytes]) -> tuple[float, list[str]]:
    """(length ratio, failed filters) of one row; ``seen`` collects the kept pairs' hashes."""
    src_words, tgt_words = len((source or "").split()), len(translation.split())
    ratio = tgt_words / max(src_words, 1)
    failed = []
    if set(status.split("+")) & DROP_STATUSES:
        failed.append("status")
    if not translation.strip():
        failed.append("empty")
    if tgt_words and not (1 / f.max_length_ratio <= ratio <= f.max_length_ratio):
        failed.append("length_ratio")
    if score < f.min_score:
        failed.append("score")
    key = hashlib.blake2b(f"{source}\x00{translation}".encode(), digest_size=12).digest()
    if key in seen:
        failed.append("duplicate")
    elif not failed:
        seen.add(key)
    return ratio, failed


def with_filters(part: pa.Table, f: Filters, seen: set[bytes]) -> pa.Table:
    results = [row_filters(s, t, sc, st, f, seen) for s, t, sc, st in zip(
        part.column("source").to_pylist(), part.column("translation").to_pylist(),
        part.column("score").to_pylist(), part.column("status").to_pylist())]
    part = part.append_column("length_ratio", pa.array([r for r, _ in results], pa.float32()))
    part = part.append_column("filters", pa.array([x for _, x in results], pa.list_(pa.string())))
    return part.append_column("keep", pc.equal(pc.list_value_length(part.column("filters")), 0))


def write_distilled(store: OutputStore, f: Filters, folder: str = "distilled") -> dict:
    """``<output>/<folder>/part-<unit>.parquet`` for every committed unit (input order) and a
    ``_SUMMARY.json`` of the filter counts; returns the summary."""
    seen: set[bytes] = set()
    counts: Counter = Counter()
    rows = kept = 0
    for unit in sorted(store.committed()):
        part = with_filters(store.read_part(unit), f, seen)
        store.write_table(f"{folder}/part-{unit}.parquet", part)
        rows += part.num_rows
        kept += sum(part.column("keep").to_pylist())
        for failed in part.column("filters").to_pylist():
            counts.update(failed)
    summary = {"rows": rows, "kept": kept, "failed": dict(sorted(counts.items())),
               "max_length_ratio": _finite(f.max_length_ratio), "min_score": _finite(f.min_score)}
    store.write_bytes(f"{folder}/_SUMMARY.json", json.dumps(summary, indent=1, allow_nan=False).encode())
    return summary


def _finite(x: float | None) -> float | None:
    """JSON has no infinities: an unbounded filter is written as null (no bound)."""
    return x if x is not None and math.isfinite(x) else None
