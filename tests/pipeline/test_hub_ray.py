"""Hugging Face hub ids on a real local Ray cluster, offline: the Ray Data operator's actors and a job's
decoder actors fetch the id from the hub cache themselves (``tests/pipeline/hub_cache.py``), and the
job's plan records the commit the driver pinned."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

import raymt
from raymt.jobs.translate import main
from raymt.pipeline.digests import file_digest
from raymt.pipeline.outputs.ledger import MODEL_FILES
from raymt.ray_data import ERROR_COLUMN, Translate
from raymt.workers.config import SearchConfig
from tests.pipeline.hub_cache import REPO, build_cache, go_offline
from tests.pipeline.ray_helpers import SAMPLE, assert_exactly_once, start_ray, write_corpus

SEARCH = SearchConfig(beam_size=2)


@pytest.fixture(scope="module")
def hub_cluster(tmp_path_factory, demo_model_dir):
    """The cache, and a cluster started after HF_HUB_CACHE / HF_HUB_OFFLINE are set: its workers have them."""
    import ray
    cache = build_cache(tmp_path_factory.mktemp("hub") / "hf-cache", demo_model_dir)
    with pytest.MonkeyPatch.context() as mp:
        go_offline(mp, cache.root)
        start_ray(num_cpus=2)
        yield cache
        ray.shutdown()


def test_the_ray_data_operator_loads_a_hub_id_in_its_actors(hub_cluster, demo_model_dir):
    import ray
    ds = ray.data.from_arrow(pa.table({"text": SAMPLE})).map_batches(
        Translate, fn_constructor_kwargs={"model": REPO, "column": "text", "search": SEARCH, "threads": 1},
        batch_format="pyarrow", batch_size=16, concurrency=1, num_cpus=0.5)
    rows = ds.to_arrow_refs()
    table = pa.concat_tables(ray.get(rows))
    expected = raymt.Translator.load(str(demo_model_dir), search=SEARCH).translate(SAMPLE)
    assert table.column("translation").to_pylist() == expected
    assert table.column(ERROR_COLUMN).to_pylist() == [None] * len(SAMPLE)


def test_a_ray_job_pins_the_commit_and_its_decoders_fetch_it(hub_cluster, demo_model_dir, tmp_path):
    src, out = write_corpus(tmp_path / "in.parquet", SAMPLE), tmp_path / "out"
    main(["--model", REPO, "--input", str(src), "--output", str(out), "--beam-size", "2", "--threads", "1",
          "--unit-rows", "6", "--decoders", "1"])
    table = assert_exactly_once(str(out), [f"r{i:04d}" for i in range(len(SAMPLE))])
    assert set(table.column("status").to_pylist()) == {"ok"}
    plan = json.loads((out / "_PLAN.json").read_text())
    assert f"model:{REPO}|" in plan["signature"]
    hub = hub_cluster
    assert {f["path"]: (f["version"], f["sha256"]) for f in plan["model"]} == {  # the decoders checked these bytes
        f"hf://{REPO}@{hub.a}/{name}": (hub.a, file_digest(str(demo_model_dir / name)))
        for name in MODEL_FILES if (hub.snapshot(hub.a) / name).exists()}
