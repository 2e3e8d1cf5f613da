"""Greedy and beam search driven by a stub decoder that reads scripted probability tables
(``tests/workers/scripted.py``), so the tests assert exact tokens and scores.

Vocabulary of the hand tables: E=0 (EOS), A..D=1..4, PAD=5 (also the decoder start token).
Expected scores are written as products of the scripted probabilities (a forced EOS counts 1).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import pytest

from tests.workers.scripted import (A, B, C, D, E, V, ProbsFn, ScriptedModel, Table, decode, random_tables,
                                    scripted)
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.engine import DecodeStats
from tests.workers.reference_decoding import beam_search, greedy_search
from raymt.workers.kernels.native import load as load_native
from raymt.workers.model.step_ops import ATEN, AtenOps, NativeOps
from raymt.workers.search.selection import Hypothesis


def assert_hyps(actual: list[Hypothesis], expected: Sequence[tuple[tuple[int, ...], float]],
                length_penalty: float) -> None:
    """expected: (tokens, probability of the sequence) pairs, best first."""
    assert [h.tokens for h in actual] == [tokens for tokens, _ in expected]
    for h, (tokens, prob) in zip(actual, expected):
        assert h.log_prob == pytest.approx(math.log(prob), abs=1e-5)
        assert h.score == pytest.approx(math.log(prob) / len(tokens) ** length_penalty, abs=1e-5)


# --------------------------------------------------------------------------- scripted tables

# EOS ranks third after the first step: it finishes with K=3, not with K=2.
EOS_RANK: Table = {
    (): {A: .4, B: .35, E: .25},
    (A,): {E: .6, C: .4},
    (B,): {E: .6, D: .4},
    (A, C): {E: 1.0},
    (B, D): {E: 1.0},
}
# (E) finishes first; (A C E) is longer and wins only when scores are length-normalised.
LENGTH: Table = {
    (): {E: .5, A: .3, B: .2},
    (A,): {C: .9, E: .1},
    (B,): {E: .6, D: .4},
    (A, C): {E: .95, D: .05},
    (B, D): {E: .7, C: .3},
}
# Long hypotheses, for length caps.
CAP: Table = {
    (): {A: .6, B: .3, E: .1},
    (A,): {C: .5, D: .3, E: .2},
    (B,): {C: .8, E: .2},
    (A, C): {D: .6, E: .4},
    (B, C): {E: .9, A: .1},
    (A, C, D): {E: 1.0},
    (B, C, A): {E: 1.0},
}
# The HF heuristic stops before the better, longer hypothesis is found (K=1).
HEURISTIC: Table = {
    (): {E: .6, A: .4},
    (A,): {E: 1.0},
}
TABLES = {0: EOS_RANK, 1: LENGTH, 2: CAP, 3: HEURISTIC}
KEY = {"eos_rank": 0, "length": 1, "cap": 2, "heuristic": 3}


def scripted_model(ops: AtenOps = ATEN) -> ScriptedModel:
    return ScriptedModel(scripted(TABLES), ops=ops)


def native_ops():
    ops = load_native()
    if ops is None:
        pytest.skip("native decode operators could not be built here (see the logged reason)")
    return ops


# --------------------------------------------------------------------------- beam search, hand cases

@pytest.mark.parametrize("table, cfg, expected", [
    # K=2: (E) ranks 2 >= K after step 0 and never finishes, though alone it would score best (alpha 0)
    ("eos_rank", SearchConfig(beam_size=2, num_hypotheses=2, length_penalty=0.0),
     [((A, E), .24), ((B, E), .21)]),
    # K=3: (E) ranks 2 < K and enters the pool
    ("eos_rank", SearchConfig(beam_size=3, num_hypotheses=3, length_penalty=0.0),
     [((E,), .25), ((A, E), .24), ((B, E), .21)]),
    # alpha 1, K=2: the pool fills at step 1 and (A C) normalised at length 2 cannot beat (B E)
    ("eos_rank", SearchConfig(beam_size=2, num_hypotheses=2, length_penalty=1.0),
     [((A, E), .24), ((B, E), .21)]),
    # alpha 1, K=3: worst finished is (E) at log .25, so (A C), (B D) keep running and win
    ("eos_rank", SearchConfig(beam_size=3, num_hypotheses=3, length_penalty=1.0),
     [((A, C, E), .16), ((B, D, E), .14), ((A, E), .24)]),
    # a short hypothesis finishes at step 0; the longer (A C E) wins with alpha 1 ...
    ("length", SearchConfig(beam_size=2, num_hypotheses=2, length_penalty=1.0),
     [((A, C, E), .2565), ((E,), .5)]),
    # ... and loses with alpha 0
    ("length", SearchConfig(beam_size=2, num_hypotheses=2, length_penalty=0.0),
     [((E,), .5), ((A, C, E), .2565)]),
    # early_stopping=True: done once K hypotheses finished (step 1), (A C E) never found
    ("length", SearchConfig(beam_size=2, num_hypotheses=2, length_penalty=1.0, early_stopping=True),
     [((E,), .5), ((B, E), .12)]),
    ("length", SearchConfig(beam_size=2, num_hypotheses=2, length_penalty=0.0, early_stopping=True),
     [((E,), .5), ((B, E), .12)]),
    # n-best truncation keeps the order
    ("length", SearchConfig(beam_size=2, num_hypotheses=1, length_penalty=1.0), [((A, C, E), .2565)]),
    ("eos_rank", SearchConfig(beam_size=3, num_hypotheses=2, length_penalty=0.0), [((E,), .25), ((A, E), .24)]),
    # K=1: (E) fills the pool; (A) normalised at length 1 (log .4) <= log .6, so HF stops although
    # (A E) would score log(.4)/2 > log .6
    ("heuristic", SearchConfig(beam_size=1, num_hypotheses=1, length_penalty=1.0), [((E,), .6)]),
    ("heuristic", SearchConfig(beam_size=2, num_hypotheses=2, length_penalty=1.0), [((A, E), .4), ((E,), .6)]),
])
@pytest.mark.parametrize("scoring", ["aten", "native"])
def test_beam_search_scripted(table: str, cfg: SearchConfig, expected: list[tuple[tuple[int, ...], float]],
                              scoring: str) -> None:
    model = scripted_model(NativeOps(native_ops()) if scoring == "native" else ATEN)
    (result,) = decode(beam_search, model, cfg, [(KEY[table], 3)])
    assert_hyps(result, expected, cfg.length_penalty)


# Results of beam search (K=2, alpha 1) on CAP by (cap, forced_eos).
CAP_BEAM: dict[tuple[int, bool], list[tuple[tuple[int, ...], float]]] = {
    (1, True): [((E,), 1.0)],  # only EOS is allowed, at log-prob 0; beam 1 is a -inf placeholder
    (1, False): [((A,), .6), ((B,), .3)],
    (2, True): [((A, E), .6), ((B, E), .3)],
    (2, False): [((A, C), .3), ((B, C), .24)],
    (3, True): [((A, C, E), .3), ((B, C, E), .24)],
    (3, False): [((B, C, E), .216), ((A, C, D), .18)],
    (4, True): [((A, C, D, E), .18), ((B, C, E), .216)],
    (4, False): [((A, C, D, E), .18), ((B, C, E), .216)],
}
# Greedy on CAP: A, C, D, E.
CAP_GREEDY: dict[tuple[int, bool], tuple[tuple[int, ...], float]] = {
    (1, True): ((E,), 1.0), (1, False): ((A,), .6),
    (2, True): ((A, E), .6), (2, False): ((A, C), .3),
    (3, True): ((A, C, E), .3), (3, False): ((A, C, D), .18),
    (4, True): ((A, C, D, E), .18), (4, False): ((A, C, D, E), .18),
}
CAPS = [  # (search config options, source length, resulting cap)
    (dict(max_decoding_length=1), 3, 1),
    (dict(max_decoding_length=2), 3, 2),
    (dict(max_decoding_length=3), 3, 3),
    (dict(), 3, 4),  # default cap 256: the table ends the hypotheses
    (dict(max_length_a=1.0, max_length_b=1), 1, 2),
    (dict(max_length_a=1.0, max_length_b=1), 2, 3),
    (dict(max_length_a=0.5, max_length_b=1), 3, 2),  # int(2.5)
    (dict(max_length_a=2.0, max_length_b=1, max_decoding_length=3), 4, 3),  # 9 capped by 3
    (dict(max_length_a=0.5, max_length_b=1, max_decoding_length=4), 1, 1),  # int(1.5)
]


@pytest.mark.parametrize("forced_eos", [True, False])
@pytest.mark.parametrize("options, source_length, cap", CAPS)
def test_beam_search_length_cap(options: dict, source_length: int, cap: int, forced_eos: bool) -> None:
    cfg = SearchConfig(beam_size=2, num_hypotheses=2, length_penalty=1.0, **options)
    assert min(cfg.max_length_for(source_length), 4) == cap
    (result,) = decode(beam_search, scripted_model(), cfg, [(KEY["cap"], source_length)], forced_eos=forced_eos)
    assert_hyps(result, CAP_BEAM[cap, forced_eos], 1.0)


@pytest.mark.parametrize("forced_eos", [True, False])
@pytest.mark.parametrize("options, source_length, cap", CAPS)
def test_greedy_search_length_cap(options: dict, source_length: int, cap: int, forced_eos: bool) -> None:
    cfg = SearchConfig(beam_size=1, length_penalty=1.0, **options)
    (result,) = decode(greedy_search, scripted_model(), cfg, [(KEY["cap"], source_length)], forced_eos=forced_eos)
    assert_hyps(result, [CAP_GREEDY[cap, forced_eos]], 1.0)


@pytest.mark.parametrize("table, length_penalty, expected", [
    ("eos_rank", 1.0, ((A, E), .24)),
    ("eos_rank", 0.0, ((A, E), .24)),
    ("length", 1.0, ((E,), .5)),
    ("heuristic", 0.6, ((E,), .6)),
])
def test_greedy_search_scripted(table: str, length_penalty: float, expected: tuple[tuple[int, ...], float]) -> None:
    cfg = SearchConfig(beam_size=1, length_penalty=length_penalty)
    (result,) = decode(greedy_search, scripted_model(), cfg, [(KEY[table], 2)])
    assert_hyps(result, [expected], length_penalty)


# --------------------------------------------------------------------------- batches

@pytest.mark.parametrize("forced_eos", [True, False])
def test_beam_batch_with_different_caps(forced_eos: bool) -> None:
    """One batch, same table, source lengths 4, 1, 6, 2 -> caps 3, 1, 4, 2 (int(src/2 + 1), at most 4).

    Each sentence leaves the batch at its own cap, even the cap-1 one whose pool is not full.
    """
    cfg = SearchConfig(beam_size=2, num_hypotheses=2, max_length_a=0.5, max_length_b=1, max_decoding_length=4)
    model = scripted_model()
    results = decode(beam_search, model, cfg, [(KEY["cap"], n) for n in (4, 1, 6, 2)], forced_eos=forced_eos)
    for result, cap in zip(results, (3, 1, 4, 2)):
        assert_hyps(result, CAP_BEAM[cap, forced_eos], 1.0)
    assert model.rows_per_step == [4, 6, 4, 2]  # step 0 expands only the first (live) beam of each sentence


def test_finished_sentences_leave_the_batch() -> None:
    """eos_rank is done after step 1 and length after step 2 (K=2): the last step expands K rows only."""
    cfg = SearchConfig(beam_size=2, num_hypotheses=2, length_penalty=1.0)
    model, stats = scripted_model(), DecodeStats()
    eos_rank, length = decode(beam_search, model, cfg, [(KEY["eos_rank"], 2), (KEY["length"], 4)], stats=stats)
    assert_hyps(eos_rank, [((A, E), .24), ((B, E), .21)], 1.0)
    assert_hyps(length, [((A, C, E), .2565), ((E,), .5)], 1.0)
    assert model.rows_per_step == [2, 4, 2]  # step 0: one live beam per sentence
    assert (stats.steps, stats.row_steps, stats.target_tokens) == (3, 8, 2 + 3)


def test_greedy_finished_sentences_leave_the_batch() -> None:
    cfg = SearchConfig(beam_size=1)
    model, stats = scripted_model(), DecodeStats()
    results = decode(greedy_search, model, cfg, [(KEY[t], 2) for t in ("cap", "length", "eos_rank")], stats=stats)
    assert [r[0].tokens for r in results] == [(A, C, D, E), (E,), (A, E)]
    assert model.rows_per_step == [3, 2, 1, 1]
    assert (stats.steps, stats.row_steps, stats.target_tokens) == (4, 7, 4 + 1 + 2)


@pytest.mark.parametrize("search", [greedy_search, beam_search])
@pytest.mark.parametrize("beam_size, length_penalty, early_stopping", [
    (1, 1.0, False), (2, 1.0, False), (3, 0.0, False), (3, 0.6, True), (4, 1.0, False),
])
def test_batch_composition_does_not_change_results(search: Callable, beam_size: int, length_penalty: float,
                                                   early_stopping: bool) -> None:
    """Random tables, five sentences with caps 2..5 (a*src+b): decoding together == decoding alone."""
    cfg = SearchConfig(beam_size=beam_size, num_hypotheses=beam_size, length_penalty=length_penalty,
                       early_stopping=early_stopping, max_length_a=1.0, max_length_b=1, max_decoding_length=5)
    model = ScriptedModel(random_tables(seed=beam_size, vocab_size=V))
    sources = [(key, length) for key, length in enumerate((3, 1, 4, 2, 6))]
    together = decode(search, model, cfg, sources)
    alone = [decode(search, model, cfg, [source])[0] for source in sources]
    assert together == alone
    reordered = decode(search, model, cfg, sources[::-1])
    assert reordered == alone[::-1]
    for (_, length), result in zip(sources, together):
        assert all(len(h.tokens) <= cfg.max_length_for(length) for h in result)
        assert all(h.tokens[-1] == E for h in result)  # forced EOS at the cap


# --------------------------------------------------------------------------- exhaustive reference

def exhaustive(probs: ProbsFn, vocab_size: int, cap: int, forced_eos: bool,
               length_penalty: float) -> list[tuple[tuple[int, ...], float, float]]:
    """Every sequence search can produce, as (tokens, score, log_prob), best first.

    A sequence ends with EOS, or reaches ``cap`` (where a forced EOS costs log-prob 0). PAD is banned
    after the softmax, so other tokens keep their unrenormalised log-probs.
    """
    words = range(vocab_size - 1)  # everything but PAD (the last id)
    hyps = []
    for length in range(1, cap + 1):
        for seq in itertools.product(words, repeat=length):
            if E in seq[:-1] or (seq[-1] != E and (length < cap or forced_eos)):
                continue
            log_prob = sum(math.log(probs(0, seq[:i])[t]) for i, t in enumerate(seq)
                           if not (forced_eos and i == cap - 1))
            hyps.append((seq, log_prob / length ** length_penalty, log_prob))
    return sorted(hyps, key=lambda h: -h[1])


@pytest.mark.parametrize("cap, forced_eos, length_penalty, seed, extra_beams", [
    (2, True, 1.0, 0, 0),
    (3, True, 1.0, 1, 0),
    (3, False, 1.0, 2, 0),
    (3, True, 0.0, 3, 2),
    (4, True, 1.0, 4, 0),
    (4, True, 0.6, 5, 3),
    (4, False, 1.0, 6, 0),
    (3, False, 2.0, 7, 1),
])
def test_large_beam_is_exhaustive(cap: int, forced_eos: bool, length_penalty: float, seed: int,
                                  extra_beams: int) -> None:
    """V=4 (E, two words, PAD): with K >= number of sequences, beam search returns all of them, ranked."""
    vocab_size = 4
    probs = random_tables(seed, vocab_size)
    reference = exhaustive(probs, vocab_size, cap, forced_eos, length_penalty)
    cfg = SearchConfig(beam_size=len(reference) + extra_beams, num_hypotheses=len(reference),
                       length_penalty=length_penalty, max_decoding_length=cap)
    (result,) = decode(beam_search, ScriptedModel(probs, vocab_size), cfg, [(0, 2)], forced_eos=forced_eos)
    assert [h.tokens for h in result] == [tokens for tokens, _, _ in reference]
    assert [h.score for h in result] == pytest.approx([score for _, score, _ in reference], abs=1e-5)
    assert [h.log_prob for h in result] == pytest.approx([lp for _, _, lp in reference], abs=1e-5)


@pytest.mark.parametrize("cap, forced_eos, seed", [(3, True, 0), (4, False, 1), (5, True, 2), (5, False, 3)])
def test_greedy_follows_argmax(cap: int, forced_eos: bool, seed: int) -> None:
    vocab_size = 4
    probs = random_tables(seed, vocab_size)
    tokens, log_prob = (), 0.0
    while not (tokens and (tokens[-1] == E or len(tokens) == cap)):
        dist = probs(0, tokens)[: vocab_size - 1]  # PAD banned
        if forced_eos and len(tokens) == cap - 1:
            tokens += (E,)
        else:
            best = max(range(vocab_size - 1), key=dist.__getitem__)
            tokens, log_prob = tokens + (best,), log_prob + math.log(dist[best])
    cfg = SearchConfig(beam_size=1, max_decoding_length=cap)
    (result,) = decode(greedy_search, ScriptedModel(probs, vocab_size), cfg, [(0, 2)], forced_eos=forced_eos)
    assert result[0].tokens == tokens
    assert result[0].log_prob == pytest.approx(log_prob, abs=1e-5)
    assert result[0].score == pytest.approx(log_prob / len(tokens), abs=1e-5)

