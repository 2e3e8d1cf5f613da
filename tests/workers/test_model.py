"""``MarianModel`` incremental decoding against its own teacher-forced forward.

Rows of one batch at different target positions, ``DecoderCache.select`` reordering / duplicating /
dropping rows, and padded sources of different lengths must all give, row by row, the logits of
decoding that row alone with the full-sequence forward.
"""
from __future__ import annotations

import pytest
import torch

from workers.config import ModelConfig
from workers.decoder_cache import DecoderCache
from workers.model import MarianModel

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


@torch.no_grad()
def test_decode_step_rows_at_different_positions(model, rows):
    """Row r starts ``offsets[r]`` steps late, so one batch holds rows at different target positions.

    A row not yet started re-feeds its start token at position 0, a finished row re-feeds its last
    token at its last position (both rewrite identical K/V); only in-range steps are compared.
    """
    sources, targets = rows
    offsets = [0, 3, 1, 2]
    src, src_mask = batch(sources)
    cache = model.init_cache(model.encode(src, src_mask), src_mask, max(len(t) for t in targets))
    got: list[dict[int, torch.Tensor]] = [{} for _ in rows[0]]
    distinct_positions = set()
    for g in range(max(o + len(t) for o, t in zip(offsets, targets))):
        pos = [min(max(g - o, 0), len(t) - 1) for o, t in zip(offsets, targets)]
        tokens = torch.tensor([t[p] for t, p in zip(targets, pos)])
        logits = model.decode_step(tokens, torch.tensor(pos), cache)  # (N, V)
        distinct_positions.add(len(set(pos)))
        for r, o in enumerate(offsets):
            if 0 <= g - o < len(targets[r]):
                got[r][g - o] = logits[r]
    assert max(distinct_positions) == len(rows[0])  # some step had every row at its own position
    for r, (s, t) in enumerate(zip(sources, targets)):
        steps = torch.stack([got[r][p] for p in range(len(t))])
        torch.testing.assert_close(steps, alone(model, s, t), atol=ATOL, rtol=0)


