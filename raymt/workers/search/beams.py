"""The beam-search state of the engine's slots, kept on the model's device, and its step update.

Per slot (a sentence being decoded): running (slots, K) cumulative log-probs, live beams first
(-inf = no beam); last (R,) each row's next input token; and its finished pool, the K best
finished hypotheses, best first: ``pool`` (slots, K, 4) float64 records (normalised score, -inf =
empty; log-prob; length; last token) and ``pool_tokens`` (slots, K, T) the tokens before the last.
Pools live on the device too, so a step never reads anything back: finished candidates merge into
the pools tensor-wide, and the pools' best entries come back with the step's one copy
(``Readback``).

Tensors in, state updated in place; the search math itself is ``raymt.workers.search.selection`` (pure step
functions) and ``raymt.workers.search.beam_rules`` (the pools' records and merge, pruning, the stop test).

Dimension letters: B' planned slots, K beam, C = 2K candidates, N run rows, T pool token capacity.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from raymt.workers.search.beam_rules import (LOG_PROB, NEG_INF, RECORD, SCORE, BeamRules, PoolSummary, RunningCandidates,
                                      finished_records, keep_mask, merge_order)
from raymt.workers.model.cache import KVCache
from raymt.workers.config import PruningConfig
from raymt.workers.search.selection import Candidates, GreedySelection, Hypothesis, RowTop, StepSelection
from raymt.workers.search.step_index import StepIndex

LONG = torch.long


@dataclass
class SlotState:
    """The slots' search state (see the module docstring for each tensor)."""

    running: Tensor
    last: Tensor
    pool: Tensor
    pool_tokens: Tensor
    pruned: Tensor  # () running candidates discarded by pruning, summed (read once per decode)
    done: Tensor  # (slots,) bool: finished on the device, not yet read back (the static step's deferred readback)
    keys: Tensor  # (slots,) int64: each sentence's sampling key (``raymt.workers.search.sampling.sentence_key``)

    @classmethod
    def empty(cls, slots: int, k: int, t_cap: int, pad: int, device: torch.device) -> "SlotState":
        pool = torch.zeros(slots, k, RECORD, dtype=torch.float64, device=device)
        pool[..., SCORE] = NEG_INF
        return cls(torch.full((slots, k), NEG_INF, device=device), torch.full((slots * k,), pad, dtype=LONG, device=device),
                   pool, torch.full((slots, k, t_cap), pad, dtype=LONG, device=device),
                   torch.zeros((), dtype=LONG, device=device), torch.zeros(slots, dtype=torch.bool, device=device),
                   torch.zeros(slots, dtype=LONG, device=device))

    def admit(self, slots: Tensor, start: int, keys: Tensor | None = None) -> None:
        """Fresh sentences in ``slots`` (A,): one live beam at score 0 fed the start token, empty pools;
        ``keys`` (A,) their sampling keys (sampling only)."""
        k = self.running.shape[1]
        self.running[slots] = NEG_INF
        self.running[slots, 0] = 0.0
        self.pool[slots, :, SCORE] = NEG_INF
        self.pool[slots, :, LOG_PROB] = NEG_INF
        self.last[slots * k] = start
        self.done[slots] = False
        if keys is not None:
            self.keys[slots] = keys

    def pool_summary(self, slots: Tensor) -> PoolSummary:
        """What the stop test and pruning read of the planned slots' pools (B',)."""
        return PoolSummary.of(self.pool[slots])  # (B', K, 4)

    def add_finished(self, slots: Tensor, cands: Candidates, sel: StepSelection, generated: Tensor, norm: Tensor,
                     history: Tensor) -> None:
        """Merge this step's finished candidates into the planned slots' pools, as HF's beam
        hypotheses do one by one (a stable sort over the old entries, then the new in candidate order).

        generated (B',) tokens each sentence has after this step; norm (B',) float64 generated ** lp;
        history (B', K, t') the source beam's tokens of each of the first K candidates (the only
        ones that may finish: ``select_step``); a candidate's own token is its record's TOKEN.
        """
        k, t = self.running.shape[1], history.shape[2]
        b = cands.scores.shape[0]
        log_prob = cands.scores[:, :k].masked_fill(~sel.finished[:, :k], NEG_INF).double()  # (B', K)
        old = self.pool[slots]  # (B', K, 4)
        new = finished_records(log_prob, generated, norm, cands.tokens[:, :k])  # (B', K, 4)
        order = merge_order(old, new)[:, :, None]  # (B', K, 1)
        self.pool[slots] = torch.cat([old, new], 1).gather(1, order.expand(b, k, RECORD))
        if t:
            tokens = torch.cat([self.pool_tokens[slots, :, :t], history], 1)  # (B', 2K, t')
            self.pool_tokens[slots, :, :t] = tokens.gather(1, order.expand(b, k, t))

    def greedy_update(self, slots: Tensor, sel: GreedySelection, generated: Tensor, norm: Tensor | None,
                      history: Tensor | None) -> None:
        """Beam 1 (slot j's one row is row j): the chosen tokens and scores become the running state;
        ``history`` (B', t') and ``norm`` given (some sentence is done): the finished ones'
        hypotheses enter their one-entry pools (a done sentence without one keeps an empty pool).
        generated (B',); norm (B',) float64 generated ** lp, the records as ``add_finished`` writes them."""
        self.last[slots] = sel.tokens
        self.running[slots, 0] = sel.scores
        if history is None:
            return
        log_prob = sel.scores.masked_fill(~sel.finished, NEG_INF).double()  # (B',)
        self.pool[slots, 0] = finished_records(log_prob[:, None], generated, norm, sel.tokens[:, None])[:, 0]
        if history.shape[1]:
            self.pool_tokens[slots, 0, :history.shape[1]] = history

    def fused_step(self, kernel, top: RowTop, ix: StepIndex, norm: Tensor, cache: KVCache, rules: BeamRules,
                   eos: int) -> Tensor:
        """The whole step after the output layer in one native call (``workers/kernels/csrc/beam_step.cpp``,
        the CPU's ``NativeOps.beam_kernel``; beam 1 too): candidates, finished pools, pruning, stop test,
        reorder, as the Python path computes them -> the packed readback (``Readback.gather``).
        top (N, 2K) the run rows' best; norm the whole generated ** lp table (float64); ``rules``
        travel as their one packed argument (``BeamRules.packed``)."""
        return kernel(top.log_probs.contiguous(), top.tokens.contiguous(), ix.grid, ix.slots, ix.generated, ix.at_max,
                      norm, self.running, self.last, self.pool, self.pool_tokens, cache.ancestry, cache.tokens, ix.t,
                      eos, rules.packed, self.pruned)

    def prune(self, cands: Candidates, sel: StepSelection, best_finished: Tensor, pruning: PruningConfig,
              planned: Tensor | None = None) -> Tensor:
        """Running scores (B', K) with the candidates the heuristics discard set to -inf; the
        discarded count is added to ``pruned`` on the device. best_finished (B',) raw log-prob;
        planned (B',) bool: the slots whose discards count (None: all; a static step runs others)."""
        running = sel.running_scores
        if not pruning.active:
            return running
        source_beam, word = cands.beams.gather(1, sel.running), cands.word_log_probs.gather(1, sel.running)  # (B', K)
        keep = keep_mask(RunningCandidates(running, word, source_beam, cands.scores[:, 0], best_finished), pruning)
        discarded = torch.isfinite(running) & ~keep  # (B', K)
        self.pruned += (discarded if planned is None else discarded & planned[:, None]).sum()
        return running.masked_fill(~keep, NEG_INF)


