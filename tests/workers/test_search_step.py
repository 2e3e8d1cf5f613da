"""The search-step contract (``workers/search/search_step.py``): every backend gives the reference's outcome,
and sampling, built on the reference, draws from the model's distribution, reproducibly per sentence.
"""
from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from raymt.workers.decoder import engine as engine_module
from raymt.workers.search import search_step
from raymt.workers.config import (MAX_SAMPLING_TEMPERATURE, MIN_SAMPLING_TEMPERATURE, PruningConfig, SamplingConfig,
                                  SearchConfig)
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.engine import StaticStep
from raymt.workers.search.sampling import draw, lane_hashes, sample_candidates, sentence_key, uniforms
from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
from raymt.workers.search.selection import RowTop
from raymt.workers.kernels.speedups import CpuSpeedups
from raymt.workers.decoder.core_decoder import CoreDecoder

TEXTS = ["Ein Hund rennt über die Wiese.", "Zwei Männer spielen Fußball im Park.", "Eine Frau liest ein Buch.",
         "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.", "Ein Mann schläft.", "Leute stehen vor einem Gebäude."]
TOPUP = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=2, capacity=2)


@pytest.fixture(scope="module")
def translator(demo_model_dir, one_thread):
    return CoreDecoder.load(str(demo_model_dir), max_batch_size=3)


@pytest.fixture(scope="module")
def sources(translator):
    return translator.encode(TEXTS)


def decode(translator, sources, cfg, batching=None, static=None):
    return [[(h.tokens, h.log_prob) for h in hs]
            for hs in translator.decode_ids(sources, DecodeRequest(cfg, schedule=batching, static=static)).hypotheses]


def assert_same(got, want):
    assert [[t for t, _ in hs] for hs in got] == [[t for t, _ in hs] for hs in want]
    assert all(abs(a - b) < 1e-4 for g, w in zip(got, want) for (_, a), (_, b) in zip(g, w))


BACKENDS = [("native", SearchConfig(beam_size=4, num_hypotheses=2)),
            ("native", SearchConfig(beam_size=1)),
            ("native", SearchConfig(beam_size=4, pruning=PruningConfig(rp=0.6, mc=2))),
            ("native", SearchConfig(beam_size=3, early_stopping=True, length_penalty=0.6)),
            ("greedy", SearchConfig(beam_size=1)),
            ("greedy", SearchConfig(beam_size=1, length_penalty=0.0))]


@pytest.mark.parametrize("backend, cfg", BACKENDS, ids=lambda x: x if isinstance(x, str) else x.signature())
def test_every_backend_gives_the_reference_outcome(translator, sources, monkeypatch, backend, cfg):
    """One test for each step against the reference (``reference_step``), same inputs and search."""
    model = translator.checkpoint.model
    if backend == "native" and model.ops.beam_kernel is None:
        pytest.skip("the native beam step is not built here")
    monkeypatch.setattr(engine_module, "choose_step", lambda *a: getattr(search_step, f"{backend}_step"))
    fast = decode(translator, sources, cfg, TOPUP)
    monkeypatch.setattr(engine_module, "choose_step", lambda *a: search_step.reference_step)
    assert_same(fast, decode(translator, sources, cfg, TOPUP))


def test_choose_step_decides_once_by_search_and_device(translator):
    model = translator.checkpoint.model
    native = model.ops.beam_kernel is not None
    beam1 = SearchConfig(beam_size=1)
    assert search_step.choose_step(model, beam1, False).__name__ == ("native_step" if native else "greedy_step")
    assert search_step.choose_step(model, beam1, True) is search_step.reference_step  # a static step
    sampled = SearchConfig(beam_size=2, sampling=SamplingConfig())
    assert search_step.choose_step(model, sampled, False) is search_step.reference_step


# ---------------------------------------------------------------- sampling