@torch.no_grad()
def test_cache_select_reorders_duplicates_and_drops_rows(model, rows):
    """Decode 3 steps, keep rows [2, 0, 0, 3] (row 1 dropped, row 0 twice), continue with new tokens."""
    sources, _ = rows
    gen = torch.Generator().manual_seed(2)
    prefixes = [[PAD] + rand_ids(gen, 2) for _ in sources]
    src, src_mask = batch(sources)
    cache = model.init_cache(model.encode(src, src_mask), src_mask, 8)
    for step in range(3):
        model.decode_step(torch.tensor([p[step] for p in prefixes]), torch.full((4,), step), cache)
    keep = [2, 0, 0, 3]
    cache = cache.select(torch.tensor(keep), 3)
    assert cache.num_rows == 4 and cache.max_length == 4  # the copied prefix + the next step's slot; grows on demand
    cont = [rand_ids(gen, 4) for _ in keep]  # a different continuation for each new row
    got = []
    for step in range(4):
        got.append(model.decode_step(torch.tensor([c[step] for c in cont]), torch.full((4,), 3 + step), cache))
    got = torch.stack(got, 1)  # (N, T, V)
    for row, old in enumerate(keep):
        expected = alone(model, sources[old], prefixes[old] + cont[row])[3:]
        torch.testing.assert_close(got[row], expected, atol=ATOL, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("reuse", [False, True])
def test_sentence_grid_equals_one_cross_copy_per_row(model, rows, reuse):
    """Cross-attention K/V once per sentence, rows in a (B' x K) grid, through beam permutations, an
    empty grid entry and a dropped sentence, gives the logits of one K/V copy per row (to float
    rounding); ``reuse=True`` (spare buffers, ping-pong) changes nothing."""
    sources, _ = rows
    k = 3
    src, src_mask = batch(sources[:3])
    memory = model.encode(src, src_mask)  # (3, S, E)
    per_row = model.init_cache(memory.repeat_interleave(k, 0), src_mask.repeat_interleave(k, 0), 1)
    grid = model.init_cache(memory, src_mask, 1).select(torch.arange(3).repeat_interleave(k), 0,
                                                        slots=torch.arange(3 * k), width=k, reuse=reuse)
    assert grid.cross_k.shape[1] == 3 and per_row.cross_k.shape[1] == 3 * k
    gen = torch.Generator().manual_seed(3)
    # (rows kept, their grid entries, sentences kept): permute within sentences; empty entry 4; drop sentence 1
    plans = [([2, 2, 0, 4, 3, 3, 8, 6, 7], list(range(9)), None),
             ([1, 0, 0, 3, 5, 8, 6, 6], [0, 1, 2, 3, 5, 6, 7, 8], None),
             ([0, 1, 2, 5, 6, 7], [0, 1, 2, 3, 4, 5], torch.tensor([0, 2]))]
    for step, (keep, slots, sentences) in enumerate(plans):
        n = per_row.num_rows
        tokens = torch.randint(1, PAD, (n,), generator=gen)
        a = model.decode_step(tokens, torch.full((n,), step), per_row)
        b = model.decode_step(tokens, torch.full((n,), step), grid)
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
        keep = torch.tensor(keep)
        per_row = per_row.select(keep, step + 1)
        grid = grid.select(keep, step + 1, sentences=sentences, slots=torch.tensor(slots), width=k, reuse=reuse)
    assert grid.cross_k.shape[1] == 2 and grid.num_rows == 6
    tokens = torch.randint(1, PAD, (6,), generator=gen)
    torch.testing.assert_close(model.decode_step(tokens, torch.full((6,), 3), per_row),
                               model.decode_step(tokens, torch.full((6,), 3), grid), atol=ATOL, rtol=0)


@torch.no_grad()
def test_select_with_rows_at_different_positions(model, rows, monkeypatch):
    """After ``select(rows, length)`` rows behind others still read (masked) positions up to the
    furthest row; whatever memory the new cache got there must not leak in, even NaN."""
    real_new_empty = torch.Tensor.new_empty

    def new_empty_nan(self, *size, **kw):  # uninitialised memory may hold anything
        return real_new_empty(self, *size, **kw).fill_(float("nan"))
    monkeypatch.setattr(torch.Tensor, "new_empty", new_empty_nan)

    sources, targets = rows
    src, src_mask = batch(sources)
    cache = model.init_cache(model.encode(src, src_mask), src_mask, 8)
    lengths = [4, 1, 2, 3]  # row r has consumed targets[r][:lengths[r]]
    for g in range(max(lengths)):
        pos = [min(g, n - 1) for n in lengths]
        model.decode_step(torch.tensor([targets[r][p] for r, p in enumerate(pos)]), torch.tensor(pos), cache)
    keep = [0, 2, 3]
    cache = cache.select(torch.tensor(keep), max(lengths))
    pos = torch.tensor([lengths[r] for r in keep])
    tokens = torch.tensor([targets[r][lengths[r]] for r in keep])
    got = model.decode_step(tokens, pos, cache)
    for row, r in enumerate(keep):
        expected = alone(model, sources[r], targets[r][: lengths[r] + 1])[-1]
        torch.testing.assert_close(got[row], expected, atol=ATOL, rtol=0)


@torch.no_grad()
def test_init_cache_shapes(model):
    src, mask = batch([[1, 2, 3, EOS], [4, EOS]])
    cache = model.init_cache(model.encode(src, mask), mask, 5)
    assert isinstance(cache, DecoderCache)
    assert cache.self_k.shape == (5, 2, 2, 4, 8)  # (T, L, N, H, D): time-major
    assert cache.cross_k.shape == (2, 2, 4, 4, 8)  # (L, N, H, S, D)
    assert cache.num_rows == 2 and cache.max_length == 5


@torch.no_grad()
def test_cache_grows_past_its_initial_capacity(model, rows):
    """A cache made for 1 position grows as steps need it (shared and per-row positions) and
    decodes exactly as one made large enough up front."""
    sources, targets = rows
    src, src_mask = batch(sources)
    memory = model.encode(src, src_mask)
    small, large = model.init_cache(memory, src_mask, 1), model.init_cache(memory, src_mask, 8)
    for step in range(5):
        tokens = torch.tensor([t[min(step, len(t) - 1)] for t in targets])
        a = model.decode_step(tokens, torch.full((4,), step), small)
        b = model.decode_step(tokens, torch.full((4,), step), large)
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    assert small.max_length >= 5 and large.max_length == 8
    pos = torch.tensor([5, 2, 6, 3])  # rows at different positions past the grown capacity
    tokens = torch.tensor([t[0] for t in targets])
    small.reserve(int(pos.max()) + 1)
    torch.testing.assert_close(model.decode_step(tokens, pos, small), model.decode_step(tokens, pos, large),
                               atol=ATOL, rtol=0)
