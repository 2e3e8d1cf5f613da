"""The engine under every scheduler policy returns exactly what batch beam search (FIXED) returns."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from raymt.workers.config import ModelConfig, PruningConfig, SearchConfig
from raymt.workers.model.model import MarianModel
from raymt.workers.decoder.scheduler import CapacityUnit, Policy, SchedulerConfig
from raymt.workers.model.cache import KVCache
from raymt.workers.decoder.engine import Engine, StaticStep
from tests.workers.reference_decoding import beam_search
from raymt.workers.kernels.native import load as load_native
from raymt.workers.model.step_ops import NativeOps

pytestmark = pytest.mark.usefixtures("one_thread")
V, PAD, EOS = 60, 59, 0


@pytest.fixture(scope="module")
def model() -> MarianModel:
    torch.manual_seed(3)
    m = MarianModel(ModelConfig(vocab_size=V, decoder_vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
                                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                decoder_ffn_dim=64, pad_token_id=PAD, decoder_start_token_id=PAD)).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.requires_grad and "layer_norm" not in name:
                p.normal_(0, 0.15)
        m.final_logits_bias[0, EOS] = 4.0  # a mix of early EOS (lengths 1..12) and length-capped outputs
    return m


@pytest.fixture(scope="module")
def sources() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 14, (40,), generator=gen).tolist()
    return [torch.randint(1, PAD, (n - 1,), generator=gen).tolist() + [EOS] for n in lengths]


def batch_reference(model, sources, cfg, batch_size: int = 7):
    out = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start: start + batch_size]
        s = max(map(len, chunk))
        ids = torch.full((len(chunk), s), PAD, dtype=torch.long)
        mask = torch.zeros_like(ids, dtype=torch.bool)
        for i, x in enumerate(chunk):
            ids[i, : len(x)], mask[i, : len(x)] = torch.tensor(x), True
        out += beam_search(model, ids, mask, cfg)
    return out


def same(a, b) -> bool:
    return all([h.tokens for h in x] == [h.tokens for h in y] and
               all(abs(h.score - g.score) < 1e-4 for h, g in zip(x, y)) for x, y in zip(a, b))


SEARCH = SearchConfig(beam_size=4, num_hypotheses=2, max_length_a=1.0, max_length_b=3, max_decoding_length=16)


@pytest.mark.parametrize("policy, unit, capacity", [
    (Policy.FIXED, CapacityUnit.SENTENCES, 6), (Policy.VAR_STREAM, CapacityUnit.SENTENCES, 6),
    (Policy.FIFO, CapacityUnit.BEAMS, 14), (Policy.TOPUP, CapacityUnit.SENTENCES, 6),
    (Policy.TOPUP, CapacityUnit.TOKENS, 40)])
def test_every_policy_equals_batch_beam_search(model, sources, policy, unit, capacity):
    sched = SchedulerConfig(policy=policy, max_batch_sentences=6, capacity=capacity, capacity_unit=unit,
                            epsilon=1 / 3, flush_every=5)
    decoder = Engine(model, SEARCH, sched, forced_eos=True)
    streamed = decoder.decode(sources)
    assert same(streamed, batch_reference(model, sources, SEARCH))
    caps = [SEARCH.max_length_for(len(x)) for x in sources]
    natural = sum(len(r[0].tokens) < cap for r, cap in zip(streamed, caps))
    assert 5 <= natural <= len(sources) - 5  # both paths exercised: EOS before the cap, and capped
    stats = decoder.stats.scheduler
    assert stats.steps == len(stats.batch_sizes) and stats.refills >= 1
    assert max(stats.batch_sizes) <= 6


def test_var_stream_equals_var_batch_with_pruning(model, sources):
    cfg = replace(SEARCH, pruning=PruningConfig(ap=1.5, mc=2))
    var_batch = Engine(model, cfg, SchedulerConfig(policy=Policy.VAR_BATCH, max_batch_sentences=6,
                                                          capacity=6)).decode(sources)
    var_stream = Engine(model, cfg, SchedulerConfig(policy=Policy.VAR_STREAM, max_batch_sentences=6,
                                                           capacity=6, epsilon=1 / 6)).decode(sources)
    assert same(var_stream, var_batch)
    assert same(var_batch, batch_reference(model, sources, cfg))


def test_stream_with_shortlist_of_whole_vocabulary_is_unchanged(model, sources):
    sched = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=5, capacity=5)
    plain = Engine(model, SEARCH, sched).decode(sources[:12])
    listed = Engine(model, SEARCH, sched, candidates=torch.arange(V)).decode(sources[:12])
    assert same(plain, listed)


def test_five_hundred_sentences_stream_equals_batch(model):
    """Exactness: VAR-STREAM == VAR-BATCH and FIXED-STREAM == FIXED on >= 500 sentences."""
    gen = torch.Generator().manual_seed(7)
    lengths = torch.randint(2, 12, (500,), generator=gen).tolist()
    sources = [torch.randint(1, PAD, (n - 1,), generator=gen).tolist() + [EOS] for n in lengths]
    cfg = SearchConfig(beam_size=3, max_length_a=1.0, max_length_b=2, max_decoding_length=12)
    pruned = replace(cfg, pruning=PruningConfig(delta=1.5, mc=2))
    sched = SchedulerConfig(max_batch_sentences=16, capacity=16, epsilon=1 / 6)
    fixed = batch_reference(model, sources, cfg, batch_size=16)
    fixed_stream = Engine(model, cfg, replace(sched, policy=Policy.TOPUP)).decode(sources)
    var_batch = Engine(model, pruned, replace(sched, policy=Policy.VAR_BATCH)).decode(sources)
    var_stream = Engine(model, pruned, replace(sched, policy=Policy.VAR_STREAM)).decode(sources)
    assert same(fixed_stream, fixed)
    assert same(var_stream, var_batch)


def test_unfilled_self_attention_storage_is_never_read(model, sources, monkeypatch):
    """With the native kernels the cache is not zeroed (each row reads exactly its own written
    prefix); poison the unwritten storage with NaN: the output still equals batch beam search."""
    kernels = load_native()
    if kernels is None:
        pytest.skip("native decode operators could not be built here")
    expected = batch_reference(model, sources, SEARCH)
    empty = KVCache.empty.__func__

    def poisoned(cls, **kwargs):
        cache = empty(cls, **kwargs)
        assert not cache.zeroed
        cache.self_k.fill_(float("nan"))
        cache.self_v.fill_(float("nan"))
        return cache

    monkeypatch.setattr(KVCache, "empty", classmethod(poisoned))
    monkeypatch.setattr(model.model.decoder, "ops", NativeOps(kernels))
    sched = SchedulerConfig(policy=Policy.VAR_STREAM, max_batch_sentences=6, capacity=6,
                            epsilon=1 / 3, flush_every=3)  # flushes: rows at different positions share steps
    assert same(Engine(model, SEARCH, sched).decode(sources), expected)


@pytest.mark.parametrize("policy, unit, capacity, backend", [
    (Policy.FIXED, CapacityUnit.SENTENCES, 6, "aten"), (Policy.VAR_STREAM, CapacityUnit.SENTENCES, 6, "aten"),
    (Policy.FIFO, CapacityUnit.BEAMS, 14, "aten"), (Policy.TOPUP, CapacityUnit.SENTENCES, 6, "aten"),
    (Policy.VAR_STREAM, CapacityUnit.SENTENCES, 6, "native"), (Policy.TOPUP, CapacityUnit.TOKENS, 40, "native")])
def test_the_static_step_decodes_as_the_dynamic_one(model, sources, policy, unit, capacity, backend, monkeypatch):
    """One step shape (every slot's rows, full capacity: what a CUDA graph replays), run eagerly:
    the same hypotheses as the dynamic step, under every policy, with pruning, and at beam 1; read
    back every step, or every third (finished sentences frozen on the device until then), and each
    readback read one step late."""
    if backend == "native":
        kernels = load_native()
        if kernels is None:
            pytest.skip("native decode operators could not be built here")
        monkeypatch.setattr(model.model.decoder, "ops", NativeOps(kernels))
    sched = SchedulerConfig(policy=policy, max_batch_sentences=6, capacity=capacity, capacity_unit=unit,
                            epsilon=1 / 3, flush_every=5)
    pruned = replace(SEARCH, pruning=PruningConfig(rp=0.6))
    for cfg in (SEARCH, pruned, replace(SEARCH, beam_size=1, num_hypotheses=1)):
        engine = Engine(model, cfg, sched)
        dynamic = engine.decode(sources)
        static = Engine(model, cfg, sched, static=StaticStep())
        assert same(static.decode(sources), dynamic)
        assert static.stats.syncs == static.stats.steps + cfg.pruning.active
        assert static.stats.pruned == engine.stats.pruned  # (slots not planned discard nothing that counts)
        deferred = Engine(model, cfg, sched, static=StaticStep(readback_every=3))
        assert same(deferred.decode(sources), dynamic)
        reads = deferred.stats.syncs - cfg.pruning.active
        assert abs(reads - deferred.stats.steps / 3) <= 2  # (earlier only when no sentence can run)
        for every in (1, 3):  # each readback read one step late, after the next step is queued
            late = Engine(model, cfg, sched,
                          static=StaticStep(readback_every=every, late=True))
            assert same(late.decode(sources), dynamic)
            assert late.stats.pruned == engine.stats.pruned


def test_a_deferred_readback_comes_early_once_every_sentence_is_at_its_cap(model, sources):
    """Readback every 50 steps, sentences capped at 3 tokens: the host knows they are all done after
    their third step and reads back at once instead of running 47 frozen steps."""
    cfg = replace(SEARCH, max_length_a=0.0, max_length_b=3)
    sched = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=8, capacity=8)
    dynamic = Engine(model, cfg, sched).decode(sources)
    for late in (False, True):
        engine = Engine(model, cfg, sched, static=StaticStep(readback_every=50, late=late))
        assert same(engine.decode(sources), dynamic)
        assert all(len(h[0].tokens) <= 3 for h in dynamic)
        assert engine.stats.steps <= (4 + late) * len(sources) / 8 * 2  # (each batch: 3 steps + the readback's)
    with pytest.raises(ValueError, match="readback_every"):
        StaticStep(readback_every=0)


@pytest.mark.parametrize("policy, every, late", [(Policy.TOPUP, 1, False), (Policy.TOPUP, 4, False),
                                                (Policy.VAR_STREAM, 2, False), (Policy.TOPUP, 4, True)])
def test_the_device_advances_the_static_indices_as_the_host_would_build_them(model, sources, policy, every, late,
                                                                              monkeypatch):
    """Between plan changes the static step advances its own index buffer (``StaticIndices.advance``);
    at every such step the buffer equals what the host would have built, caps reached included."""
    from raymt.workers.decoder.static_step import StaticIndices

    build, checked = StaticIndices.step_index, []

    def checking(self, plan, requests, slot_of):
        advanced = self.advanced
        index = build(self, plan, requests, slot_of)
        if self.advanced > advanced:  # taken from the device: build it on the host too
            host = StaticIndices(self.slots, self.k, self.scratch, self.s, self.forced_eos, self.buffer.device,
                                 self.to_device)
            host.step_index(plan, requests, slot_of)
            assert torch.equal(host.buffer, self.buffer)
            checked.append(plan.expand)
        return index

    monkeypatch.setattr(StaticIndices, "step_index", checking)
    cfg = replace(SEARCH, max_length_a=0.0, max_length_b=9)  # (some sentences end at the cap)
    sched = SchedulerConfig(policy=policy, max_batch_sentences=6, capacity=6)
    dynamic = Engine(model, cfg, sched).decode(sources)
    engine = Engine(model, cfg, sched, static=StaticStep(readback_every=every, late=late))
    assert same(engine.decode(sources), dynamic)
    assert any(len(h[0].tokens) == 9 for h in dynamic)
    assert len(checked) == engine._static.advanced > engine.stats.steps / 4  # most steps built nothing on the host
