"""GPU decoder actors on a local Ray cluster that declares a GPU (runs without CUDA: the cluster
only declares the GPU): each actor gets the GPU Ray assigns it and decodes there, and where torch
cannot see that GPU the job fails at once with a clear error, never decoding on the CPU instead."""
from __future__ import annotations

import time

import pytest

from raymt.jobs.translate import main
from tests.pipeline.ray_helpers import clean_corpus, start_ray, write_corpus

pytestmark = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")


@pytest.fixture(scope="module")
def gpu_cluster():
    import ray
    address = start_ray(num_cpus=2, num_gpus=1)  # a declared GPU, no CUDA device behind it
    yield address
    ray.shutdown()


@pytest.mark.parametrize("flags", [["--gpus-per-decoder", "1"], ["--device", "cuda"]])
def test_a_gpu_actor_without_its_gpu_fails_at_once_naming_it(gpu_cluster, demo_model_dir, tmp_path, flags):
    src = write_corpus(tmp_path / "in.parquet", clean_corpus(5))
    start = time.time()
    with pytest.raises(SystemExit) as exit_:
        main(["--model", str(demo_model_dir), "--input", str(src), "--output", str(tmp_path / "out"),
              "--local-rows", "0", "--decoders", "1", *flags])
    err = str(exit_.value)
    assert "error: --device cuda: torch sees no CUDA device here" in err
    assert "refusing to decode on the CPU instead" in err
    assert "Ray assigned this actor GPU ids [0]" in err  # the actor got the GPU Ray placed it on
    assert time.time() - start < 90  # at once: no retries of a device that cannot appear


def test_the_cpu_device_on_a_gpu_cluster_decodes_on_the_cpu(gpu_cluster, demo_model_dir, tmp_path):
    src = write_corpus(tmp_path / "in.parquet", clean_corpus(5))
    main(["--model", str(demo_model_dir), "--input", str(src), "--output", str(tmp_path / "out"),
          "--local-rows", "0", "--decoders", "1"])
    assert (tmp_path / "out" / "_SUCCESS").exists()
