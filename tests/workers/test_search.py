"""Unit tests of the pure beam-step functions in ``raymt.workers.search.selection`` on hand-built tensors.

The expected values follow HF ``generate`` beam search (transformers ``_beam_search``): 2K candidates,
EOS candidates finish only when ranked < K. The rules applied after the step (finished pools, length
normalisation, the stop test, pruning) are ``tests/workers/test_beam_rules.py``'s.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from benchmarks.search_variants import row_top_log_probs_fused
from tests.workers.search_oracles import normalized_log_probs, top_candidates
from raymt.workers.search.selection import (
    Candidates,
    RowTop,
    row_top_log_probs,
    select_step,
    top_candidates_from_rows,
)

INF = math.inf
EOS, PAD = 0, 5


def log(p: float) -> float:
    return -INF if p == 0 else math.log(p)


# --------------------------------------------------------------------------- top_candidates

@pytest.mark.parametrize("beam_probs, running_probs, expected", [
    # two live beams: totals beam0 .25 .15 .10, beam1 .24 .12 .04 -> interleaved by score
    ([[.5, .3, .2], [.6, .3, .1]], [.5, .4], [(.25, 0, 0), (.24, 1, 0), (.15, 0, 1), (.12, 1, 1)]),
    # first step: beam 1 is a -inf placeholder, so only beam 0's tokens are finite
    ([[.2, .5, .3], [.2, .5, .3]], [1.0, 0.0], [(.5, 0, 1), (.3, 0, 2), (.2, 0, 0), (0.0, 1, None)]),
    # a token of the weaker beam outranks the stronger beam's second token
    ([[.9, .05, .05], [.5, .4, .1]], [.5, .5], [(.45, 0, 0), (.25, 1, 0), (.2, 1, 1), (.05, 1, 2)]),
])
def test_top_candidates_hand_cases(beam_probs: list[list[float]], running_probs: list[float],
                                   expected: list[tuple[float, int, int | None]]) -> None:
    log_probs = torch.tensor([[[log(p) for p in row] for row in beam_probs]])  # (1, K, V)
    running = torch.tensor([[log(p) for p in running_probs]])  # (1, K)
    cands = top_candidates(log_probs, running, 2 * len(beam_probs))
    assert cands.scores.shape == cands.beams.shape == cands.tokens.shape == (1, len(expected))
    for c, (prob, beam, token) in enumerate(expected):
        assert float(cands.scores[0, c]) == pytest.approx(log(prob), abs=1e-6)
        assert int(cands.beams[0, c]) == beam
        if token is not None:  # ties among -inf candidates have no defined token
            assert int(cands.tokens[0, c]) == token


@pytest.mark.parametrize("batch, beam_size, vocab_size, seed", [
    (1, 1, 4, 0), (2, 2, 5, 1), (3, 3, 7, 2), (2, 4, 3, 3), (1, 5, 11, 4),
])
def test_top_candidates_matches_enumeration(batch: int, beam_size: int, vocab_size: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(batch, beam_size, vocab_size, generator=gen)
    running = torch.randn(batch, beam_size, generator=gen)
    before = (log_probs.clone(), running.clone())
    cands = top_candidates(log_probs, running, 2 * beam_size)
    for b in range(batch):
        ranked = sorted(((float(log_probs[b, k, v] + running[b, k]), k, v)
                         for k, v in itertools.product(range(beam_size), range(vocab_size))), reverse=True)
        top = ranked[: 2 * beam_size]
        assert cands.beams[b].tolist() == [k for _, k, _ in top]
        assert cands.tokens[b].tolist() == [v for _, _, v in top]
        assert cands.scores[b].tolist() == pytest.approx([s for s, _, _ in top], abs=1e-6)
    assert torch.equal(log_probs, before[0]) and torch.equal(running, before[1])


# --------------------------------------------------------------------------- select_step

def candidates(tokens: list[int], scores: list[float] | None = None) -> Candidates:
    """One sentence's candidates, best first; beams are irrelevant to select_step."""
    scores = scores if scores is not None else [-float(i + 1) for i in range(len(tokens))]
    return Candidates(torch.tensor([scores]), torch.zeros(1, len(tokens), dtype=torch.long),
                      torch.tensor([tokens]))


