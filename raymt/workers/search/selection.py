"""Pure beam-search step functions: each row's best tokens, a sentence's candidates, their split
into running and finishing. No model, no IO, inputs never mutated.

The step follows HF ``generate`` (transformers >= 4.50 beam search), so our outputs can be checked
token for token against it:

* every step takes the top ``2K`` continuations over all ``K x V`` (so EOS cannot starve the beam);
* a candidate that ends (EOS, or reaching the length cap) becomes a finished hypothesis only if it
  ranks among the first ``K``; the best ``K`` non-ending candidates stay running;
* a sentence's first token may be forced (HF's ``forced_bos_token_id``, per row here: an M2M100 /
  NLLB target language): log-prob 0, nothing else possible, and counted in the length as HF counts it.

What happens to the finishers and the running beams after that (length normalisation, the finished
pools, pruning, the stop test) is ``workers/search/beam_rules.py``.

Dimension letters: B sentences, K beam, V vocab, C = 2K candidates.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from raymt.workers.search.beam_rules import NEG_INF
from raymt.workers.model.step_ops import ATEN, AtenOps


@dataclass(frozen=True)
class RowTop:
    """The best ``M`` next tokens of every decoder row: log_probs (N, M) best first, tokens (N, M)."""

    log_probs: Tensor
    tokens: Tensor


def force_eos_rows(top: RowTop, force_eos: Tensor | None, eos_id: int) -> RowTop:
    """Rows where ``force_eos`` (N,) is set keep only EOS, at log-prob 0 (HF's ForcedEOS processor)."""
    if force_eos is None:  # (no check that any row is forced: that would read the device back)
        return top
    forced_lp = torch.full_like(top.log_probs, NEG_INF)
    forced_lp[:, 0] = 0.0
    forced_tok = torch.full_like(top.tokens, eos_id)
    return RowTop(torch.where(force_eos[:, None], forced_lp, top.log_probs),
                  torch.where(force_eos[:, None], forced_tok, top.tokens))


def force_first_rows(top: RowTop, forced: Tensor | None) -> RowTop:
    """Rows where ``forced`` (N,) holds a token id (-1: none) keep only that token, at log-prob 0: HF's
    ``ForcedBOSTokenLogitsProcessor`` (``forced_bos_token_id``: every score -inf but the forced one's 0)
    at a sentence's first generated step, per row (M2M100 / NLLB: each row's target language)."""
    if forced is None:
        return top
    on = (forced >= 0)[:, None]  # (N, 1)
    forced_lp = torch.full_like(top.log_probs, NEG_INF)
    forced_lp[:, 0] = 0.0
    return RowTop(torch.where(on, forced_lp, top.log_probs),
                  torch.where(on, forced[:, None].expand_as(top.tokens), top.tokens))


def row_top_log_probs(logits: Tensor, num: int, pad_id: int, force_eos: Tensor | None = None,
                      eos_id: int = 0, token_ids: Tensor | None = None, ops: AtenOps = ATEN,
                      skip: int | None = None, forced: Tensor | None = None) -> RowTop:
    """Output step: logits (N, V) -> each row's ``num`` best log-probs, ``<pad>`` banned.

    One log-softmax (``<pad>`` included in the normaliser, as HF normalises before banning), one
    top-k, by ``ops`` (``workers/model/step_ops.py``: ATen, or the native kernels' one C++ pass pair per
    row with the same values). On CPU torch's vectorised log-softmax costs less than a separate
    logsumexp pass, so this beats a fused torch form (``benchmarks.search_variants.row_top_log_probs_fused``;
    benchmarks.bench_search measures both). Rows where ``force_eos`` is set get EOS at log-prob 0 and
    nothing else; rows where ``forced`` (N,) holds a token id get that token at log-prob 0 and
    nothing else (a sentence's forced first token, ``force_first_rows``; forced EOS wins where both
    apply, as HF's processors run). With a shortlist, logits are over candidate positions (N, C) and
    ``token_ids`` (C,) maps positions to vocabulary ids (a forced token is a vocabulary id, in the
    shortlist or not); ``skip``: the column of ``<pad>`` when the caller knows it (``OutputHead.skip``,
    found once per decode), else it is looked up here.
    """
    if skip is None:
        skip = pad_id if token_ids is None else _column(token_ids, pad_id)
    log_probs, columns = ops.row_top(logits, num, skip)  # (N, M)
    return finish_row_top(log_probs, columns, token_ids, force_eos, eos_id, forced)


def finish_row_top(log_probs: Tensor, columns: Tensor, token_ids: Tensor | None, force_eos: Tensor | None,
                   eos_id: int, forced: Tensor | None) -> RowTop:
    """Each row's best log-probs and their columns (N, M) -> a ``RowTop`` over vocabulary ids (a
    shortlist's columns mapped through ``token_ids``), forced first tokens and forced EOS applied
    (``row_top_log_probs``; the CPU's fused output layer computes the columns itself)."""
    tokens = columns if token_ids is None else token_ids[columns]
    return force_eos_rows(force_first_rows(RowTop(log_probs, tokens), forced), force_eos, eos_id)


def _column(token_ids: Tensor, token: int) -> int:
    """Where ``token`` sits in a candidate list (C,), or -1."""
    at = (token_ids == token).nonzero()
    return int(at[0, 0]) if at.numel() else -1


@dataclass(frozen=True)
class Candidates:
    """Top ``C`` continuations per sentence, sorted best first.

    scores (B, C) cumulative log-probs; beams (B, C) source beam; tokens (B, C) token ids;
    word_log_probs (B, C) the new token's own log-prob.
    """

    scores: Tensor
    beams: Tensor
    tokens: Tensor
    word_log_probs: Tensor | None = None


def top_candidates_from_rows(rows: RowTop, running_scores: Tensor, num_candidates: int) -> Candidates:
    """Per-row bests rows.log_probs / rows.tokens (B, K, M), running_scores (B, K) -> best over K*M.

    Equal to the dense top-k over the full log-probs (``tests/workers/search_oracles.top_candidates``)
    whenever ``M >= num_candidates``: every sentence-level winner is among its own row's best
    ``num_candidates``.
    """
    b, k, m = rows.log_probs.shape
    total = (rows.log_probs + running_scores[:, :, None]).view(b, k * m)  # (B, K*M)
    scores, flat = torch.topk(total, min(num_candidates, k * m), dim=1)  # (B, C)
    tokens = rows.tokens.reshape(b, k * m).gather(1, flat)
    words = rows.log_probs.reshape(b, k * m).gather(1, flat)
    return Candidates(scores, torch.div(flat, m, rounding_mode="floor"), tokens, words)


@dataclass(frozen=True)
class StepSelection:
    """Outcome of one beam step.

    running: indices (B, K) into the candidates that continue (scores -inf where none is left);
    finished: mask (B, C) of candidates that end here and may enter the finished pool.
    """

    running: Tensor
    running_scores: Tensor
    finished: Tensor


def select_step(cands: Candidates, eos_id: int, at_max_length: Tensor, beam_size: int) -> StepSelection:
    """Split candidates (sorted best first) into K running beams and finishing hypotheses.

    at_max_length (B,) bool: sentences whose every candidate ends here (length cap reached).
    """
    ends = (cands.tokens == eos_id) | at_max_length[:, None]  # (B, C)
    rank = torch.arange(cands.scores.shape[1], device=ends.device)[None, :]
    finished = ends & (rank < beam_size) & torch.isfinite(cands.scores)
    live_scores = cands.scores.masked_fill(ends, NEG_INF)
    running_scores, running = torch.topk(live_scores, beam_size, dim=1)  # (B, K)
    return StepSelection(running, running_scores, finished)


@dataclass(frozen=True)
class GreedySelection:
    """Outcome of one beam-1 step, per sentence (B,): scores the cumulative log-prob with the
    chosen token; tokens the chosen token; finished: it ends here as a hypothesis; done: the
    sentence stops (finished, or no finite continuation is left)."""

    scores: Tensor
    tokens: Tensor
    finished: Tensor
    done: Tensor


def greedy_select(top: RowTop, running: Tensor, at_max: Tensor, eos_id: int) -> GreedySelection:
    """Beam 1: each sentence's best token (``top`` (B, M), M >= 1, one row per sentence) continues
    or ends it. running (B,) cumulative log-probs; at_max (B,) sentences at their length cap.

    Equal to ``select_step`` + the pools + ``beam_rules.stop_mask`` at K = 1 (tested): a finished best
    candidate fills the one-entry pool, and the best running one, normalised at the same length
    and never larger, cannot beat it, so HF's stop test ends the sentence: greedy decoding."""
    scores, tokens = top.log_probs[:, 0] + running, top.tokens[:, 0]  # (B,)
    live = torch.isfinite(scores)
    ends = (tokens == eos_id) | at_max
    return GreedySelection(scores, tokens, ends & live, ends | ~live)


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # generated ids, EOS included when the hypothesis ended with it
    score: float  # length-normalised
    log_prob: float  # sum of token log-probs


def score_step(logits: Tensor, grid: Tensor | None, running: Tensor, at_max: Tensor, force: Tensor | None, mc, *,
               head, ops, forced: Tensor | None = None) -> tuple[Candidates, StepSelection]:
    """One beam step's scoring. logits (N, V|C) of the run rows; grid (N,) their entries in the
    (B' x K) layout (None: every entry runs, N = B' x K); running (B', K) cumulative scores (-inf =
    no beam); at_max (B',) sentences at their length cap; force (N,) rows that may only end (forced
    EOS; None: none does); head: the output layer (its candidate ids and ``<pad>`` column); forced (N,)
    each row's forced token, -1 none (a sentence's first token; None: no row has one)."""
    b, k = running.shape
    top = row_top_log_probs(logits, 2 * k, mc.pad_token_id, force, mc.eos_token_id, head.ids, ops,
                            skip=head.skip, forced=forced)  # (N, M)
    m = top.log_probs.shape[1]
    if k == 1:  # one row per sentence: its best M are the sentence's candidates, already sorted
        cands = Candidates(top.log_probs + running, torch.zeros_like(top.tokens), top.tokens, top.log_probs)
        return cands, select_step(cands, mc.eos_token_id, at_max, k)
    if grid is not None:  # some grid entries are empty (finished, pruned or not yet grown beams)
        grid_lp = top.log_probs.new_full((b * k, m), float("-inf"))
        grid_tokens = top.tokens.new_zeros((b * k, m))
        grid_lp[grid], grid_tokens[grid] = top.log_probs, top.tokens
        top = RowTop(grid_lp, grid_tokens)
    cands = top_candidates_from_rows(RowTop(top.log_probs.view(b, k, m), top.tokens.view(b, k, m)), running, 2 * k)
    return cands, select_step(cands, mc.eos_token_id, at_max, k)
