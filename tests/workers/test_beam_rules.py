"""The beam rules (``raymt.workers.search.beam_rules``) on scripted scores with exact asserts: the packed
settings, length normalisation, the finished pools, the stop test, each pruning heuristic; then the
heuristics inside beam search on scripted tables.

The expected values follow HF ``generate`` beam search: finished score ``sum_logprob / length ** alpha``,
pools of the K best kept by HF's one-by-one adds, and the stop heuristic that compares the best running
beam, normalised at the current length, with the worst finished hypothesis.
"""
from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch

from raymt.workers.search.beam_rules import (NEG_INF, PACKED_FIELDS, SCORE, TOKEN, BeamRules, PoolSummary, RunningCandidates,
                                      finished_records, keep_mask, length_norms, merge_order, stop_mask)
from raymt.workers.config import PruningConfig, SearchConfig
from raymt.workers.decoder.engine import DecodeStats
from raymt.workers.search.selection import Hypothesis
from tests.workers.reference_decoding import beam_search
from tests.workers.scripted import A, B, C, D, E, ScriptedModel, decode, random_tables, scripted
from tests.workers.search_oracles import FinishedPool, is_done

INF = float("-inf")
NAN = math.nan


# --------------------------------------------------------------------------- settings

@pytest.mark.parametrize("rules, packed", [
    (BeamRules(), (1.0, 0.0, NAN, NAN, NAN, NAN, NAN, 0.0)),
    (BeamRules(3, 0.6, True), (3.0, 1.0, NAN, NAN, NAN, NAN, NAN, 0.0)),
    (BeamRules(2, pruning=PruningConfig(rp=0.6, mc=2)), (2.0, 0.0, 0.6, NAN, NAN, 2.0, NAN, 0.0)),
    (BeamRules(pruning=PruningConfig(ap=2.5, rpl=0.1, delta=0.0, early_stop=True)),
     (1.0, 0.0, NAN, 2.5, 0.1, NAN, 0.0, 1.0)),
])
def test_packed_lays_the_rules_out_as_the_native_step_reads_them(rules: BeamRules, packed: tuple) -> None:
    assert len(PACKED_FIELDS) == len(rules.packed) == 8
    assert [("nan" if math.isnan(v) else v) for v in rules.packed] == [("nan" if math.isnan(v) else v) for v in packed]


def test_rules_of_a_search() -> None:
    search = SearchConfig(beam_size=4, num_hypotheses=2, length_penalty=0.6, early_stopping=True,
                          pruning=PruningConfig(ap=1.0))
    assert BeamRules.of(search) == BeamRules(2, 0.6, True, PruningConfig(ap=1.0))
    with pytest.raises(ValueError):
        BeamRules(0)


# --------------------------------------------------------------------------- length normalisation

@pytest.mark.parametrize("length_penalty, expected", [
    (1.0, [1.0, 1.0, 2.0, 3.0, 4.0]),
    (0.0, [1.0, 1.0, 1.0, 1.0, 1.0]),
    (2.0, [1.0, 1.0, 4.0, 9.0, 16.0]),
    (0.6, [1.0, 1.0, 2.0 ** 0.6, 3.0 ** 0.6, 4.0 ** 0.6]),
])
def test_length_norms(length_penalty: float, expected: list[float]) -> None:
    table = length_norms(length_penalty, 5)
    assert table.dtype == torch.float64 and table.tolist() == expected


# --------------------------------------------------------------------------- finished pools

def test_finished_records() -> None:
    log_prob = torch.tensor([[-6.0, INF], [-3.0, -4.5]], dtype=torch.float64)
    records = finished_records(log_prob, torch.tensor([3, 2]), torch.tensor([3.0, 2.0], dtype=torch.float64),
                               torch.tensor([[0, 7], [0, 0]]))
    assert records.tolist() == [[[-2.0, -6.0, 3.0, 0.0], [INF, INF, 3.0, 7.0]],
                                [[-1.5, -3.0, 2.0, 0.0], [-2.25, -4.5, 2.0, 0.0]]]


