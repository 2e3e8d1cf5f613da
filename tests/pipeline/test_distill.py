"""Distillation data: the filter columns (pure), and the job end to end on a real local Ray cluster."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymt.jobs.distill import main
from raymt.pipeline.outputs.distill_columns import Filters, row_filters
from tests.pipeline.ray_helpers import clean_corpus, start_ray


def test_filters_are_recorded_not_applied() -> None:
    seen: set[bytes] = set()
    f = Filters(max_length_ratio=2.0, min_score=-1.0)
    assert row_filters("Ein Hund läuft.", "A dog runs.", -0.5, "ok", f, seen) == (1.0, [])
    assert row_filters("Ein Hund läuft.", "A dog runs.", -0.5, "ok", f, seen)[1] == ["duplicate"]
    assert row_filters("Ein Hund.", "", -0.5, "ok", f, seen)[1] == ["empty"]
    assert row_filters(None, "", 0.0, "null", f, seen)[1] == ["status", "empty"]
    assert row_filters("Hund.", "A dog that runs over a green field.", -0.5, "ok", f, seen)[1] == ["length_ratio"]
    assert row_filters("Ein Hund läuft.", "A cat runs.", -3.0, "normalised", f, seen)[1] == ["score"]
    # a pair that failed a filter is not remembered: its later copy is not called a duplicate of it
    assert row_filters("Ein Hund läuft.", "A cat runs.", -0.5, "ok", f, seen)[1] == []


@pytest.fixture(scope="module")
def cluster():
    import ray
    yield start_ray(num_cpus=2)
    ray.shutdown()


def test_distill_job_writes_training_ready_parquet(cluster, demo_model_dir, tmp_path):
    texts = clean_corpus(20) + [clean_corpus(1)[0], None]  # a duplicate of row 0, a null row
    targets = [f"reference {i}" for i in range(len(texts))]
    src = tmp_path / "train.parquet"
    pq.write_table(pa.table({"de": pa.array(texts, pa.string()), "en": targets}), src)
    out = tmp_path / "distill"
    summary = main(["--model", str(demo_model_dir), "--input", str(src), "--output", str(out), "--text-column", "de",
                    "--target-column", "en", "--beam-size", "3", "--nbest", "2", "--token-logprobs",
                    "--threads", "1", "--unit-rows", "8"])
    table = pq.read_table(out / "distilled").sort_by("row").to_pylist()
    assert [r["row"] for r in table] == list(range(22)) and [r["reference"] for r in table] == targets
    strict = json.loads((out / "distilled" / "_SUMMARY.json").read_text(),
                        parse_constant=lambda c: pytest.fail(f"_SUMMARY.json holds {c}: not JSON"))
    assert summary == strict and strict["min_score"] is None  # no bound given: null, not -Infinity
    assert summary["rows"] == 22 and summary["failed"]["duplicate"] == 1 and summary["failed"]["status"] == 1
    assert table[20]["filters"] == ["duplicate"] and table[20]["translation"] == table[0]["translation"]
    assert table[21]["filters"] == ["status", "empty"] and not table[21]["keep"]
    for r in table[:20]:
        assert len(r["nbest"]) == 2 and r["nbest"][0]["text"] == r["translation"]
        # lp 1.0: the score is the mean token log-prob, and teacher forcing gives back the same tokens' log-probs
        assert sum(r["token_logprobs"]) / len(r["token_logprobs"]) == pytest.approx(r["score"], abs=1e-4)
    assert all(r["keep"] == (not r["filters"]) for r in table)


def test_a_student_trains_on_the_kept_distilled_rows(tmp_path) -> None:
    from tools.train_demo import main as train_main
    from tools.demo_training import read_distilled
    from tests.conftest import shared_path

    data = shared_path("multi30k", "train.de").parent
    folder = tmp_path / "distilled"
    folder.mkdir()
    pq.write_table(pa.table({"source": ["Ein Hund läuft.", "Eine Katze.", None] * 20,
                             "translation": ["A dog runs.", "", "x"] * 20,
                             "keep": [True, False, False] * 20}), folder / "part-00000-0000000000.parquet")
    assert read_distilled(str(folder)) == (["Ein Hund läuft."] * 20, ["A dog runs."] * 20)
    out = tmp_path / "student"
    train_main(["--data-dir", str(data), "--train-parquet", str(folder), "--out", str(out), "--work-dir",
                str(tmp_path / "work"), "--minutes", "0.02", "--vocab-size", "1000", "--d-model", "32",
                "--encoder-layers", "1", "--decoder-layers", "1", "--heads", "2", "--ffn-dim", "64",
                "--no-evaluate", "--average-last", "1", "--threads", "1"])
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
