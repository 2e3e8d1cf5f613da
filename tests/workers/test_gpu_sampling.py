"""Sampling on a CUDA device (``-m gpu``): the same draws as on the CPU, the static step's CUDA graph
replaying the dynamic step's samples. CI has no GPU: the same code runs on the CPU in
``test_search_step.py`` (and the static step eagerly there)."""
from __future__ import annotations

import pytest
import torch

from raymt.workers.config import SamplingConfig, SearchConfig
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.engine import StaticStep
from raymt.workers.search.sampling import lane_hashes, sentence_key, uniforms
from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
from raymt.workers.decoder.core_decoder import CoreDecoder
from tests.conftest import shared_path

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TOPUP = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=32, capacity=32, refill_threshold=0.05)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return shared_path("multi30k", "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:96]


def tokens(translator: CoreDecoder, texts: list[str], cfg: SearchConfig, **kw) -> list[list[tuple[int, ...]]]:
    return [[h.tokens for h in hs] for hs in translator.decode_ids(translator.encode(texts), DecodeRequest(cfg, **kw)).hypotheses]


def test_the_uniforms_are_bit_equal_on_cuda():
    keys = torch.tensor([sentence_key(s, [1, 2, 3]) for s in range(8)])[:, None]
    lanes, steps = torch.arange(4096)[None, :], torch.tensor(7)
    tokens = torch.arange(58_101)
    on_cpu = uniforms(lane_hashes(keys, lanes, steps)[..., :8], tokens)  # (8, 8, 58101): int32 products wrap alike
    on_gpu = uniforms(lane_hashes(keys.cuda(), lanes.cuda(), steps.cuda())[..., :8], tokens.cuda())
    assert torch.equal(on_cpu, on_gpu.cpu())


@pytest.mark.parametrize("sampling", [SamplingConfig(seed=1), SamplingConfig(topk=10, seed=2),
                                      SamplingConfig(topp=0.9, temperature=0.8, seed=3)])
def test_samples_on_cuda_equal_the_cpus_and_the_graph_replays_them(demo_model_dir, texts, sampling):
    cfg = SearchConfig(beam_size=4, num_hypotheses=4, sampling=sampling)
    cpu = tokens(CoreDecoder.load(str(demo_model_dir)), texts, cfg, schedule=TOPUP)
    cuda = CoreDecoder.load(str(demo_model_dir), device="cuda")
    dynamic = tokens(cuda, texts, cfg, schedule=TOPUP)
    same = sum(a == b for a, b in zip(cpu, dynamic))  # a row: 4 samples of ~13 draws each
    assert same >= 0.9 * len(texts), f"{same}/{len(texts)} rows drew the same (float sums differ by device)"
    graphed = tokens(cuda, texts, cfg, schedule=TOPUP, static=StaticStep(readback_every=4))
    same = sum(a == b for a, b in zip(graphed, dynamic))  # (one shape for every slot: other GEMM kernels)
    assert same >= 0.97 * len(texts), f"{same}/{len(texts)} rows drew the same in the graph as in the dynamic step"


def test_top_k_one_on_cuda_is_greedy(demo_model_dir, texts):
    cuda = CoreDecoder.load(str(demo_model_dir), device="cuda")
    greedy = tokens(cuda, texts, SearchConfig(beam_size=1), schedule=TOPUP)
    top1 = tokens(cuda, texts, SearchConfig(beam_size=1, sampling=SamplingConfig(topk=1)), schedule=TOPUP)
    assert top1 == greedy