@pytest.mark.parametrize("tokens, scores, beam_size, at_max_length, finished, running", [
    # EOS ranked first finishes; running are the next best non-EOS
    ([EOS, 1, 2, 3], None, 2, False, [0], [1, 2]),
    # EOS ranked K (outside the top K) neither finishes nor runs
    ([1, 2, EOS, 3], None, 2, False, [], [0, 1]),
    # two EOS inside the top K (from different beams) both finish
    ([1, EOS, EOS, 2, 3, 4], None, 3, False, [1, 2], [0, 3, 4]),
    # EOS ranked K and K+1 are dropped
    ([1, 2, 3, EOS, EOS, 4], None, 3, False, [], [0, 1, 2]),
    # EOS last of 2K with K=1
    ([1, EOS], None, 1, False, [], [0]),
    ([EOS, 1], None, 1, False, [0], [1]),
    # -inf candidates never finish, even ranked < K, and run only as -inf placeholders
    ([1, EOS, EOS, 2], [-1.0, -INF, -INF, -INF], 2, False, [], [0]),
    # at the length cap every top-K candidate finishes, EOS or not, and nothing runs
    ([1, EOS, 2, 3], None, 2, True, [0, 1], []),
    ([1, 2, 3, 4, EOS, 4], None, 3, True, [0, 1, 2], []),
])
def test_select_step(tokens: list[int], scores: list[float] | None, beam_size: int, at_max_length: bool,
                     finished: list[int], running: list[int]) -> None:
    cands = candidates(tokens, scores)
    sel = select_step(cands, EOS, torch.tensor([at_max_length]), beam_size)
    assert sel.finished.shape == (1, len(tokens))
    assert sel.finished[0].nonzero().flatten().tolist() == finished
    assert sel.running.shape == sel.running_scores.shape == (1, beam_size)
    live = torch.isfinite(sel.running_scores[0])
    assert sel.running[0][live].tolist() == running
    assert sel.running_scores[0][live].tolist() == [float(cands.scores[0, c]) for c in running]
    assert torch.isinf(sel.running_scores[0][~live]).all()


def test_select_step_rows_are_independent() -> None:
    """Sentence 0 is at its cap, sentence 1 is not: the cap applies per row."""
    cands = Candidates(torch.tensor([[-1.0, -2.0, -3.0, -4.0]] * 2), torch.zeros(2, 4, dtype=torch.long),
                       torch.tensor([[1, 2, EOS, 3], [1, 2, EOS, 3]]))
    sel = select_step(cands, EOS, torch.tensor([True, False]), 2)
    assert sel.finished.tolist() == [[True, True, False, False], [False, False, False, False]]
    assert sel.running[1].tolist() == [0, 1]
    assert torch.isinf(sel.running_scores[0]).all()


# --------------------------------------------------------------------------- normalized_log_probs

def test_normalized_log_probs_bans_pad_after_softmax() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    before = logits.clone()
    lp = normalized_log_probs(logits, PAD, None, EOS)
    expected = torch.log_softmax(logits, dim=-1)
    assert lp.dtype == torch.float32
    assert torch.isneginf(lp[:, PAD]).all()
    # HF applies the bad-words ban after the log-softmax: the other tokens are not renormalised
    assert torch.allclose(lp[:, :PAD], expected[:, :PAD])
    assert torch.equal(logits, before)


