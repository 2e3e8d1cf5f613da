"""Decoding loops around the model: encode once, then step the decoder until every sentence is done.

``greedy_search`` and ``beam_search`` run one batch of sentences; finished sentences leave the
batch (their rows are dropped from the cache) so later steps only pay for live rows. The step
math lives in ``workers.search``; this module only moves tensors between it and the model.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.profiler import record_function

from workers.config import PruningConfig, SearchConfig
from workers.model import MarianModel
from workers.step_ops import ATEN, AtenOps
from workers.pruning import RunningCandidates, keep_mask
from workers.search import (
    NEG_INF,
    Candidates,
    FinishedPool,
    Hypothesis,
    RowTop,
    StepSelection,
    length_normalize,
    row_top_log_probs,
    select_step,
    top_candidates_from_rows,
)


@dataclass
class DecodeStats:
    """Counters of one decoding call (the scheduler issue extends these)."""

    steps: int = 0
    row_steps: int = 0  # decoder rows expanded (candidates = fan-out), summed over steps
    sentence_steps: int = 0  # live sentences, summed over steps
    target_tokens: int = 0
    pruned: int = 0  # running candidates discarded by pruning heuristics
    batch_sizes: Counter = field(default_factory=Counter)  # steps per number of sentences in the step

    def record_step(self, rows: int, sentences: int) -> None:
        self.steps += 1
        self.row_steps += rows
        self.sentence_steps += sentences
        self.batch_sizes[sentences] += 1


def pad_sources(sources: list[list[int]], pad_id: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Source id lists -> src_ids (B, S) padded with ``pad_id``, src_mask (B, S) bool (True = token),
    built on the host and moved to ``device`` in one copy each."""
    s = max(len(x) for x in sources)
    src_ids = torch.full((len(sources), s), pad_id, dtype=torch.long, device="cpu")
    src_mask = torch.zeros((len(sources), s), dtype=torch.bool, device="cpu")
    for row, x in enumerate(sources):
        src_ids[row, : len(x)], src_mask[row, : len(x)] = torch.tensor(x, device="cpu"), True
    return src_ids.to(device), src_mask.to(device)


INITIAL_CAPACITY = 32  # self-attention cache positions allocated up front; the cache grows past it


def max_lengths(source_lengths: list[int], cfg: SearchConfig, positions: int) -> list[int]:
    """Per-sentence cap on generated tokens, never past the model's position table."""
    return [min(cfg.max_length_for(n), positions) for n in source_lengths]


