"""Per-unit commits: a retried unit never appears twice; a part without its marker is not output."""
from __future__ import annotations

import pyarrow as pa

from pipeline.sink import OUTPUT_SCHEMA, OutputStore


def part(rows: list[int], ids: list | None = None) -> pa.Table:
    n = len(rows)
    return pa.table({"id": ids if ids is not None else [f"s{r}" for r in rows], "row": pa.array(rows, pa.int64()),
                     "source": [f"q{r}" for r in rows], "translation": [f"t{r}" for r in rows],
                     "score": [0.0] * n, "nbest": pa.array([[]] * n, OUTPUT_SCHEMA.field("nbest").type),
                     "status": ["ok"] * n, "reason": [""] * n, "signature": ["sig"] * n})


def test_retried_unit_overwrites_its_part(tmp_path) -> None:
    store = OutputStore(str(tmp_path / "out"))
    store.commit("u1", part([2, 3]), None, {"unit": "u1"})
    store.commit("u0", part([0, 1]), None, {"unit": "u0"})
    store.commit("u1", part([2, 3]), None, {"unit": "u1"})  # the same unit again (a retry)
    assert store.committed() == {"u0", "u1"}
    assert store.read().column("row").to_pylist() == [0, 1, 2, 3]


def test_part_without_marker_is_not_committed(tmp_path) -> None:
    store = OutputStore(str(tmp_path / "out"))
    store.commit("u0", part([0]), pa.table({"sentences": [1]}), {"unit": "u0"})
    store.fs.pipe_file(store._path("part-u1.parquet"), b"half a file")  # a writer died before its marker
    assert store.committed() == {"u0"}
    assert store.read().column("id").to_pylist() == ["s0"]
    assert store.read_stats().column("sentences").to_pylist() == [1]
    assert not list((tmp_path / "out" / "_manifest").glob("*.tmp"))
