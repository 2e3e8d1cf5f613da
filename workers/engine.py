"""Decoding loops around the model: encode once, then step the decoder until every sentence is done.

``greedy_search`` and ``beam_search`` run one batch of sentences; finished sentences leave the
batch (their rows are dropped from the cache) so later steps only pay for live rows. The step
math lives in ``workers.search``; this module only moves tensors between it and the model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from workers.config import SearchConfig
from workers.model import MarianModel
from workers.search import (FinishedPool, Hypothesis, is_done, length_normalize, normalized_log_probs,
                            select_step, top_candidates)


@dataclass
class DecodeStats:
    """Counters of one decoding call (the scheduler issue extends these)."""

    steps: int = 0
    row_steps: int = 0  # decoder rows expanded, summed over steps
    target_tokens: int = 0


def _max_lengths(src_mask: Tensor, cfg: SearchConfig) -> list[int]:
    return [cfg.max_length_for(int(n)) for n in src_mask.sum(1).tolist()]


@torch.inference_mode()
def greedy_search(model: MarianModel, src_ids: Tensor, src_mask: Tensor, cfg: SearchConfig,
                  *, forced_eos: bool = True, stats: DecodeStats | None = None) -> list[list[Hypothesis]]:
    """Argmax decoding. src_ids, src_mask (B, S) -> one hypothesis per sentence."""
    mc, stats = model.config, stats or DecodeStats()
    b = src_ids.shape[0]
    max_lens = _max_lengths(src_mask, cfg)
    cache = model.init_cache(model.encode(src_ids, src_mask), src_mask, max(max_lens))
    active = list(range(b))
    last = torch.full((b,), mc.decoder_start_token_id, dtype=torch.long)
    history = torch.full((b, max(max_lens)), mc.pad_token_id, dtype=torch.long)  # (N, T)
    sums = torch.zeros(b, dtype=torch.float64)
    results: list[list[Hypothesis]] = [[] for _ in range(b)]
    for step in range(max(max_lens)):
        n = len(active)
        at_max = torch.tensor([step + 1 >= max_lens[s] for s in active])
        logits = model.decode_step(last, torch.full((n,), step, dtype=torch.long), cache)  # (N, V)
        lp = normalized_log_probs(logits, mc.pad_token_id, at_max if forced_eos else None, mc.eos_token_id)
        best_lp, tokens = lp.max(dim=-1)  # (N,)
        sums += best_lp.double()
        history[:, step] = tokens
        stats.steps, stats.row_steps = stats.steps + 1, stats.row_steps + n
        ended = (tokens == mc.eos_token_id) | at_max
        for j in ended.nonzero().flatten().tolist():
            total = float(sums[j])
            results[active[j]] = [Hypothesis(tuple(history[j, : step + 1].tolist()),
                                             length_normalize(total, step + 1, cfg.length_penalty), total)]
        keep = (~ended).nonzero().flatten()
        if keep.numel() == 0:
            break
        if keep.numel() < n:
            cache = cache.select(keep, step + 1)
            active = [active[j] for j in keep.tolist()]
            history, sums = history[keep], sums[keep]
        last = tokens[keep]
    stats.target_tokens += sum(len(r[0].tokens) for r in results)
    return results


@torch.inference_mode()
def beam_search(model: MarianModel, src_ids: Tensor, src_mask: Tensor, cfg: SearchConfig,
                *, forced_eos: bool = True, stats: DecodeStats | None = None) -> list[list[Hypothesis]]:
    """Exact fixed-width beam search (HF semantics, see ``workers.search``).

    src_ids, src_mask (B, S) -> per sentence the ``cfg.num_hypotheses`` best hypotheses, best first.
    """
    mc, stats, k = model.config, stats or DecodeStats(), cfg.beam_size
    b = src_ids.shape[0]
    max_lens = _max_lengths(src_mask, cfg)
    t_max = max(max_lens)
    memory = model.encode(src_ids, src_mask)  # (B, S, E)
    cache = model.init_cache(memory.repeat_interleave(k, 0), src_mask.repeat_interleave(k, 0), t_max)
    active = list(range(b))
    pools = [FinishedPool(k) for _ in range(b)]
    last = torch.full((b * k,), mc.decoder_start_token_id, dtype=torch.long)  # (N,) with N = B*K
    history = torch.full((b * k, t_max), mc.pad_token_id, dtype=torch.long)  # (N, T)
    running = torch.zeros(b, k)
    running[:, 1:] = float("-inf")  # all beams start equal: expand only the first
    for step in range(t_max):
        n = len(active)
        at_max = torch.tensor([step + 1 >= max_lens[s] for s in active])  # (B',)
        logits = model.decode_step(last, torch.full((n * k,), step, dtype=torch.long), cache)  # (N, V)
        force = at_max.repeat_interleave(k) if forced_eos else None
        lp = normalized_log_probs(logits, mc.pad_token_id, force, mc.eos_token_id).view(n, k, -1)
        cands = top_candidates(lp, running, 2 * k)
        sel = select_step(cands, mc.eos_token_id, at_max, k)
        stats.steps, stats.row_steps = stats.steps + 1, stats.row_steps + n * k
        for j, c in sel.finished.nonzero().tolist():
            total = float(cands.scores[j, c])
            row = j * k + int(cands.beams[j, c])
            tokens = tuple(history[row, :step].tolist()) + (int(cands.tokens[j, c]),)
            pools[active[j]].add(Hypothesis(tokens, length_normalize(total, step + 1, cfg.length_penalty), total))
        running = sel.running_scores  # (B', K)
        source_beam = cands.beams.gather(1, sel.running)  # (B', K)
        new_tokens = cands.tokens.gather(1, sel.running)  # (B', K)
        keep = [j for j, s in enumerate(active) if not at_max[j] and not is_done(
            pools[s], float(running[j, 0]), step + 1, cfg.length_penalty, cfg.early_stopping)]
        if not keep:
            break
        keep_t = torch.tensor(keep)
        rows = (keep_t[:, None] * k + source_beam[keep_t]).view(-1)  # (N',) old row of each new row
        cache = cache.select(rows, step + 1, cross=len(keep) < n)
        history = history[rows]
        history[:, step] = new_tokens[keep_t].view(-1)
        last, running = new_tokens[keep_t].view(-1), running[keep_t]
        active = [active[j] for j in keep]
    stats.target_tokens += sum(len(p.hyps[0].tokens) for p in pools if p.hyps)
    return [p.hyps[: cfg.num_hypotheses] for p in pools]