def empty_pool(k: int) -> torch.Tensor:
    pool = torch.zeros(1, k, 4, dtype=torch.float64)
    pool[..., :2] = NEG_INF
    return pool


def add_one(pool: torch.Tensor, score: float, token: int) -> torch.Tensor:
    """One finisher (its raw log-prob = score, length 1) merged into a (1, K, 4) pool."""
    k = pool.shape[1]
    log_prob = torch.full((1, k), NEG_INF, dtype=torch.float64)
    log_prob[0, 0] = score
    new = finished_records(log_prob, torch.tensor([1]), torch.ones(1, dtype=torch.float64),
                           torch.full((1, k), token))
    return torch.cat([pool, new], 1).gather(1, merge_order(pool, new)[:, :, None].expand(1, k, 4))


@pytest.mark.parametrize("capacity, added, kept", [
    (3, [-2.0, -1.0], [-1.0, -2.0, INF]),
    (2, [-2.0, -1.0, -3.0], [-1.0, -2.0]),
    (2, [-3.0, -2.0, -1.0, -0.5], [-0.5, -1.0]),
    (1, [-1.0, -0.25, -4.0], [-0.25]),
    (3, [-1.0, -1.0, -2.0, -1.0], [-1.0, -1.0, -1.0]),
])
def test_pools_keep_the_k_best_sorted(capacity: int, added: list[float], kept: list[float]) -> None:
    """One by one, as HF's beam hypotheses add; the oracle pool agrees."""
    pool, oracle = empty_pool(capacity), FinishedPool(capacity)
    for score in added:
        pool = add_one(pool, score, 1)
        oracle.add(Hypothesis((1,), score, score))
    assert pool[0, :, SCORE].tolist() == kept
    assert [h.score for h in oracle.hyps] == [s for s in kept if s != INF]
    summary = PoolSummary.of(pool)
    assert summary.full.tolist() == [len(added) >= capacity] == [oracle.full]
    assert summary.worst.tolist() == [kept[-1]] == [oracle.worst_score]
    assert summary.best_log_prob.tolist() == [max(added)]


def test_pools_keep_the_first_of_ties() -> None:
    pool = empty_pool(2)
    for token in (1, 2, 3):
        pool = add_one(pool, -1.0, token)
    assert pool[0, :, TOKEN].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("old, new, order", [
    # old entries before new ones of an equal score; new ones in candidate order
    ([-1.0, -2.0, INF], [-2.0, -0.5, INF], [4, 0, 1]),
    ([-1.0, -2.0, -3.0], [-2.0, -2.0, -2.5], [0, 1, 3]),
    ([INF, INF, INF], [INF, -0.5, -0.4], [5, 4, 0]),
])
def test_merge_order(old: list[float], new: list[float], order: list[int]) -> None:
    def pool(scores: list[float]) -> torch.Tensor:
        p = torch.zeros(1, 3, 4, dtype=torch.float64)
        p[0, :, SCORE] = torch.tensor(scores, dtype=torch.float64)
        return p
    assert merge_order(pool(old), pool(new)).tolist() == [order]


# --------------------------------------------------------------------------- stop test

