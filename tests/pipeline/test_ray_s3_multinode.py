"""The pipeline against a real S3 endpoint over HTTP (moto's server + s3fs), and on a two-node
``ray.cluster_utils.Cluster`` with decoder actors placed on both nodes."""
from __future__ import annotations


import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymt.jobs.translate import main
from tests.pipeline.ray_helpers import clean_corpus, start_ray

pytest.importorskip("moto.server")


def test_s3_input_and_output(s3, demo_model_dir):
    import ray
    texts = clean_corpus(30)
    with s3.open("corpus-bucket/in/part-0.parquet", "wb") as f:
        pq.write_table(pa.table({"id": [f"r{i}" for i in range(20)], "text": texts[:20]}), f)
    with s3.open("corpus-bucket/in/part-1.parquet", "wb") as f:
        pq.write_table(pa.table({"id": [f"r{i}" for i in range(20, 30)], "text": texts[20:]}), f)
    start_ray(num_cpus=2)  # after the AWS variables are set: workers inherit them too
    try:
        main(["--model", str(demo_model_dir), "--input", "s3://corpus-bucket/in/", "--output", "s3://corpus-bucket/out",
              "--beam-size", "1", "--threads", "1", "--unit-rows", "8"])
    finally:
        ray.shutdown()
    names = s3.ls("corpus-bucket/out")
    assert any(n.endswith("_SUCCESS") for n in names)
    parts = [n for n in names if n.rsplit("/", 1)[-1].startswith("part-")]
    assert len(parts) == 5  # units never cross files: 20 rows -> 8 + 8 + 4, 10 rows -> 8 + 2
    table = pa.concat_tables([pq.read_table(s3.open(p, "rb")) for p in parts]).sort_by("row")
    assert table.column("id").to_pylist() == [f"r{i}" for i in range(30)]
    assert all(table.column("translation").to_pylist())


def test_two_node_cluster_places_decoders_on_both_nodes(demo_model_dir, tmp_path):
    import ray
    from ray.cluster_utils import Cluster
    from ray.data import DataContext

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    DataContext.get_current().enable_progress_bars = False
    try:
        cluster.wait_for_nodes()
        src = tmp_path / "in.parquet"
        pq.write_table(pa.table({"text": clean_corpus(60)}), src)
        main(["--model", str(demo_model_dir), "--input", str(src), "--output", str(tmp_path / "out"),
              "--beam-size", "1", "--threads", "1", "--unit-rows", "5", "--decoders", "2"])
        stats = pq.read_table(tmp_path / "out" / "_stats").to_pylist()
        assert len({s["node"] for s in stats}) == 2
        assert sorted(pq.read_table(tmp_path / "out", columns=["row"]).column("row").to_pylist()) == list(range(60))
    finally:
        ray.shutdown()
        cluster.shutdown()
