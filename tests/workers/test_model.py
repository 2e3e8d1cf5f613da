"""``MarianModel`` incremental decoding against its own teacher-forced forward.

Rows of one step at different target positions, beams reordered through the cache's ancestry
(duplicated, permuted, dropped), and padded sources of different lengths must all give, row by row,
the logits of decoding that row alone with the full-sequence forward, with the ATen and the native
step backends alike.
"""
from __future__ import annotations

import pytest
import torch

from raymt.workers.config import ModelConfig
from raymt.workers.model.cache import EncodedBatch, KVCache
from raymt.workers.decoder.engine import prefix_mask
from raymt.workers.model.model import MarianModel
from raymt.workers.kernels.native import load as load_native
from raymt.workers.model.step_ops import ATEN, NativeOps

V, PAD, EOS = 40, 39, 0
ATOL = 1e-5

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model() -> MarianModel:
    cfg = ModelConfig(vocab_size=V, decoder_vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                      max_position_embeddings=64, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD)
    torch.manual_seed(0)
    m = MarianModel(cfg).eval()
    with torch.no_grad():
        m.final_logits_bias.normal_()
    return m


def rand_ids(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(1, PAD, (n,), generator=gen).tolist()


def batch(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded (B, S) ids and (B, S) bool mask."""
    s = max(len(r) for r in rows)
    ids = torch.full((len(rows), s), PAD)
    mask = torch.zeros((len(rows), s), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), True
    return ids, mask


def alone(model: MarianModel, src: list[int], tgt: list[int]) -> torch.Tensor:
    """Teacher-forced logits (T, V) of one row decoded by itself, no padding anywhere."""
    ids = torch.tensor([src])
    with torch.no_grad():
        return model(ids, torch.ones_like(ids, dtype=torch.bool), torch.tensor([tgt]))[0]


@pytest.fixture(scope="module")
def rows():
    """Four sentences: sources of different lengths, decoder inputs (start + tokens) of different lengths."""
    gen = torch.Generator().manual_seed(1)
    sources = [rand_ids(gen, n) + [EOS] for n in (9, 2, 5, 7)]
    targets = [[PAD] + rand_ids(gen, n) for n in (6, 2, 4, 5)]
    return sources, targets


@torch.no_grad()
def test_padded_sources_match_decoding_each_row_alone(model, rows):
    sources, targets = rows
    src, src_mask = batch(sources)
    tgt, _ = batch(targets)
    got = model(src, src_mask, tgt)
    memory = model.encode(src, src_mask)
    for r, (s, t) in enumerate(zip(sources, targets)):
        torch.testing.assert_close(got[r, : len(t)], alone(model, s, t), atol=ATOL, rtol=0)
        ids = torch.tensor([s])
        torch.testing.assert_close(memory[r, : len(s)], model.encode(ids, torch.ones_like(ids, dtype=torch.bool))[0],
                                   atol=ATOL, rtol=0)


class Steps:
    """Drives a model's ``KVCache`` step by step, as the engine does: ``beam`` rows per sentence (slot)."""

    def __init__(self, model: MarianModel, sources: list[list[int]], beam: int = 1, **cache_kwargs) -> None:
        self.model, self.beam = model, beam
        src, mask = batch(sources)
        self.cache = model.new_cache(len(sources), beam, src.shape[1], **cache_kwargs)
        self.cache.admit(torch.arange(len(sources)), model.cross_kv(model.encode(src, mask)), mask)
        self.s = src.shape[1]

    def __call__(self, tokens: list[int], rows: list[int], positions: list[int]) -> torch.Tensor:
        """One step of cache rows ``rows`` (ascending) at ``positions`` -> logits (N, V)."""
        slots = sorted({r // self.beam for r in rows})
        grid = [slots.index(r // self.beam) * self.beam + r % self.beam for r in rows]
        first = slots[0] if slots == list(range(slots[0], slots[0] + len(slots))) else -1
        tokens_t = torch.tensor(tokens)
        at = self.cache.step_at(tokens_t, torch.tensor(rows), torch.tensor(positions), torch.tensor(grid),
                                torch.tensor(slots), t=max(positions) + 1, s=self.s,
                                shared=len(set(positions)) == 1, first=first)
        return self.model.decode_step(tokens_t, at, self.cache, self.model.output_head())


@pytest.fixture(params=["aten", "native"])
def stepped(model, request):
    """The model with the ATen step backend, or the native kernels (NativeOps)."""
    if request.param == "native":
        kernels = load_native()
        if kernels is None:
            pytest.skip("native decode operators could not be built here")
        model.model.decoder.ops = NativeOps(kernels)
    yield model
    model.model.decoder.ops = ATEN


@torch.no_grad()
def test_decode_step_rows_at_different_positions(stepped, rows):
    """Row r starts ``offsets[r]`` steps late, so one step holds rows at different target positions;
    only started, unfinished rows run. Each row's logits equal decoding it alone."""
    model, (sources, targets) = stepped, rows
    offsets = [0, 3, 1, 2]
    steps = Steps(model, sources)
    got: list[dict[int, torch.Tensor]] = [{} for _ in sources]
    distinct_positions = set()
    for g in range(max(o + len(t) for o, t in zip(offsets, targets))):
        run = [r for r, (o, t) in enumerate(zip(offsets, targets)) if 0 <= g - o < len(t)]
        pos = [g - offsets[r] for r in run]
        logits = steps([targets[r][p] for r, p in zip(run, pos)], run, pos)  # (N, V)
        distinct_positions.add(len(set(pos)))
        for row, (r, p) in enumerate(zip(run, pos)):
            got[r][p] = logits[row]
    assert max(distinct_positions) == len(sources)  # some step had every row at its own position
    for r, (s, t) in enumerate(zip(sources, targets)):
        torch.testing.assert_close(torch.stack([got[r][p] for p in range(len(t))]), alone(model, s, t), atol=ATOL, rtol=0)


@torch.no_grad()
def test_reorder_duplicates_and_drops_beams(stepped, rows):
    """Three sentences of K=3 beams decode 3 steps with a different prefix per beam; the beams are
    then reordered (duplicated, permuted, one left empty) by rewriting only ancestry, and continue
    with new tokens: each row's logits equal decoding its source beam's prefix + continuation alone."""
    model, (sources, _) = stepped, rows
    k, gen = 3, torch.Generator().manual_seed(2)
    steps = Steps(model, sources[:3], beam=k)
    prefixes = [[PAD] + rand_ids(gen, 2) for _ in range(3 * k)]  # one per cache row
    for p in range(3):
        steps([x[p] for x in prefixes], list(range(3 * k)), [p] * (3 * k))
    source_of = {0: 2, 1: 0, 2: 0, 3: 3, 4: 5, 6: 8, 7: 6, 8: 6}  # row 5 left empty: a pruned beam
    dst = sorted(source_of)
    steps.cache.reorder(torch.tensor([source_of[r] for r in dst]), torch.tensor(dst), 3)
    cont = {r: rand_ids(gen, 3) for r in dst}
    got = torch.stack([steps([cont[r][i] for r in dst], dst, [3 + i] * len(dst)) for i in range(3)], 1)  # (N, T, V)
    for row, r in enumerate(dst):
        expected = alone(model, sources[r // k], prefixes[source_of[r]] + cont[r])[3:]
        torch.testing.assert_close(got[row], expected, atol=ATOL, rtol=0)


@torch.no_grad()
def test_new_cache_shapes(model):
    cache = model.new_cache(2, 3, 4, target_capacity=5)
    assert isinstance(cache, KVCache)
    assert cache.self_k.shape == (5, 2, 6, 4, 8)  # (T, L, R, H, D): time-major, R = slots x K
    assert cache.cross_k.shape == (2, 2, 4, 4, 8)  # (L, slots, H, S, D)
    assert cache.ancestry.shape == (5, 6) and cache.max_length == 5
    cache.reserve(6)
    assert cache.max_length == 10  # doubling: growth is O(length) overall
    bounded = model.new_cache(2, 3, 4, target_capacity=5, limit=7)
    bounded.reserve(6)
    assert bounded.max_length == 7 and bounded.ancestry.shape == (7, 6)  # not past the longest cap


@torch.no_grad()
def test_encoded_batch_admits_any_of_its_sentences_into_any_slot(model, rows):
    """Sentences encoded together and admitted a few at a time, out of order (a streaming policy's
    encoded-ahead batch): each slot holds the K/V of its sentence encoded alone, padding masked."""
    sources, _ = rows
    encoded = EncodedBatch(model.cross_kv(model.encode(*batch(sources))))
    assert encoded.select([0, 1, 2, 3], max(map(len, sources))) is encoded.layers  # the whole batch: no copy
    cache = model.new_cache(4, 2, max(map(len, sources)), zeroed=True)
    for rows_, slots in (([2, 0], [3, 1]), ([3], [0]), ([1], [2])):
        lengths = [len(sources[r]) for r in rows_]
        cache.admit(torch.tensor(slots), encoded.select(rows_, max(lengths)), prefix_mask(lengths, max(lengths)))
    for r, slot in ((2, 3), (0, 1), (3, 0), (1, 2)):
        n = len(sources[r])
        alone = model.cross_kv(model.encode(*batch([sources[r]])))
        for layer, (k, v) in enumerate(alone):
            torch.testing.assert_close(cache.cross_k[layer, slot, :, :n], k[0], atol=ATOL, rtol=0)
            torch.testing.assert_close(cache.cross_v[layer, slot, :, :n], v[0], atol=ATOL, rtol=0)
        assert int(cache.source_lengths[slot]) == n
        assert torch.isinf(cache.cross_bias[slot, 0, n:]).all() and not cache.cross_bias[slot, 0, :n].any()


@torch.no_grad()
def test_cache_grows_past_its_initial_capacity(stepped, rows):
    """A cache made for 1 position grows as steps need it (shared and per-row positions) and
    decodes exactly as one made large enough up front."""
    model, (sources, targets) = stepped, rows
    small, large = Steps(model, sources, target_capacity=1), Steps(model, sources, target_capacity=8)
    for step in range(5):
        tokens = [t[min(step, len(t) - 1)] for t in targets]
        torch.testing.assert_close(small(tokens, [0, 1, 2, 3], [step] * 4), large(tokens, [0, 1, 2, 3], [step] * 4),
                                   atol=ATOL, rtol=0)
    assert small.cache.max_length >= 5 and large.cache.max_length == 8
    tokens, rows_, pos = [t[0] for t in targets], [0, 1, 2, 3], [5, 2, 6, 3]  # past the grown capacity
    torch.testing.assert_close(small(tokens, rows_, pos), large(tokens, rows_, pos), atol=ATOL, rtol=0)
