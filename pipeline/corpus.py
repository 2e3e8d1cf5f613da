"""Read a corpus (``.txt`` one sentence a line, or ``.parquet`` with ``text`` and optional ``id``)
and write translations (``.txt`` in input order, or ``.parquet`` with id/source/translation/score/nbest).
Paths may be local or any fsspec URL.
"""
from __future__ import annotations

from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.storage import storage_options


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


def write_translations(url: str, corpus: Corpus, translations: list, signature: str) -> None:
    """``translations``: ``workers.translator.Translation`` objects aligned with ``corpus``."""
    if url.endswith(".parquet"):
        table = pa.table({
            "id": corpus.ids,
            "source": corpus.texts,
            "translation": [t.text for t in translations],
            "score": pa.array([t.score for t in translations], pa.float32()),
            "nbest": [[{"text": x, "score": s} for x, s in t.nbest] for t in translations],
            "signature": [signature] * len(translations),
        })
        with fsspec.open(url, "wb", **storage_options(url)) as f:
            pq.write_table(table, f)
        return
    with fsspec.open(url, "wt", encoding="utf-8", **storage_options(url)) as f:
        for t in translations:
            f.write(t.text.replace("\n", " ") + "\n")
