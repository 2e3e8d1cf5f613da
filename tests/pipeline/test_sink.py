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


def test_a_decoded_unit_s_part(demo_model_dir) -> None:
    """``decoded_table``: a row of one piece gets its hypotheses as n-best; a row cut into pieces, their
    best joined, scores summed, that one as n-best; a row with no piece, "" and no n-best."""
    from pipeline.actors import decoded_table
    from pipeline.records import EncodedUnit
    from workers.search import Hypothesis
    from workers.translator import Translator

    tok = Translator.load(str(demo_model_dir)).checkpoint.tokenizer
    ids = {w: tuple(tok.encode_target(w)) for w in ("A dog.", "Two men.", "A cat.", "Hello", "there")}
    hyps = [[Hypothesis(ids["A dog."], -1.0, -2.0), Hypothesis(ids["A cat."], -1.5, -3.0)],  # row 0
            [Hypothesis(ids["Hello"], -0.25, -1.0), Hypothesis(ids["Two men."], -2.0, -4.0)],  # row 2, piece 1
            [Hypothesis(ids["there"], -0.5, -1.0), Hypothesis(ids["A cat."], -3.0, -5.0)]]  # row 2, piece 2
    enc = EncodedUnit(None, ["a", "b", "c"], [10, 11, 12], ["s0", None, "s2"], None, ["ok", "null", "split"],
                      ["", "null", "cut"], [[1], [2], [3]], [0, 2, 2], 0.0)
    table, texts = decoded_table(enc, hyps, tok, "sig")
    assert table.schema.equals(OUTPUT_SCHEMA)
    assert texts == ["A dog.", "", "Hello there"] == table.column("translation").to_pylist()
    assert table.column("score").to_pylist() == [-1.0, 0.0, -0.75]
    assert table.column("nbest").to_pylist() == [[{"text": "A dog.", "score": -1.0}, {"text": "A cat.", "score": -1.5}],
                                                 [], [{"text": "Hello there", "score": -0.75}]]
    assert table.column("row").to_pylist() == [10, 11, 12] and table.column("status").to_pylist() == ["ok", "null", "split"]
