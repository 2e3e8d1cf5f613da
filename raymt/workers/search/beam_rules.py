"""The beam-search rules: what decides a search's outcome besides the model's scores, in one place.

The rules follow HF ``generate``'s beam search (transformers >= 4.50), so outputs can be checked
token for token against it:

* **length normalisation**: a finished hypothesis scores ``sum_logprob / generated ** length_penalty``,
  EOS counted (``length_norms``: the table of ``n ** length_penalty`` a decode reads);
* **finished pools**: each sentence keeps its K best finished hypotheses, best first, as records
  (normalised score, -inf = empty; log-prob; length; last token) (``finished_records``); a step's
  finishers merge after the old entries, in candidate order, by a stable sort on the score, as HF's
  beam hypotheses add them one by one (``merge_order``); ``PoolSummary`` is what the stop test and
  pruning read of a pool;
* **the stop test** (``stop_mask``): a sentence is done at its length cap, when no running beam is
  left, or when its pool holds K and its best running beam, normalised at the current length,
  cannot beat the worst of them (HF's heuristic, ``early_stopping=False``); with
  ``early_stopping=True``, as soon as its pool holds K;
* **pruning** (``keep_mask``; every heuristic off by default, and with all off search is exact):
  Freitag & Al-Onaizan (2017), applied to the running candidates a step selected, sorted best first,
  with the step's best candidate (EOS included) as reference:

  - ``rp``  relative threshold: prune if ``p(cand) <= rp * max_c p(c)``, i.e. ``score <= best + log rp``;
  - ``ap``  absolute threshold: prune if ``score <= best - ap`` (log space);
  - ``rpl`` relative local: prune if ``p_w(cand) <= rpl * max_c p_w(c)`` on the last word's prob;
  - ``mc``  max candidates per node: keep at most ``mc`` candidates with the same history;

  Yang et al. (2020): ``delta`` prunes ``score < best - delta`` where the best may be a hypothesis
  that already finished (its raw log-prob); their ``M`` is ``mc``. ``early_stop`` prunes running
  candidates whose log-prob already fell below the best finished hypothesis's log-prob (exact when
  the length penalty is 0: scores only decrease).

``BeamRules`` is one search's settings of these rules, built once per decode; ``BeamRules.packed``
holds the same settings as the native beam step's one argument (``workers/kernels/csrc/beam_step.cpp``'s
``struct BeamRules``, laid out as ``PACKED_FIELDS``). The Python step (every device: the CPU's ATen
path, a GPU's Triton or ATen path, the static step) calls the functions here; the native kernel is
their C++ form, checked against them to the bit (``tests/workers/test_beam_step.py``).

Pure functions: no model, no IO, inputs never mutated. Dimension letters: B sentences, K beam.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from raymt.workers.config import PruningConfig, SearchConfig

NEG_INF = float("-inf")
SCORE, LOG_PROB, LENGTH, TOKEN = range(4)  # the fields of a finished pool's record
RECORD = 4  # values per record (float64)
PACKED_FIELDS = ("num_hypotheses", "early_stopping", "rp", "ap", "rpl", "mc", "delta", "early_stop")


@dataclass(frozen=True, slots=True)
class BeamRules:
    """A search's rules: ``num_hypotheses`` returned per sentence (at most the pool's K),
    ``length_penalty`` (alpha), ``early_stopping`` (HF's: False the heuristic stop, True stop at K
    finished) and ``pruning``. ``packed``: the settings as ``PACKED_FIELDS`` floats, made once, for
    the native beam step (NaN: a heuristic off; booleans 0 / 1)."""

    num_hypotheses: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = False
    pruning: PruningConfig = PruningConfig()
    packed: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.num_hypotheses < 1:
            raise ValueError(f"num_hypotheses must be >= 1, got {self.num_hypotheses}")
        p = self.pruning
        off = math.nan
        values = (self.num_hypotheses, self.early_stopping, p.rp, p.ap, p.rpl, p.mc, p.delta, p.early_stop)
        object.__setattr__(self, "packed", tuple(off if v is None else float(v) for v in values))

    @classmethod
    def of(cls, search: SearchConfig) -> BeamRules:
        return cls(search.num_hypotheses, search.length_penalty, search.early_stopping, search.pruning)


# --------------------------------------------------------------------------- length normalisation

def length_norms(length_penalty: float, size: int, device: torch.device | str = "cpu") -> Tensor:
    """(size,) float64 ``n ** length_penalty`` for n = 0 .. size - 1 (1 at 0): a finished
    hypothesis of n generated tokens scores its log-prob divided by entry n."""
    return torch.tensor([float(n) ** length_penalty if n else 1.0 for n in range(size)], dtype=torch.float64,
                        device=device)


# --------------------------------------------------------------------------- finished pools

def finished_records(log_prob: Tensor, generated: Tensor, norm: Tensor, tokens: Tensor) -> Tensor:
    """Pool records (B, K, 4) float64 of a step's candidates: log_prob (B, K) float64 raw log-probs,
    -inf where a candidate does not finish; generated (B,) tokens after this step; norm (B,) float64
    ``generated ** length_penalty``; tokens (B, K) each candidate's last token."""
    b, k = log_prob.shape
    return torch.stack([log_prob / norm[:, None], log_prob, generated[:, None].expand(b, k).double(),
                        tokens.double()], 2)


def merge_order(pool: Tensor, new: Tensor) -> Tensor:
    """Which K of the old entries and the new records make the merged pool, best first: pool and new
    (B, K, 4) records -> (B, K) indices into their concatenation (old 0 .. K-1, new K .. 2K-1). A
    stable sort by score: equal scores keep old before new and new in candidate order."""
    k = pool.shape[1]
    scores = torch.cat([pool[:, :, SCORE], new[:, :, SCORE]], 1)  # (B, 2K)
    return scores.sort(dim=1, descending=True, stable=True).indices[:, :k]


@dataclass(frozen=True, slots=True)
class PoolSummary:
    """What the stop test and pruning read of a pool (B,): best_log_prob the best raw log-prob
    (-inf if none); worst the worst kept normalised score (float64; -inf until full); full."""

    best_log_prob: Tensor
    worst: Tensor
    full: Tensor

    @classmethod
    def of(cls, pool: Tensor) -> PoolSummary:
        """pool (B, K, 4) records, best first."""
        worst = pool[:, -1, SCORE]
        return cls(pool[:, :, LOG_PROB].max(1).values, worst, torch.isfinite(worst))


# --------------------------------------------------------------------------- stop test

def stop_mask(best: Tensor, at_max: Tensor, pool: PoolSummary, norm: Tensor | float, early_stopping: bool) -> Tensor:
    """HF's ``is_done`` for every sentence at once (B,) bool: at its cap, out of running beams, or a
    full pool whose worst entry (float64) the best running beam, normalised now (divided by
    ``norm`` = generated ** length_penalty), cannot beat (or, ``early_stopping``, any full pool).
    best (B,) each sentence's best running score; at_max (B,) bool."""
    beaten = best.double() / norm <= pool.worst
    return at_max | ~torch.isfinite(best) | (pool.full & (beaten | early_stopping))


# --------------------------------------------------------------------------- pruning

@dataclass(frozen=True, slots=True)
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
