"""Autoscaling runs on Ray's fake multi-node autoscaler (``ray.cluster_utils.AutoscalingCluster``)
and a node removed mid-job (``ray.cluster_utils.Cluster``): no row lost or duplicated."""
from __future__ import annotations

import threading
import time

from raymt.jobs.translate import main
from raymt.pipeline.outputs.sink import OutputStore
from tests.pipeline.ray_helpers import assert_exactly_once, clean_corpus, write_corpus


class LocalAutoscalingCluster:
    """``AutoscalingCluster`` with its config built here (the wheel lacks the example YAML it reads)."""

    def __new__(cls, head_cpus: int, worker_cpus: int, max_workers: int):
        from ray.cluster_utils import AutoscalingCluster

        class _Cluster(AutoscalingCluster):
            def _generate_config(self, head_resources, worker_node_types, autoscaler_v2=False, **kwargs):
                return {
                    "cluster_name": "raymt-fake", "max_workers": max_workers,
                    "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                                 "disable_node_updaters": True, "disable_launch_config_check": True},
                    "available_node_types": {
                        "ray.head.default": {"resources": dict(head_resources), "node_config": {}, "max_workers": 0},
                        **worker_node_types},
                    "head_node_type": "ray.head.default", "auth": {}, "upscaling_speed": 1.0,
                    "idle_timeout_minutes": 0.1, "docker": {}, "initialization_commands": [], "setup_commands": [],
                    "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
                    "worker_start_ray_commands": [], "file_mounts": {}, "cluster_synced_files": [],
                    "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": []}

        workers = {"ray.worker.cpu": {"resources": {"CPU": worker_cpus, "object_store_memory": 200 * 2**20},
                                      "node_config": {}, "min_workers": 0, "max_workers": max_workers}}
        return _Cluster(head_resources={"CPU": head_cpus, "object_store_memory": 200 * 2**20},
                        worker_node_types=workers)


def decoding_nodes(out) -> set[str]:
    stats = OutputStore(str(out)).read_stats() if out.exists() else None
    return set(stats.column("node").to_pylist()) if stats is not None else set()


def job(model, src, out, *extra) -> list[str]:
    return ["--model", str(model), "--input", str(src), "--output", str(out), "--beam-size", "2", "--threads", "1",
            "--unit-rows", "10", *extra]


def test_job_started_on_one_node_grows_onto_added_nodes(demo_model_dir, tmp_path):
    import ray
    cluster = LocalAutoscalingCluster(head_cpus=1, worker_cpus=1, max_workers=2)
    cluster.start()
    try:
        ray.init(address="auto", log_to_driver=False)
        assert ray.cluster_resources().get("CPU") == 1  # one node when the job starts
        src = write_corpus(tmp_path / "in.parquet", clean_corpus(400))
        main(job(demo_model_dir, src, tmp_path / "out", "--min-decoders", "1", "--max-decoders", "3"))
        assert_exactly_once(str(tmp_path / "out"), [f"r{i:04d}" for i in range(400)])
        stats = OutputStore(str(tmp_path / "out")).read_stats().to_pylist()
        assert len({s["actor"] for s in stats}) >= 2, "decoders were added as nodes joined"
        assert len({s["node"] for s in stats}) >= 2
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_node_removed_mid_job_loses_no_rows(demo_model_dir, tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    doomed = cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        cluster.wait_for_nodes()
        src = write_corpus(tmp_path / "in.parquet", clean_corpus(600))
        out = tmp_path / "out"
        errors: list[BaseException] = []

        def run() -> None:
            try:
                main(job(demo_model_dir, src, out, "--decoders", "3"))
            except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
                errors.append(e)

        driver = threading.Thread(target=run)
        driver.start()
        deadline = time.time() + 300
        while doomed.node_id not in decoding_nodes(out):  # the node has done work, and has more queued
            assert time.time() < deadline and driver.is_alive(), errors
            time.sleep(0.2)
        cluster.remove_node(doomed)
        driver.join(timeout=400)
        assert not driver.is_alive() and not errors, errors
        assert_exactly_once(str(out), [f"r{i:04d}" for i in range(600)])
        assert len(decoding_nodes(out)) == 3
    finally:
        ray.shutdown()
        cluster.shutdown()
