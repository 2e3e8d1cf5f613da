"""Corpus reading and writing: .txt and .parquet, local and fsspec memory://, clear errors."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymt.pipeline.inputs.corpus import read_corpus


def test_txt_keeps_empty_lines_and_strips_crlf(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes("eins\r\n\r\nzwei\n".encode())
    corpus = read_corpus(str(path))
    assert corpus.texts == ["eins", "", "zwei"] and corpus.ids == [0, 1, 2]


def test_parquet_ids_and_nulls(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [7, 9], "text": ["a", None]}), path)
    corpus = read_corpus(str(path))
    assert corpus.ids == [7, 9] and corpus.texts == ["a", ""]


def test_parquet_without_id_numbers_rows(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a", "b"]}), path)
    assert read_corpus(str(path)).ids == [0, 1]


@pytest.mark.parametrize("table, message", [
    (pa.table({"sentence": ["a"]}), "columns found: \\['sentence'\\]"),
    (pa.table({"text": [1, 2]}), "expected string"),
])
def test_bad_columns_fail_before_any_work(tmp_path, table, message):
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    with pytest.raises(ValueError, match=message):
        read_corpus(str(path))


def test_memory_filesystem_read():
    import fsspec
    with fsspec.open("memory://in/t.txt", "wt") as f:
        f.write("Hallo\nWelt\n")
    assert read_corpus("memory://in/t.txt").texts == ["Hallo", "Welt"]
