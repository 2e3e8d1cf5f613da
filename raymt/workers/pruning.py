"""Beam pruning heuristics as pure functions: (candidates, config) -> keep mask.

Freitag & Al-Onaizan (2017), applied to the running candidates a beam step selected (the
candidate list ``C``, sorted best first), with the step's best candidate as reference:

* ``rp``  relative threshold:  prune if ``p(cand) <= rp * max_c p(c)``, i.e. ``score <= best + log rp``;
* ``ap``  absolute threshold:  prune if ``score <= best - ap`` (log space);
* ``rpl`` relative local:      prune if ``p_w(cand) <= rpl * max_c p_w(c)`` on the last word's prob;
* ``mc``  max candidates per node: keep at most ``mc`` candidates with the same history.

Yang et al. (2020) variants: ``delta`` prunes ``score < best - delta`` where the best may be a
hypothesis that already finished (its raw log-prob); ``max_candidates`` is their ``M`` (same
rule as ``mc``). ``early_stop`` prunes running candidates whose log-prob already fell below the
best finished hypothesis's log-prob (exact when the length penalty is 0: scores only decrease).

Every heuristic is off by default; with all off, ``keep`` is all-true and search is exact.
Shapes: B sentences, K running candidates per sentence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from raymt.workers.config import PruningConfig

NEG_INF = float("-inf")


@dataclass(frozen=True)
class RunningCandidates:
    """The candidates a step keeps running, per sentence, best first; absent slots score -inf.

    scores (B, K) cumulative log-probs; word_log_probs (B, K) the last token's log-prob;
    beams (B, K) source beam (history); best (B,) the step's best candidate score (EOS included);
    best_finished (B,) raw log-prob of the best finished hypothesis so far (-inf if none).
    """

    scores: Tensor
    word_log_probs: Tensor
    beams: Tensor
    best: Tensor
    best_finished: Tensor


def relative_threshold(c: RunningCandidates, rp: float) -> Tensor:
    return c.scores > c.best[:, None] + math.log(rp)


def absolute_threshold(c: RunningCandidates, ap: float) -> Tensor:
    return c.scores > c.best[:, None] - ap


def relative_local_threshold(c: RunningCandidates, rpl: float) -> Tensor:
    live = torch.isfinite(c.scores)
    best_word = c.word_log_probs.masked_fill(~live, NEG_INF).max(dim=1, keepdim=True).values  # (B, 1)
    return c.word_log_probs > best_word + math.log(rpl)


def max_candidates_per_node(c: RunningCandidates, mc: int) -> Tensor:
    """Keep a candidate unless ``mc`` better ones (earlier in the sorted list) share its source beam."""
    same = c.beams[:, :, None] == c.beams[:, None, :]  # (B, K, K): [i, j] same history
    earlier = torch.ones_like(same[0]).tril(-1).bool()  # (K, K): j < i
    live = torch.isfinite(c.scores)[:, None, :]  # (B, 1, K)
    better_same = (same & earlier & live).sum(dim=2)  # (B, K)
    return better_same < mc


def delta_threshold(c: RunningCandidates, delta: float) -> Tensor:
    reference = torch.maximum(c.best, c.best_finished)  # (B,)
    return c.scores >= reference[:, None] - delta


def below_best_finished(c: RunningCandidates) -> Tensor:
    return c.scores >= c.best_finished[:, None]


def keep_mask(c: RunningCandidates, cfg: PruningConfig) -> Tensor:
    """(B, K) bool: running candidates that survive every enabled heuristic (and are not absent)."""
    keep = torch.isfinite(c.scores)
    if cfg.rp is not None:
        keep &= relative_threshold(c, cfg.rp)
    if cfg.ap is not None:
        keep &= absolute_threshold(c, cfg.ap)
    if cfg.rpl is not None:
        keep &= relative_local_threshold(c, cfg.rpl)
    if cfg.mc is not None:
        keep &= max_candidates_per_node(c, cfg.mc)
    if cfg.delta is not None:
        keep &= delta_threshold(c, cfg.delta)
    if cfg.early_stop:
        keep &= below_best_finished(c)
    return keep
