"""Each pruning heuristic on hand-built candidate lists, then inside beam search on scripted tables."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from tests.workers.scripted import (
    A,
    B,
    C,
    D,
    E,
    ScriptedModel,
    decode,
    random_tables,
    scripted,
)
from raymt.workers.config import PruningConfig, SearchConfig
from raymt.workers.engine import DecodeStats
from tests.workers.reference_decoding import beam_search
from raymt.workers.pruning import RunningCandidates, keep_mask

INF = float("-inf")


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
def test_invalid_configs_raise(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        PruningConfig(**kwargs)


def test_signature_names_active_heuristics() -> None:
    assert PruningConfig().signature() == "none"
    assert PruningConfig(ap=2.5, mc=3, early_stop=True).signature() == "ap:2.5|mc:3|early_stop"


# --------------------------------------------------------------------------- inside beam search

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


def test_absolute_threshold_shrinks_the_beam_and_counts_pruned() -> None:
    cfg = SearchConfig(beam_size=3, num_hypotheses=3, length_penalty=0.0)
    exact_model, pruned_model = ScriptedModel(scripted({7: WIDE})), ScriptedModel(scripted({7: WIDE}))
    exact = decode(beam_search, exact_model, cfg, [(7, 3)])[0]
    stats = DecodeStats()
    pruned = beam_search(pruned_model, *_batch(pruned_model, 7), replace(cfg, pruning=PruningConfig(ap=1.0)),
                         stats=stats)[0]
    assert [h.tokens for h in exact] == [(A, B, E), (B, E), (C, E)]
    assert [h.tokens for h in pruned] == [(A, B, E), (B, E)]
    assert stats.pruned == 2  # C at step 0, B A at step 1
    assert sum(pruned_model.rows_per_step) < sum(exact_model.rows_per_step)


def _batch(model: ScriptedModel, key: int, length: int = 3):
    src_ids = torch.full((1, length), key, dtype=torch.long)
    return src_ids, torch.ones_like(src_ids, dtype=torch.bool)


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