@pytest.mark.parametrize("pool_scores, capacity, best_running, generated, length_penalty, early_stopping, done", [
    # pool not full: never done, whatever the running score or early_stopping
    ([-1.0], 2, -100.0, 3, 1.0, False, False),
    ([-1.0], 2, -100.0, 3, 1.0, True, False),
    # early_stopping=True: done as soon as the pool is full
    ([-1.0, -2.0], 2, 0.0, 1, 1.0, True, True),
    # no running beam left
    ([-1.0, -2.0], 2, INF, 4, 1.0, False, True),
    ([], 1, INF, 1, 1.0, False, True),
    # running normalised at the current length: -3/2 = -1.5 beats the worst finished -2
    ([-1.0, -2.0], 2, -3.0, 2, 1.0, False, False),
    # -4/2 = -2 ties the worst finished: HF continues only on strictly better
    ([-1.0, -2.0], 2, -4.0, 2, 1.0, False, True),
    ([-1.0, -2.0], 2, -5.0, 2, 1.0, False, True),
    # alpha 0: raw sums compared
    ([-1.0, -2.0], 2, -3.0, 2, 0.0, False, True),
    ([-1.0, -2.0], 2, -1.5, 2, 0.0, False, False),
    # alpha 2: -9 / 3**2 = -1 > -2
    ([-1.0, -2.0], 2, -9.0, 3, 2.0, False, False),
    ([-1.0, -2.0], 2, -27.0, 3, 2.0, False, True),
    # alpha 0.6 at length 5: -4 / 5**0.6 = -1.523 > -1.6
    ([-0.5, -1.6], 2, -4.0, 5, 0.6, False, False),
    ([-0.5, -1.5], 2, -4.0, 5, 0.6, False, True),
])
def test_stop_mask_is_hfs_heuristic(pool_scores: list[float], capacity: int, best_running: float, generated: int,
                                    length_penalty: float, early_stopping: bool, done: bool) -> None:
    pool = empty_pool(capacity)
    for score in pool_scores:
        pool = add_one(pool, score, 1)
    norm = length_norms(length_penalty, generated + 1)[generated]
    got = stop_mask(torch.tensor([best_running]), torch.tensor([False]), PoolSummary.of(pool), norm, early_stopping)
    assert got.tolist() == [done]
    oracle = FinishedPool(capacity)
    for score in pool_scores:
        oracle.add(Hypothesis((1,), score, score))
    assert (is_done(oracle, best_running, generated, length_penalty, early_stopping)
            or not math.isfinite(best_running)) is done


@pytest.mark.parametrize("early_stopping", [False, True])
@pytest.mark.parametrize("length_penalty", [1.0, 0.6, 2.0])
def test_stop_mask_equals_the_oracle_per_sentence(early_stopping: bool, length_penalty: float) -> None:
    """``stop_mask`` (one tensor test per step) decides exactly as the scalar oracle ``is_done`` per sentence."""
    rng = random.Random(7)
    pools, best, generated = [], [], 6
    for _ in range(200):
        pool = FinishedPool(3)
        for _ in range(rng.randrange(5)):
            total = -rng.uniform(0, 12)
            pool.add(Hypothesis((1,), total / rng.randrange(1, 9) ** length_penalty, total))
        pools.append(pool)
        best.append(rng.choice([INF, -rng.uniform(0, 12)]))
    at_max = torch.tensor([rng.random() < 0.1 for _ in pools])
    worst = torch.tensor([p.worst_score for p in pools], dtype=torch.float64)
    summary = PoolSummary(torch.zeros(len(pools)), worst, torch.tensor([p.full for p in pools]))
    got = stop_mask(torch.tensor(best), at_max, summary, float(generated) ** length_penalty, early_stopping)
    expected = [bool(m) or not math.isfinite(b) or is_done(p, b, generated, length_penalty, early_stopping)
                for p, b, m in zip(pools, best, at_max.tolist())]
    assert got.tolist() == expected


# --------------------------------------------------------------------------- pruning

def cands(scores, words=None, beams=None, best=None, best_finished=INF) -> RunningCandidates:
    s = torch.tensor([scores], dtype=torch.float32)
    return RunningCandidates(
        scores=s,
        word_log_probs=torch.tensor([words if words is not None else scores], dtype=torch.float32),
        beams=torch.tensor([beams if beams is not None else list(range(len(scores)))]),
        best=torch.tensor([best if best is not None else scores[0]], dtype=torch.float32),
        best_finished=torch.tensor([best_finished], dtype=torch.float32))


def probs_log(*ps: float) -> list[float]:
    return [math.log(p) if p > 0 else INF for p in ps]


