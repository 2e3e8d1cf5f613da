"""Test oracles of the search: the dense, per-sentence forms the engine's tensor-wide step functions
are checked against (no product code calls them)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from raymt.workers.search.selection import NEG_INF, Candidates, Hypothesis


def length_normalize(score: float, length: int, length_penalty: float) -> float:
    """HF's finished-hypothesis score: ``score / length ** length_penalty``."""
    return score / (length ** length_penalty)


def normalized_log_probs(logits: Tensor, pad_id: int, force_eos: Tensor | None = None,
                         eos_id: int = 0) -> Tensor:
    """logits (N, V) -> float32 log-probs (N, V) with ``<pad>`` banned.

    Rows where ``force_eos`` (N,) is set may only emit EOS, at log-prob 0 (HF's ForcedEOS processor,
    applied after the log-softmax as in HF beam search).
    """
    lp = torch.log_softmax(logits.float(), dim=-1)
    lp[:, pad_id] = NEG_INF
    if force_eos is not None:
        forced = torch.full_like(lp, NEG_INF)
        forced[:, eos_id] = 0.0
        lp = torch.where(force_eos[:, None], forced, lp)
    return lp


def top_candidates(log_probs: Tensor, running_scores: Tensor, num_candidates: int) -> Candidates:
    """log_probs (B, K, V), running_scores (B, K) -> the best ``num_candidates`` over K*V."""
    b, k, v = log_probs.shape
    total = (log_probs + running_scores[:, :, None]).view(b, k * v)  # (B, K*V)
    scores, flat = torch.topk(total, num_candidates, dim=1)  # (B, C)
    return Candidates(scores, torch.div(flat, v, rounding_mode="floor"), flat % v,
                      log_probs.reshape(b, k * v).gather(1, flat))


@dataclass
class FinishedPool:
    """The best ``capacity`` finished hypotheses of one sentence, best first."""

    capacity: int
    hyps: list[Hypothesis] = field(default_factory=list)

    def add(self, hyp: Hypothesis) -> None:
        self.hyps.append(hyp)
        self.hyps.sort(key=lambda h: -h.score)
        del self.hyps[self.capacity:]

    @property
    def full(self) -> bool:
        return len(self.hyps) >= self.capacity

    @property
    def best_log_prob(self) -> float:
        return max((h.log_prob for h in self.hyps), default=NEG_INF)

    @property
    def worst_score(self) -> float:
        return self.hyps[-1].score if self.full else NEG_INF


def is_done(pool: FinishedPool, best_running_score: float, generated: int, length_penalty: float,
            early_stopping: bool) -> bool:
    """HF's stop test for one sentence after ``generated`` tokens."""
    if not pool.full:
        return False
    if early_stopping:
        return True
    if not math.isfinite(best_running_score):
        return True
    return length_normalize(best_running_score, generated, length_penalty) <= pool.worst_score