@pytest.mark.parametrize("force", [[True, False, True], [False, False, False], [True, True, True]])
def test_normalized_log_probs_forced_eos(force: list[bool]) -> None:
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    force_t = torch.tensor(force)
    lp = normalized_log_probs(logits, PAD, force_t, EOS)
    free = normalized_log_probs(logits, PAD, None, EOS)
    for row, forced in enumerate(force):
        if forced:
            assert lp[row, EOS] == 0.0
            assert torch.isneginf(lp[row, 1:]).all()
        else:
            assert torch.equal(lp[row], free[row])
    assert torch.equal(logits, before) and force_t.tolist() == force


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_normalized_log_probs_returns_float32(dtype: torch.dtype) -> None:
    logits = torch.randn(2, 6, generator=torch.Generator().manual_seed(1)).to(dtype)
    before = logits.clone()
    lp = normalized_log_probs(logits, PAD, torch.tensor([True, False]), EOS)
    assert lp.dtype == torch.float32 and lp.shape == (2, 6)
    assert torch.equal(logits, before)


# --------------------------------------------------------------------------- fused output step

ROW_TOP = [row_top_log_probs, row_top_log_probs_fused]


@pytest.mark.parametrize("row_top", ROW_TOP)
@pytest.mark.parametrize("seed, b, k, v", [(0, 1, 1, 7), (1, 3, 4, 50), (2, 2, 5, 11), (3, 4, 3, 1000)])
def test_fused_row_top_equals_dense_log_softmax_path(seed: int, b: int, k: int, v: int, row_top) -> None:
    """Per-row top-2K + logsumexp picks the same candidates, at the same scores, as log_softmax -> top-k."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b * k, v, generator=gen) * 3
    running = torch.randn(b, k, generator=gen).sort(dim=1, descending=True).values
    running[:, k // 2 + 1:] = float("-inf")
    pad, eos = v - 1, 0
    force = torch.zeros(b * k, dtype=torch.bool)
    force[0] = True
    before = logits.clone()
    dense = top_candidates(normalized_log_probs(logits, pad, force, eos).view(b, k, v), running, 2 * k)
    top = row_top(logits, 2 * k, pad, force, eos)
    fused = top_candidates_from_rows(RowTop(top.log_probs.view(b, k, -1), top.tokens.view(b, k, -1)), running, 2 * k)
    assert torch.equal(logits, before)
    finite = torch.isfinite(dense.scores)
    assert torch.equal(finite, torch.isfinite(fused.scores))
    assert torch.equal(dense.tokens[finite], fused.tokens[finite])
    assert torch.equal(dense.beams[finite], fused.beams[finite])
    assert torch.allclose(dense.scores[finite], fused.scores[finite], atol=1e-5)
    assert torch.allclose(dense.word_log_probs[finite], fused.word_log_probs[finite], atol=1e-5)
    assert not bool((fused.tokens[finite] == pad).any())


@pytest.mark.parametrize("row_top", ROW_TOP)
def test_row_top_bans_pad_even_when_it_is_the_best_logit(row_top) -> None:
    logits = torch.tensor([[0.0, 1.0, 9.0, 2.0]])  # pad = 2 has the largest logit
    top = row_top(logits, 2, pad_id=2)
    assert top.tokens.tolist() == [[3, 1]]
    lse = torch.logsumexp(logits, dim=-1)  # the normaliser still includes pad
    assert torch.allclose(top.log_probs, torch.tensor([[2.0, 1.0]]) - lse)


def test_greedy_select_ends_on_eos_at_the_cap_or_without_a_finite_continuation():
    """Beam 1 (the engine's greedy step; its equality with the K = 1 beam step on a real model is
    tests/workers/test_stream.py's static-vs-dynamic test): sentence 0 continues, 1 picks EOS, 2 is
    at its cap, 3 has only -inf left."""
    from raymt.workers.search.selection import RowTop, greedy_select

    top = RowTop(torch.tensor([[-0.5], [-0.1], [-0.7], [float("-inf")]]), torch.tensor([[5], [0], [6], [7]]))
    sel = greedy_select(top, torch.tensor([-1.0, -2.0, -3.0, -4.0]), torch.tensor([False, False, True, False]), eos_id=0)
    assert sel.scores.tolist() == pytest.approx([-1.5, -2.1, -3.7, float("-inf")]) and sel.tokens.tolist() == [5, 0, 6, 7]
    assert sel.finished.tolist() == [False, True, True, False]
    assert sel.done.tolist() == [False, True, True, True]