@pytest.mark.parametrize("cfg, candidates, expected", [
    # rp: keep p > rp * p_best: with rp .5 the bar is .25, so .5 and .3 stay
    (PruningConfig(rp=0.5), cands(probs_log(.5, .3, .2, .05)), [True, True, False, False]),
    (PruningConfig(rp=0.1), cands(probs_log(.5, .3, .2, .05)), [True, True, True, False]),
    # the reference is the step's best candidate, which may be an EOS that finished
    (PruningConfig(rp=0.5), cands(probs_log(.3, .2), best=math.log(.7)), [False, False]),
    # ap: keep score > best - ap (log space)
    (PruningConfig(ap=1.0), cands([-1.0, -1.5, -2.0, -2.5]), [True, True, False, False]),
    (PruningConfig(ap=2.0), cands([-1.0, -1.5, -2.0, -3.5]), [True, True, True, False]),
    # rpl: on the last word's probability, relative to the best last word among live candidates
    (PruningConfig(rpl=0.5), cands([-1.0, -1.1, -1.2], words=probs_log(.4, .9, .3)), [False, True, False]),
    # mc: at most mc candidates per source beam, counted in score order
    (PruningConfig(mc=1), cands([-1.0, -1.1, -1.2, -1.3], beams=[0, 0, 1, 0]), [True, False, True, False]),
    (PruningConfig(mc=2), cands([-1.0, -1.1, -1.2, -1.3], beams=[0, 0, 1, 0]), [True, True, True, False]),
    # delta: reference = max(best candidate, best finished hypothesis)
    (PruningConfig(delta=1.0), cands([-2.0, -2.5, -3.5], best_finished=-1.8), [True, True, False]),
    (PruningConfig(delta=1.0), cands([-2.0, -2.5, -3.5], best_finished=-9.0), [True, True, False]),
    (PruningConfig(delta=0.4), cands([-2.0, -2.5, -3.5], best_finished=-1.8), [True, False, False]),
    (PruningConfig(delta=0.1), cands([-2.0, -2.5, -3.5], best_finished=-1.8), [False, False, False]),
    # early stop: below the best finished log-prob can never catch up
    (PruningConfig(early_stop=True), cands([-1.0, -2.0, -3.0], best_finished=-2.5), [True, True, False]),
    # combined: every mask applies
    (PruningConfig(ap=2.0, mc=1), cands([-1.0, -1.5, -2.0, -3.5], beams=[0, 0, 1, 2]), [True, False, True, False]),
    # absent candidates (-inf) are never kept
    (PruningConfig(), cands([-1.0, INF]), [True, False]),
    (PruningConfig(mc=1), cands([-1.0, INF, -2.0], beams=[0, 0, 0]), [True, False, False]),
])
def test_keep_mask(cfg: PruningConfig, candidates: RunningCandidates, expected: list[bool]) -> None:
    before = candidates.scores.clone()
    assert keep_mask(candidates, cfg)[0].tolist() == expected
    assert torch.equal(candidates.scores, before)


def test_all_off_keeps_every_live_candidate() -> None:
    c = cands([-0.1, -5.0, -40.0, INF], beams=[0, 0, 0, 0])
    assert keep_mask(c, PruningConfig())[0].tolist() == [True, True, True, False]
    assert not PruningConfig().active


@pytest.mark.parametrize("kwargs", [dict(rp=0.0), dict(rp=1.5), dict(rpl=0.0), dict(ap=-1.0), dict(delta=-0.5),
                                    dict(mc=0)])
