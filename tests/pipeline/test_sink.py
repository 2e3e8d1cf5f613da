"""Per-unit commits: a retried unit never appears twice; a part without its marker is not output."""
from __future__ import annotations

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymt.pipeline.outputs.sink import OUTPUT_SCHEMA, OutputStore, assemble
from raymt.pipeline.storage import storage_options


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
    from raymt.pipeline.orchestration.actors import decoded_table
    from raymt.pipeline.outputs.records import EncodedUnit
    from raymt.workers.search.selection import Hypothesis
    from raymt.workers.decoder.core_decoder import CoreDecoder

    tok = CoreDecoder.load(str(demo_model_dir)).checkpoint.tokenizer
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


def committed_store(url: str) -> OutputStore:
    """Three units committed out of order, rows shuffled within a part, one part without the extras."""
    store = OutputStore(url)
    store.commit("00000-0000000004", part([5, 4]).append_column("reference", pa.array(["r5", "r4"])), None, {})
    store.commit("00000-0000000000", part([2, 0, 1, 3]).append_column("reference", pa.array(["r2", "r0", "r1", "r3"])),
                 None, {})
    store.commit("00001-0000000000", part([6]), None, {})  # e.g. an unreadable unit: no reference column
    return store


@pytest.mark.parametrize("where", ["disk", "s3"])
def test_one_file_is_assembled_a_part_at_a_time_in_input_order(tmp_path, where, request) -> None:
    root = str(tmp_path) if where == "disk" else f"s3://corpus-bucket/{request.getfixturevalue('s3') and 'assemble'}"
    store = committed_store(f"{root}/out")
    assemble(store, f"{root}/all.txt")
    assemble(store, f"{root}/all.parquet")
    with fsspec.open(f"{root}/all.txt", "rb", **storage_options(root)) as f:
        assert f.read() == b"t0\nt1\nt2\nt3\nt4\nt5\nt6\n"
    with fsspec.open(f"{root}/all.parquet", "rb", **storage_options(root)) as f:
        table = pq.read_table(f)
    assert table.column("row").to_pylist() == list(range(7)) and table.equals(store.read().select(table.column_names))
    assert table.column("reference").to_pylist() == ["r0", "r1", "r2", "r3", "r4", "r5", None]


@pytest.mark.parametrize("where", ["disk", "s3"])
def test_an_assembly_that_fails_part_way_leaves_no_file_or_the_old_one_whole(tmp_path, where, request,
                                                                             monkeypatch) -> None:
    root = str(tmp_path) if where == "disk" else f"s3://corpus-bucket/{request.getfixturevalue('s3') and 'broken'}"
    store = committed_store(f"{root}/out")
    fs, _ = fsspec.core.url_to_fs(root, **storage_options(root))
    real = store.parts

    def parts_then_fail(columns=None):
        yield next(real(columns))
        raise OSError("a part could not be read")
    monkeypatch.setattr(store, "parts", parts_then_fail)
    with pytest.raises(OSError, match="could not be read"):
        assemble(store, f"{root}/all.txt")
    assert not fs.exists(f"{root}/all.txt")
    monkeypatch.setattr(store, "parts", real)
    assemble(store, f"{root}/all.txt")
    monkeypatch.setattr(store, "parts", parts_then_fail)
    with pytest.raises(OSError):
        assemble(store, f"{root}/all.txt")
    with fsspec.open(f"{root}/all.txt", "rb", **storage_options(root)) as f:
        assert f.read().count(b"\n") == 7  # the earlier file, whole
    assert [p for p in fs.ls(root, detail=False) if p.endswith(".tmp")] == []


def test_a_rerun_resumes_an_output_whose_marker_and_success_the_previous_version_wrote(demo_model_dir, tmp_path,
                                                                                        capsys) -> None:
    """Markers and _SUCCESS are typed records now; the files an earlier version wrote (plain JSON
    objects, an older marker without statuses) still resume: the committed unit is skipped."""
    import json

    from raymt.jobs.translate import main
    src, out = tmp_path / "in.txt", tmp_path / "out"
    src.write_text("Ein Hund.\nZwei Männer.\nEine Frau liest.\nKinder spielen.\n", encoding="utf-8")
    argv = ["--in-process", "--threads", "1", "--beam-size", "1", "--unit-rows", "2", "--model", str(demo_model_dir),
            "--input", str(src), "--output", str(out) + "/"]
    main(argv)
    first = OutputStore(str(out)).read().column("translation").to_pylist()
    markers = sorted((out / "_manifest").glob("*.json"))
    assert len(markers) == 2
    old = json.loads(markers[0].read_text())  # as the previous version wrote it: a plain object, no typed fields
    markers[0].write_text(json.dumps({"unit": old["unit"], "rows": old["rows"], "actor": old["actor"],
                                      "signature": old["signature"], "plan": old["plan"]}))  # older: no statuses
    markers[1].unlink()  # the second unit is not committed: the rerun decodes it
    (out / "_SUCCESS").write_text(json.dumps({"units": 2, "rows": 4, "skipped_units": 0, "skipped_files": [],
                                              "unreadable_units": {}, "rows_by_status": {"ok": 4}, "signature": "s",
                                              "plan": old["plan"], "lease_generation": 1, "scores": None}, indent=1))
    assert OutputStore(str(out)).read_success().rows == 4
    capsys.readouterr()
    main(argv)
    assert "(1 already committed)" in capsys.readouterr().out
    store = OutputStore(str(out))
    assert store.read().column("translation").to_pylist() == first
    assert [m.rows for m in store.markers()] == [2, 2] and store.read_success().skipped_units == 1