def score_step(logits: Tensor, slots: Tensor, running: Tensor, at_max: Tensor, mc, *, forced_eos: bool,
               candidates: Tensor | None, ops: AtenOps = ATEN) -> tuple[Candidates, StepSelection]:
    """One beam step's scoring, shared by the batch and streaming loops.

    logits (N, V|C) of the live beams; slots (N,) their index into the (B' * K) slot layout;
    running (B', K) cumulative scores (-inf = no beam); at_max (B',) sentences at their length cap;
    ops: the model's step operators (workers/step_ops.py).
    """
    n, k = running.shape
    force = at_max[slots // k] if forced_eos else None
    top = row_top_log_probs(logits, 2 * k, mc.pad_token_id, force, mc.eos_token_id, candidates, ops)  # (N, M)
    m = top.log_probs.shape[1]
    slot_lp = top.log_probs.new_full((n * k, m), float("-inf"))
    slot_tokens = top.tokens.new_zeros((n * k, m))
    slot_lp[slots], slot_tokens[slots] = top.log_probs, top.tokens
    cands = top_candidates_from_rows(RowTop(slot_lp.view(n, k, m), slot_tokens.view(n, k, m)), running, 2 * k)
    return cands, select_step(cands, mc.eos_token_id, at_max, k)


@torch.inference_mode()
def greedy_search(model: MarianModel, src_ids: Tensor, src_mask: Tensor, cfg: SearchConfig,
                  *, forced_eos: bool = True, candidates: Tensor | None = None,
                  stats: DecodeStats | None = None) -> list[list[Hypothesis]]:
    """Argmax decoding. src_ids, src_mask (B, S) -> one hypothesis per sentence.

    ``candidates`` (C,): a shortlist of target ids; the output layer then computes only those.
    """
    mc, stats, dev = model.config, stats or DecodeStats(), src_ids.device
    b = src_ids.shape[0]
    max_lens = max_lengths(src_mask.sum(1).tolist(), cfg, mc.max_position_embeddings)
    cache = model.init_cache(model.encode(src_ids, src_mask), src_mask, min(max(max_lens), INITIAL_CAPACITY), rows=b)
    head = model.output_head(candidates) if candidates is not None else None
    active = list(range(b))
    index, caps = torch.arange(b, device=dev), torch.tensor(max_lens, device=dev)  # index: active as a tensor
    last = torch.full((b,), mc.decoder_start_token_id, dtype=torch.long, device=dev)
    history = torch.full((b, max(max_lens)), mc.pad_token_id, dtype=torch.long, device=dev)  # (N, T)
    sums = torch.zeros(b, dtype=torch.float64, device=dev)
    results: list[list[Hypothesis]] = [[] for _ in range(b)]
    with record_function("search loop"):  # the step profile's "search": this minus the model's scopes
        for step in range(max(max_lens)):
            n = len(active)
            at_max = caps[index] <= step + 1  # (N,)
            logits = model.decode_step(last, step, cache, head)  # (N, V|C), every row at position ``step``
            top = row_top_log_probs(logits, 1, mc.pad_token_id, at_max if forced_eos else None, mc.eos_token_id,
                                    candidates, model.ops)
            best_lp, tokens = top.log_probs[:, 0], top.tokens[:, 0]  # (N,)
            sums += best_lp.double()
            history[:, step] = tokens
            stats.record_step(n, n)
            ended = (tokens == mc.eos_token_id) | at_max
            for j in ended.nonzero().flatten().tolist():
                total = float(sums[j])
                results[active[j]] = [Hypothesis(tuple(history[j, : step + 1].tolist()),
                                                 length_normalize(total, step + 1, cfg.length_penalty), total)]
            keep = (~ended).nonzero().flatten()
            if keep.numel() == 0:
                break
            if keep.numel() < n:
                with record_function("cache reorder"):
                    cache = cache.select(keep, step + 1, zero_tail=False, reuse=True)  # rows share one position
                active, index = [active[j] for j in keep.tolist()], index[keep]
                history, sums = history[keep], sums[keep]
            last = tokens[keep]
    stats.target_tokens += sum(len(r[0].tokens) for r in results)
    return results


@dataclass
class _Beams:
    """Beam-search state of the sentences still decoding. Slots are (sentence, beam) pairs laid out
    row-major as ``j * K + beam``; only live slots (finite running score) own a cache row, in slot order.

    running (B', K) cumulative log-probs (-inf = no candidate); history (B' * K, step) tokens per slot;
    index (B',) the sentences' batch positions (``active`` as a tensor).
    """

    active: list[int]
    running: Tensor
    history: Tensor
    index: Tensor

    def live_slots(self) -> Tensor:
        return torch.isfinite(self.running).view(-1).nonzero().flatten()  # (N,)


@dataclass
class PoolSummary:
    """Per sentence (or streaming slot) (B,), what the stop test and pruning read from its finished
    pool: best raw log-prob, worst kept normalised score (float64, as the pool holds them; -inf
    until full), pool full. Shared by the batch and streaming decoders."""

    best: Tensor
    worst: Tensor
    full: Tensor

    @classmethod
    def empty(cls, b: int, device: torch.device | str = "cpu") -> "PoolSummary":
        return cls(torch.full((b,), NEG_INF, device=device), torch.full((b,), NEG_INF, dtype=torch.float64, device=device),
                   torch.zeros(b, dtype=torch.bool, device=device))

    def reset(self, index: Tensor) -> None:
        self.best[index], self.worst[index], self.full[index] = NEG_INF, NEG_INF, False

    def refresh(self, at: list[int], pools: list[FinishedPool]) -> None:
        """Entries ``at`` from their pools (after hypotheses were added to them)."""
        dev = self.best.device
        index = torch.tensor(at, dtype=torch.long, device=dev)
        self.best[index] = torch.tensor([p.best_log_prob for p in pools], device=dev)
        self.worst[index] = torch.tensor([p.worst_score for p in pools], dtype=torch.float64, device=dev)
        self.full[index] = torch.tensor([p.full for p in pools], device=dev)


def _finish(beams: _Beams, cands, sel, pools: list[FinishedPool], summary: PoolSummary, step: int, k: int,
            cfg: SearchConfig) -> None:
    touched = set()
    for j, c in sel.finished.nonzero().tolist():
        total = float(cands.scores[j, c])
        slot = j * k + int(cands.beams[j, c])
        tokens = tuple(beams.history[slot, :step].tolist()) + (int(cands.tokens[j, c]),)
        pools[beams.active[j]].add(Hypothesis(tokens, length_normalize(total, step + 1, cfg.length_penalty), total))
        touched.add(beams.active[j])
    at = sorted(touched)
    summary.refresh(at, [pools[s] for s in at])


def stop_mask(best: Tensor, at_max: Tensor, full: Tensor, worst: Tensor, norm: Tensor | float,
              early_stopping: bool) -> Tensor:
    """``is_done`` for every sentence at once (B',), shared by the batch and streaming loops: at its
    cap, out of running beams, or (HF's test) a full pool whose worst entry (float64) the best
    running beam, normalised now (divided by ``norm`` = generated ** length_penalty), cannot beat.
    best (B',) each sentence's best running score; at_max, full (B',) bool; worst (B',) float64."""
    beaten = best.double() / norm <= worst
    return at_max | ~torch.isfinite(best) | (full & (beaten | early_stopping))


def prune_running(cands, sel, best_finished: Tensor, pruning: PruningConfig, stats: DecodeStats) -> Tensor:
    """Running scores (B', K) with the candidates the heuristics discard set to -inf.

    best_finished (B',): raw log-prob of each sentence's best finished hypothesis (-inf if none).
    """
    running = sel.running_scores
    if not pruning.active:
        return running
    source_beam, word = cands.beams.gather(1, sel.running), cands.word_log_probs.gather(1, sel.running)  # (B', K)
    keep = keep_mask(RunningCandidates(running, word, source_beam, cands.scores[:, 0], best_finished), pruning)
    stats.pruned += int((torch.isfinite(running) & ~keep).sum())
    return running.masked_fill(~keep, float("-inf"))


@torch.inference_mode()
def beam_search(model: MarianModel, src_ids: Tensor, src_mask: Tensor, cfg: SearchConfig,
                *, forced_eos: bool = True, candidates: Tensor | None = None,
                stats: DecodeStats | None = None) -> list[list[Hypothesis]]:
    """Beam search with HF ``generate`` semantics (see ``workers.search``), variable width.

    Only live beams are computed: at step 0 one row per sentence, later at most K, fewer when the
    ``cfg.pruning`` heuristics discard candidates (with every heuristic off the search is exact).
    ``candidates`` (C,): a shortlist of target ids; the output layer then computes only those.
    src_ids, src_mask (B, S) -> per sentence the ``cfg.num_hypotheses`` best hypotheses, best first.
    """
    mc, stats, k, dev = model.config, stats or DecodeStats(), cfg.beam_size, src_ids.device
    pruning = cfg.pruning
    b = src_ids.shape[0]
    max_lens = max_lengths(src_mask.sum(1).tolist(), cfg, mc.max_position_embeddings)
    t_max = max(max_lens)
    cache = model.init_cache(model.encode(src_ids, src_mask), src_mask, min(t_max, INITIAL_CAPACITY),
                             rows=b * k)  # one live beam per sentence at step 0, at most K later
    head = model.output_head(candidates) if candidates is not None else None
    pools = [FinishedPool(k) for _ in range(b)]
    running = torch.full((b, k), float("-inf"), device=dev)
    running[:, 0] = 0.0
    beams = _Beams(list(range(b)), running, torch.empty((b * k, 0), dtype=torch.long, device=dev),
                   torch.arange(b, device=dev))
    summary, caps = PoolSummary.empty(b, dev), torch.tensor(max_lens, device=dev)  # (B,), (B,)
    last = torch.full((b,), mc.decoder_start_token_id, dtype=torch.long, device=dev)  # (N,) one per live slot
    with record_function("search loop"):  # the step profile's "search": this minus the model's scopes
        for step in range(t_max):
            n, live = len(beams.active), beams.live_slots()
            at_max = caps[beams.index] <= step + 1  # (B',)
            logits = model.decode_step(last, step, cache, head)  # (N, V|C), every row at position ``step``
            cands, sel = score_step(logits, live, beams.running, at_max, mc, forced_eos=forced_eos, candidates=candidates,
                                    ops=model.ops)
            stats.record_step(live.numel(), n)
            if bool(sel.finished.any()):
                _finish(beams, cands, sel, pools, summary, step, k, cfg)
            running = prune_running(cands, sel, summary.best[beams.index], pruning, stats)
            running, order = running.sort(dim=1, descending=True, stable=True)  # pruned slots last
            done = stop_mask(running[:, 0], at_max, summary.full[beams.index], summary.worst[beams.index],
                             float(step + 1) ** cfg.length_penalty, cfg.early_stopping)
            keep_t = (~done).nonzero().flatten()
            if keep_t.numel() == 0:
                break
            keep = keep_t.tolist()
            running = running[keep_t]  # (B'', K)
            chosen = sel.running.gather(1, order)[keep_t]  # (B'', K) candidate index of each new slot
            source_slot = keep_t[:, None] * k + cands.beams[keep_t].gather(1, chosen)  # (B'', K)
            new_tokens = cands.tokens[keep_t].gather(1, chosen)  # (B'', K)
            new_live = torch.isfinite(running).view(-1)
            row_of_slot = torch.full((n * k,), -1, dtype=torch.long, device=dev)
            row_of_slot[live] = torch.arange(live.numel(), device=dev)
            rows = row_of_slot[source_slot.view(-1)[new_live]]  # (N',) old cache row of each new live slot
            with record_function("cache reorder"):  # self-attn K/V by row; cross-attn K/V by sentence, once
                cache = cache.select(rows, step + 1, sentences=None if len(keep) == n else keep_t,
                                     slots=new_live.nonzero().flatten(), width=k, zero_tail=False, reuse=True)
            history = torch.cat([beams.history[source_slot.view(-1)], new_tokens.view(-1, 1)], dim=1)  # (B''*K, step+1)
            beams = _Beams([beams.active[j] for j in keep], running, history, beams.index[keep_t])
            last = new_tokens.view(-1)[new_live]
    stats.target_tokens += sum(len(p.hyps[0].tokens) for p in pools if p.hyps)
    return [p.hyps[: cfg.num_hypotheses] for p in pools]