def test_invalid_pruning_configs_raise(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        PruningConfig(**kwargs)


def test_signature_names_active_heuristics() -> None:
    assert PruningConfig().signature() == "none"
    assert PruningConfig(ap=2.5, mc=3, early_stop=True).signature() == "ap:2.5|mc:3|early_stop"


# --------------------------------------------------------------------------- pruning inside beam search

# After (): A .5, B .3, C .15, D .05. The absolute threshold ap=1.0 keeps A and B only
# (log .15 = -1.90 <= log .5 - 1 = -1.69), so C's continuation (C E, p .15) is never expanded;
# after step 1 it also drops B A (log .12 <= log .4 - 1).
# Exact K=3: step 1 ranks A B .4, B E .18, C E .15, B A .12, A E .1 -> n-best A B E, B E, C E.
WIDE = {
    (): {A: .5, B: .3, C: .15, D: .05},
    (A,): {E: .2, B: .8},
    (B,): {E: .6, A: .4},
    (C,): {E: 1.0},
    (D,): {E: 1.0},
    (A, B): {E: 1.0},
    (B, A): {E: 1.0},
}


def _batch(length: int, *keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    src_ids = torch.tensor([[key] * length for key in keys], dtype=torch.long)
    return src_ids, torch.ones_like(src_ids, dtype=torch.bool)


def test_absolute_threshold_shrinks_the_beam_and_counts_pruned() -> None:
    cfg = SearchConfig(beam_size=3, num_hypotheses=3, length_penalty=0.0)
    exact_model, pruned_model = ScriptedModel(scripted({7: WIDE})), ScriptedModel(scripted({7: WIDE}))
    exact = decode(beam_search, exact_model, cfg, [(7, 3)])[0]
    stats = DecodeStats()
    pruned = beam_search(pruned_model, *_batch(3, 7), replace(cfg, pruning=PruningConfig(ap=1.0)), stats=stats)[0]
    assert [h.tokens for h in exact] == [(A, B, E), (B, E), (C, E)]
    assert [h.tokens for h in pruned] == [(A, B, E), (B, E)]
    assert stats.pruned == 2  # C at step 0, B A at step 1
    assert sum(pruned_model.rows_per_step) < sum(exact_model.rows_per_step)


@pytest.mark.parametrize("seed", range(4))
def test_pruning_off_is_bit_identical_and_loose_pruning_changes_nothing(seed: int) -> None:
    """Random tables: no heuristic == exact; thresholds too loose to bite == exact too."""
    cfg = SearchConfig(beam_size=4, num_hypotheses=4, max_decoding_length=5, max_length_b=5)
    sources = [(k, 2 + k % 3) for k in range(5)]
    exact = decode(beam_search, ScriptedModel(random_tables(seed, 7), vocab_size=7), cfg, sources)
    for pruning in (PruningConfig(), PruningConfig(ap=1e6, rp=1e-30, rpl=1e-30, mc=4, delta=1e6)):
        model = ScriptedModel(random_tables(seed, 7), vocab_size=7)
        src_ids = torch.full((len(sources), 4), model.config.pad_token_id, dtype=torch.long)
        src_mask = torch.zeros_like(src_ids, dtype=torch.bool)
        for i, (key, n) in enumerate(sources):
            src_ids[i, :n], src_mask[i, :n] = key, True
        assert beam_search(model, src_ids, src_mask, replace(cfg, pruning=pruning)) == exact


@pytest.mark.parametrize("pruning", [PruningConfig(ap=0.5), PruningConfig(rp=0.3), PruningConfig(rpl=0.2),
                                     PruningConfig(mc=1), PruningConfig(delta=0.7), PruningConfig(early_stop=True)])
def test_each_heuristic_expands_no_more_than_exact(pruning: PruningConfig) -> None:
    cfg = SearchConfig(beam_size=4, num_hypotheses=1, max_decoding_length=6, max_length_b=6, length_penalty=0.0)
    sources = [(k, 3) for k in range(6)]
    exact_stats, pruned_stats = DecodeStats(), DecodeStats()
    decode(beam_search, ScriptedModel(random_tables(3, 7), vocab_size=7), cfg, sources, stats=exact_stats)
    out = decode(beam_search, ScriptedModel(random_tables(3, 7), vocab_size=7), replace(cfg, pruning=pruning),
                 sources, stats=pruned_stats)
    assert pruned_stats.row_steps <= exact_stats.row_steps
    assert all(len(h) == 1 for h in out)