@dataclass(frozen=True)
class Readback:
    """What one step reads back from the device, in one copy: per planned sentence done, its new
    live width, and its pool's ``nbest`` best entries (records and tokens)."""

    done: list[bool]
    widths: list[int]
    rows: Tensor  # (B', 2 + nbest * (4 + t')) int64 on the host

    @staticmethod
    def gather(state: SlotState, slots: Tensor, done: Tensor, widths: Tensor, nbest: int, t: int,
               results: bool = True) -> Tensor:
        """The step's outcome as one int64 tensor on the device (B', 2 [+ nbest * (4 + t)]);
        ``results=False`` (no sentence is done: known for free on the CPU) leaves the pools out."""
        b = slots.shape[0]
        parts = [done[:, None].to(LONG), widths[:, None]]
        if results:
            parts.append(state.pool[slots, :nbest].view(LONG).view(b, -1))  # float64 bits ride as int64
            parts.append(state.pool_tokens[slots, :nbest, :t].reshape(b, -1))
        return torch.cat(parts, 1)

    @classmethod
    def read(cls, packed: Tensor) -> "Readback":
        """``gather``'s tensor copied to the host: the step's one copy."""
        return cls.of(packed.cpu())

    @classmethod
    def of(cls, host: Tensor) -> "Readback":
        """``gather``'s tensor, already on the host."""
        head = host[:, :2].tolist()
        return cls([bool(d) for d, _ in head], [w for _, w in head], host)

    def hypotheses(self, j: int, nbest: int, t: int) -> list[Hypothesis]:
        """Sentence j's finished hypotheses, best first."""
        row = self.rows[j]
        records = row[2: 2 + RECORD * nbest].view(torch.float64).view(nbest, RECORD).tolist()
        tokens = row[2 + RECORD * nbest:].view(nbest, t).tolist()
        return [Hypothesis(tuple(tokens[i][: int(length) - 1]) + (int(token),), score, log_prob)
                for i, (score, log_prob, length, token) in enumerate(records) if score != NEG_INF]