def test_uniforms_are_uniform_and_fixed_by_their_inputs():
    keys = torch.tensor([sentence_key(0, [5, 6, 7]), sentence_key(1, [5, 6, 7])])
    tokens = torch.arange(20_000)
    u = uniforms(lane_hashes(keys, torch.tensor(0), torch.tensor(3)), tokens)  # (2, 20000)
    assert u.dtype == torch.float32 and 0.0 < float(u.min()) and float(u.max()) < 1.0
    assert bool(torch.isfinite(-torch.log(-torch.log(u))).all())  # (the Gumbel noise is finite)
    for row in (u[0], uniforms(lane_hashes(keys[0], torch.arange(20_000), torch.tensor(3)), torch.tensor([[7]]))[:, 0]):
        counts = torch.histc(row, bins=10, min=0.0, max=1.0)  # 2,000 expected a bin, sd ~42: by token, by lane
        assert float((counts - 2000).abs().max()) < 200
    assert not torch.equal(u[0], u[1])  # another seed, other draws
    assert torch.equal(u, uniforms(lane_hashes(keys, torch.tensor(0), torch.tensor(3)), tokens))
    other_step = uniforms(lane_hashes(keys, torch.tensor(0), torch.tensor(4)), tokens)
    assert float((other_step == u).float().mean()) < 0.01
    assert sentence_key(0, [5, 6, 7]) != sentence_key(0, [5, 6, 7], forced_first=9)  # another target language
    h = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1])  # (the int32 hash: the int64 one's bits)
    want = h[:, None] ^ torch.tensor([[0, 5, 2**20]])
    for m, shift in ((0x7FEB352D, 16), (0x2C1B3C6D, 15)):
        want = ((want ^ (want >> shift)) * m) & 0xFFFFFFFF
    want = want ^ (want >> 16)
    assert torch.equal(uniforms(h, torch.tensor([0, 5, 2**20])), ((want >> 9) * 2 + 1).float() / 2**24)


@pytest.mark.parametrize("cfg", [SamplingConfig(), SamplingConfig(temperature=0.5), SamplingConfig(temperature=2.0),
                                 SamplingConfig(topp=0.7), SamplingConfig(temperature=0.8, topp=0.9)])
def test_draws_follow_the_tempered_truncated_softmax(cfg):
    """40,000 draws over 6 tokens: each token's frequency within 0.012 of its probability (> 5 sd)."""
    lp = torch.log_softmax(torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -3.0]), 0)
    scaled = lp / cfg.temperature
    p = torch.softmax(scaled, 0)
    keep = (p.cumsum(0) - p) < cfg.topp
    want = torch.softmax(scaled.masked_fill(~keep, float("-inf")), 0)
    n = 40_000
    u = uniforms(lane_hashes(torch.tensor(12345), torch.arange(n), torch.tensor(1)), torch.arange(6))
    got = torch.bincount(draw(lp.expand(n, 6), u, cfg), minlength=6).double() / n
    assert float((got - want).abs().max()) < 0.012, (got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_draws_at_the_temperature_bounds_are_greedy_and_uniform(dtype):
    """The coldest temperature draws the best token, even 2e-3 nats ahead; the hottest draws the
    possible tokens uniformly and never an impossible one; a row with nothing possible draws 0."""
    n = 40_000
    u = uniforms(lane_hashes(torch.tensor(777), torch.arange(n), torch.tensor(2)), torch.arange(7))  # (n, 7)
    cold = SamplingConfig(temperature=MIN_SAMPLING_TEMPERATURE)
    near_tie = torch.tensor([-0.7, -0.702, -1.0, float("-inf")], dtype=dtype)
    assert bool((draw(near_tie.expand(n, 4), u[:, :4], cold) == 0).all())
    lp = torch.log_softmax(torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -30.0, float("-inf")]), 0).to(dtype)
    assert bool((draw(lp.expand(n, 7), u, cold) == 0).all())
    below = SimpleNamespace(temperature=1e-40, topp=1.0)  # (past the bounds, where x / T overflows: still greedy)
    assert bool((draw(lp.expand(n, 7), u, below) == 0).all())
    for topp in (1.0, 0.5):  # (a nucleus cut at the hottest temperature: the mass is spread evenly)
        hot = torch.bincount(draw(lp.expand(n, 7), u, SamplingConfig(temperature=MAX_SAMPLING_TEMPERATURE, topp=topp)),
                             minlength=7).double() / n
        kept = 6 if topp == 1.0 else 3
        assert float(hot[kept:].sum()) == 0.0 and float((hot[:kept] - 1 / kept).abs().max()) < 0.012, hot
    nothing = torch.full((3, 5), float("-inf"), dtype=dtype)
    for t in (MIN_SAMPLING_TEMPERATURE, MAX_SAMPLING_TEMPERATURE):
        assert draw(nothing, u[:3, :5], SamplingConfig(temperature=t)).tolist() == [0, 0, 0]


