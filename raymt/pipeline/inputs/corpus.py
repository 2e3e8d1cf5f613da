"""Read a corpus whole (``.txt`` one sentence a line, or ``.parquet`` with ``text`` and optional
``id``), for the tools that need all of it at once (``raymt.jobs.build_shortlist``). Translation output
goes through ``raymt.pipeline.outputs.sink`` only. Paths may be local or any fsspec URL.
"""
from __future__ import annotations

from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from raymt.pipeline.storage import storage_options


@dataclass(frozen=True)
class Corpus:
    ids: list
    texts: list[str]


def read_corpus(url: str, *, text_column: str = "text", id_column: str = "id") -> Corpus:
    if url.endswith(".parquet"):
        with fsspec.open(url, "rb", **storage_options(url)) as f:
            table = pq.read_table(f)
        if text_column not in table.column_names:
            raise ValueError(f"{url}: no column {text_column!r}; columns found: {table.column_names}")
        if not pa.types.is_string(table.schema.field(text_column).type) and not pa.types.is_large_string(
                table.schema.field(text_column).type):
            raise ValueError(f"{url}: column {text_column!r} has type {table.schema.field(text_column).type}, expected string")
        texts = table.column(text_column).to_pylist()
        ids = table.column(id_column).to_pylist() if id_column in table.column_names else list(range(len(texts)))
        return Corpus(ids, ["" if t is None else t for t in texts])
    with fsspec.open(url, "rt", encoding="utf-8", errors="replace", newline="\n", **storage_options(url)) as f:
        texts = f.read().split("\n")
    if texts and texts[-1] == "":
        texts.pop()
    return Corpus(list(range(len(texts))), [t.rstrip("\r") for t in texts])
