"""The one decoder on a CUDA device (``-m gpu``; on a GPU machine without ``../shared``
the data is copied in and named by ``RAYMT_SHARED_DATA``). CI has no GPU: these are skipped there, and the
same decode code is covered on the CPU and under the meta device (test_device.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import sacrebleu
import torch

from tests.conftest import shared_path
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
from raymt.workers.kernels.speedups import CpuSpeedups
from raymt.workers.model.step_ops import ATEN
from raymt.workers.decoder.core_decoder import CoreDecoder

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def lines(n: int) -> tuple[list[str], list[str]]:
    src = shared_path("multi30k", "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:n]
    ref = shared_path("multi30k", "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[:n]
    return src, ref


@pytest.fixture(scope="module")
def cpu(demo_model_dir) -> CoreDecoder:
    return CoreDecoder.load(str(demo_model_dir), speedups=CpuSpeedups())


@pytest.fixture(scope="module")
def cuda(demo_model_dir) -> CoreDecoder:
    return CoreDecoder.load(str(demo_model_dir), device="cuda")


@pytest.mark.parametrize("policy", [None, Policy.TOPUP, Policy.VAR_STREAM])
def test_float32_on_cuda_translates_as_on_the_cpu(cpu, cuda, policy):
    src, _ = lines(128)
    batching = None if policy is None else SchedulerConfig(policy=policy, max_batch_sentences=32, capacity=32)
    on_cpu = [t.text for t in cpu.translate(src, SearchConfig(beam_size=5), batching=batching)]
    on_gpu = [t.text for t in cuda.translate(src, SearchConfig(beam_size=5), batching=batching)]
    same = sum(a == b for a, b in zip(on_cpu, on_gpu))
    assert same >= 0.97 * len(src), f"{same}/{len(src)} identical"  # float summation order differs
    assert cuda.checkpoint.model.device.type == "cuda"


@pytest.mark.parametrize("opts, dtype", [(CpuSpeedups(bf16=True), torch.bfloat16), (CpuSpeedups(fp16=True), torch.float16)])
def test_half_precision_bleu_within_half_a_point_of_float32(cpu, demo_model_dir, opts, dtype):
    src, ref = lines(500)
    half = CoreDecoder.load(str(demo_model_dir), device="cuda", speedups=opts)
    assert next(half.checkpoint.model.parameters()).dtype == dtype
    cfg = SearchConfig(beam_size=5)
    base = sacrebleu.corpus_bleu([t.text for t in cpu.translate(src, cfg)], [ref]).score
    score = sacrebleu.corpus_bleu([t.text for t in half.translate(src, cfg)], [ref]).score
    assert abs(score - base) <= 0.5, (base, score)


def test_one_readback_per_step_on_cuda(cuda):
    src, _ = lines(64)
    stats = cuda.decode_ids(cuda.encode(src), DecodeRequest(SearchConfig(beam_size=5))).stats
    assert stats.syncs == stats.steps  # pruning off: exactly the step's one readback


def test_the_decoder_worker_decodes_on_its_gpu(demo_model_dir, tmp_path):
    from raymt.pipeline.orchestration.actors import DecoderSettings, DecoderWorker
    from raymt.workers.decoder.decode_config import DecodeConfig, RuntimeConfig
    from raymt.pipeline.orchestration.units import Columns

    settings = DecoderSettings(model=str(demo_model_dir), output=str(tmp_path / "out"), signature="gpu-test",
                               decode=DecodeConfig(SearchConfig(beam_size=2), runtime=RuntimeConfig(device="cuda")))
    worker = DecoderWorker(settings, Columns("text", None, None))
    assert worker.translator.checkpoint.model.device.type == "cuda"
    auto = replace(settings, decode=replace(settings.decode, runtime=RuntimeConfig(device="auto")))
    worker = DecoderWorker(auto, Columns("text", None, None))
    assert worker.translator.checkpoint.model.device.type == "cuda"  # auto picks the GPU where there is one


def test_the_static_step_on_cuda_decodes_as_the_dynamic_one(cuda, demo_model_dir, monkeypatch):
    """Graph replay equals the same static step run eagerly, token for token (the same shapes, the
    same kernels); the static step equals the dynamic one but for rare near-ties (other row counts
    per step: cuBLAS may sum in another order). Replays are counted on torch's graph class; the
    eager run swaps the graph wrapper (``GraphedStep``, wherever the engine's modules hold it) for
    one that runs every step, in a translator of its own (a translator keeps its captured steps)."""
    import importlib

    from raymt.workers.decoder.engine import StaticStep

    class Eager:
        graph = None

        def run(self, step):
            return step()

    replays, replay = [0], torch.cuda.CUDAGraph.replay

    def counted(graph):
        replays[0] += 1
        return replay(graph)

    src, _ = lines(96)
    sources, cfg = cuda.encode(src), SearchConfig(beam_size=5)
    sched = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=32, capacity=32)
    dynamic = [h[0].tokens for h in cuda.decode_ids(sources, DecodeRequest(cfg, schedule=sched)).hypotheses]
    for every, late in ((1, False), (4, False), (4, True)):  # (late: read back through pinned memory, a step on)
        static = StaticStep(readback_every=every, late=late)
        with monkeypatch.context() as m:
            m.setattr(torch.cuda.CUDAGraph, "replay", counted)
            decoded = cuda.decode_ids(sources, DecodeRequest(cfg, schedule=sched, static=static))
        replayed = [h[0].tokens for h in decoded.hypotheses]
        assert replays[0] > 0, "the static step was never replayed from a graph"
        replays[0] = 0
        with monkeypatch.context() as m:  # the same static step, every step run eagerly
            for name in ("engine", "runner"):
                try:
                    module = importlib.import_module(f"raymt.workers.{name}")
                except ImportError:
                    continue
                if hasattr(module, "GraphedStep"):
                    m.setattr(module, "GraphedStep", Eager)
            eager_translator = CoreDecoder.load(str(demo_model_dir), device="cuda")
            eager = [h[0].tokens for h in eager_translator.decode_ids(sources, DecodeRequest(cfg, schedule=sched,
                                                                                          static=static)).hypotheses]
        assert replays[0] == 0 and eager == replayed  # replay = eager, token for token
        assert sum(a == b for a, b in zip(replayed, dynamic)) >= 0.97 * len(src)
        assert decoded.stats.syncs <= decoded.stats.steps / every + 2


def test_a_gpu_decoder_gets_the_fused_triton_output_step(cuda):
    pytest.importorskip("triton", reason="Triton is not installed on this GPU machine")
    from raymt.workers.kernels.triton_ops import TritonOps

    assert isinstance(cuda.checkpoint.model.ops, TritonOps)
    src, _ = lines(64)
    model, cfg = cuda.checkpoint.model, SearchConfig(beam_size=5)
    fused = [t.text for t in cuda.translate(src, cfg)]
    ops, model.model.decoder.ops = model.model.decoder.ops, ATEN
    try:
        aten = [t.text for t in cuda.translate(src, cfg)]
    finally:
        model.model.decoder.ops = ops
    same = sum(a == b for a, b in zip(fused, aten))
    assert same >= 0.97 * len(src), f"{same}/{len(src)} identical"  # summation order differs from ATen's


def test_staged_index_copies_survive_a_host_running_ahead_of_the_device():
    from raymt.workers.model.graphs import Staging

    staging = Staging.for_device(4, torch.device("cuda"), depth=2)
    copies = []
    for i in range(6):
        torch.cuda._sleep(20_000_000)  # the device lags the host, as under a deferred readback
        copies.append(staging.to_device(torch.full((4,), i, dtype=torch.long)))
    assert [c.tolist() for c in copies] == [[i] * 4 for i in range(6)]  # no buffer rewritten before its copy ran


def test_the_gpu_defaults_translate_as_the_dynamic_step_and_fit_memory(cuda, monkeypatch):
    """``raymt.jobs.translate --device cuda`` with no batching flags: 256 slots, the static step read back
    every 4 steps, top-up refilling at 5% empty (``raymt.workers.decoder.device.GPU_DEFAULTS``)."""
    from raymt.workers.model import graphs
    from raymt.workers.decoder.device import GPU_DEFAULTS as d
    from raymt.workers.decoder.engine import StaticStep

    src, _ = lines(1000)
    sources, cfg = cuda.encode(src), SearchConfig(beam_size=5)
    topup = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=d.max_batch_size, capacity=d.max_batch_size,
                            refill_threshold=d.refill_threshold)
    def same(a, b) -> int:
        return sum(x[0].tokens == y[0].tokens for x, y in zip(a.hypotheses, b.hypotheses))

    dynamic = cuda.decode_ids(sources, DecodeRequest(cfg, schedule=replace(topup, max_batch_sentences=32, capacity=32)))
    static = cuda.decode_ids(sources, DecodeRequest(cfg, schedule=topup,
                                                    static=StaticStep(readback_every=d.static_step)))
    # (other row counts per step: cuBLAS may sum in another order, so a rare near-tie may flip)
    assert same(static, dynamic) >= 0.99 * len(src), same(static, dynamic)
    monkeypatch.setattr(graphs, "free_memory", lambda device: 2**28)  # a small GPU: 256 MB free
    small = cuda.decode_ids(sources, DecodeRequest(cfg, schedule=topup,
                                                   static=StaticStep(readback_every=d.static_step)))
    assert max(small.stats.batch_sizes) < d.max_batch_size, max(small.stats.batch_sizes)  # fewer slots than asked for
    assert same(small, dynamic) >= 0.99 * len(src), same(small, dynamic)