def test_sample_candidates_lanes_start_from_lane_zero_and_finished_lanes_stay_empty():
    top = RowTop(torch.log_softmax(torch.randn(3, 5), 1).sort(1, descending=True).values,
                 torch.arange(15).view(3, 5))
    running = torch.tensor([[0.0, float("-inf"), float("-inf")], [-1.0, -2.0, float("-inf")]])
    grid = torch.tensor([0, 3, 4])  # sentence 0: lane 0 runs (first step); sentence 1: lanes 0 and 1
    cands = sample_candidates(top, grid, running, torch.tensor([1, 5]), torch.tensor([7, 8]), SamplingConfig())
    assert cands.beams.tolist() == [[0, 0, 0], [0, 1, 2]]
    assert bool(torch.isfinite(cands.scores[0]).all()) and bool(torch.isinf(cands.scores[1, 2]))
    assert cands.tokens[0].tolist() != [] and all(0 <= t < 5 for t in cands.tokens[0].tolist())
    assert all(5 <= t < 10 for t in cands.tokens[1, :1].tolist())  # lane 0 of sentence 1 draws from row 1


def test_top_k_one_and_a_cold_temperature_are_greedy(translator, sources):
    greedy = decode(translator, sources, SearchConfig(beam_size=1))
    top1 = decode(translator, sources, SearchConfig(beam_size=3, num_hypotheses=3, sampling=SamplingConfig(topk=1)))
    assert [[t for t, _ in hs] for hs in top1] == [[hs[0][0]] * 3 for hs in greedy]
    cold = decode(translator, sources, SearchConfig(beam_size=2, num_hypotheses=1,
                                                    sampling=SamplingConfig(temperature=MIN_SAMPLING_TEMPERATURE,
                                                                            seed=4)))
    assert_same(cold, greedy)


def test_the_hottest_temperature_decodes_valid_tokens(translator, sources):
    """Nearly uniform draws: finite scores, tokens of the target vocabulary, never <pad>, each
    sample ended by EOS or by the length cap."""
    mc = translator.checkpoint.model.config
    cfg = SearchConfig(beam_size=3, num_hypotheses=3, max_length_a=0.0, max_length_b=12,
                       sampling=SamplingConfig(temperature=MAX_SAMPLING_TEMPERATURE, seed=6))
    hot = decode(translator, sources, cfg)
    assert [len(hs) for hs in hot] == [3] * len(sources)
    for tokens, log_prob in (h for hs in hot for h in hs):
        assert math.isfinite(log_prob) and 1 <= len(tokens) <= 12
        assert all(0 <= t < mc.decoder_vocab_size and t != mc.pad_token_id for t in tokens)
        assert tokens[-1] == mc.eos_token_id or len(tokens) == 12
    greedy = decode(translator, sources, SearchConfig(beam_size=1, max_length_a=0.0, max_length_b=12))
    assert [hs[0][0] for hs in hot] != [hs[0][0] for hs in greedy]  # (uniform draws, not the model's best)


def test_first_tokens_follow_the_models_own_probabilities(translator):
    """At temperature 1 a sentence's first token is drawn with the model's probability: capped at
    two tokens (the second a forced EOS at log-prob 0), each sample's log-prob is its first token's,
    so 1,600 samples (32 lanes x 50 seeds) compare with the model's own numbers."""
    src = translator.encode(["Ein Hund."])
    cfg = SearchConfig(beam_size=32, num_hypotheses=32, max_length_a=0.0, max_length_b=2)
    seen: Counter = Counter()
    prob: dict[int, float] = {}
    for seed in range(50):
        from dataclasses import replace
        for h in translator.decode_ids(src, DecodeRequest(replace(cfg, sampling=SamplingConfig(seed=seed)))).hypotheses[0]:
            seen[h.tokens[0]] += 1
            prob[h.tokens[0]] = math.exp(h.log_prob)
    n = sum(seen.values())
    assert n == 1600
    for token, p in prob.items():
        if p > 0.02:
            assert abs(seen[token] / n - p) < 4 * math.sqrt(p * (1 - p) / n) + 0.005, (token, seen[token] / n, p)
    assert sum(prob.values()) > 0.5  # the draws cover most of the mass


@pytest.mark.parametrize("sampling", [SamplingConfig(seed=1), SamplingConfig(topk=10, temperature=0.8, seed=2),
                                      SamplingConfig(topp=0.9, seed=3)])
def test_a_sentences_samples_do_not_depend_on_its_neighbours_or_the_step(translator, sources, sampling):
    """Alone, in batches, streamed two at a time, and in the static step (eager here): the same samples
    (Gumbel-max keyed by token: the few 1e-6 batch shapes move the probabilities by change a draw
    only where two noisy scores tie that closely; an inverse-CDF draw flipped here between tokens
    1421 and 1422)."""
    cfg = SearchConfig(beam_size=3, num_hypotheses=3, sampling=sampling)
    together = decode(translator, sources, cfg)
    assert_same([decode(translator, [s], cfg)[0] for s in sources], together)
    assert_same(decode(translator, sources, cfg, TOPUP), together)
    assert_same(decode(translator, sources, cfg, TOPUP, static=StaticStep(readback_every=2)), together)
    other = decode(translator, sources, SearchConfig(beam_size=3, num_hypotheses=3,
                                                     sampling=SamplingConfig(seed=sampling.seed + 100)))
    assert [[t for t, _ in hs] for hs in other] != [[t for t, _ in hs] for hs in together]
    assert len({t for hs in together for t, _ in hs}) > len(sources)  # lanes differ


def test_sampling_runs_on_the_int8_kernels(demo_model_dir, one_thread):
    """int8 quantises each step's activations per batch, so its outputs (beam search's too) may move
    with a sentence's neighbours; within the same batches top-k 1 is its greedy decode."""
    int8 = CoreDecoder.load(str(demo_model_dir), speedups=CpuSpeedups(int8=True))
    src = int8.encode(TEXTS)
    greedy = decode(int8, src, SearchConfig(beam_size=1))
    top1 = decode(int8, src, SearchConfig(beam_size=1, sampling=SamplingConfig(topk=1, seed=5)))
    assert [[t for t, _ in hs] for hs in top1] == [[t for t, _ in hs] for hs in greedy]
    drawn = decode(int8, src, SearchConfig(beam_size=2, num_hypotheses=2, sampling=SamplingConfig(seed=5)))
    assert all(len(hs) == 2 for hs in drawn)


def test_sampling_refuses_pruning():
    with pytest.raises(ValueError, match="pruning"):
        SearchConfig(beam_size=2, pruning=PruningConfig(rp=0.5), sampling=SamplingConfig())
    for bad in (dict(temperature=0.0), dict(topk=-1), dict(topp=0.0), dict(topp=1.5)):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)
