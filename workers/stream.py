"""Streaming beam search: a slot cache, the scheduler deciding admissions and expansions, and the
same pure beam-step functions as ``engine.beam_search``.

Every admitted sentence owns a block of K cache rows (its beams). Each step: ``plan =
scheduler.schedule()``; admitted sentences are encoded and their cross-attention K/V written into
their block; the planned sentences' live beams run one decoder step (rows at different target
positions share the batch); ``scheduler.update(plan, output)`` frees the blocks of finished
sentences, and the next ``schedule`` refills them. A sentence's result does not depend on which
others share its steps, so every policy returns what ``engine.beam_search`` returns.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from workers.config import SearchConfig
from workers.engine import DecodeStats, max_lengths, prune_running, score_step
from workers.model import DecoderCache, MarianModel
from workers.scheduler import Request, Scheduler, SchedulerConfig, StepOutput
from workers.search import FinishedPool, Hypothesis, is_done, length_normalize

NEG_INF = float("-inf")


@dataclass
class _Sentence:
    """One admitted sentence: block of K rows, running scores (K,), history (K, T), last tokens (K,)."""

    index: int
    block: int
    max_len: int
    running: Tensor
    history: Tensor
    last: Tensor
    pool: FinishedPool
    length: int = 0

    def live(self) -> Tensor:
        return torch.isfinite(self.running).nonzero().flatten()  # beam indices, ascending


@dataclass
class StreamDecoder:
    model: MarianModel
    search: SearchConfig
    schedule: SchedulerConfig
    forced_eos: bool = True
    candidates: Tensor | None = None
    stats: DecodeStats = field(default_factory=DecodeStats)

    @torch.inference_mode()
    def decode(self, sources: list[list[int]]) -> list[list[Hypothesis]]:
        """Source id lists -> per sentence the ``num_hypotheses`` best hypotheses (input order)."""
        if not sources:
            return []
        mc = self.model.config
        max_lens = max_lengths([len(s) for s in sources], self.search, mc.max_position_embeddings)
        self.cache = self._empty_cache(max(len(s) for s in sources), max(max_lens))
        self._head = self.model.output_head(self.candidates) if self.candidates is not None else None
        self.free = list(range(self.schedule.max_batch_sentences))
        self.scheduler = Scheduler(self.schedule)
        for i, src in enumerate(sources):
            self.scheduler.add(Request(i, len(src)))
        active: dict[int, _Sentence] = {}
        results: list[list[Hypothesis]] = [[] for _ in sources]
        while self.scheduler.has_work:
            plan = self.scheduler.schedule()
            if plan.admit:
                active.update(self._admit([sources[i] for i in plan.admit], plan.admit, max_lens))
            finished, widths = self._step([active[i] for i in plan.expand])
            self.scheduler.update(plan, StepOutput(tuple(finished), widths))
            for i in finished:
                sentence = active.pop(i)
                self.free.append(sentence.block)
                results[i] = sentence.pool.hyps[: self.search.num_hypotheses]
        self.stats.target_tokens += sum(len(r[0].tokens) for r in results if r)
        return results

    def _empty_cache(self, s_cap: int, t_cap: int) -> DecoderCache:
        attn = self.model.model.decoder.layers[0].self_attn
        layers, rows = len(self.model.model.decoder.layers), self.schedule.max_batch_sentences * self.search.beam_size
        weight = self.model.lm_head.weight
        self_k = weight.new_zeros(t_cap, layers, rows, attn.num_heads, attn.head_dim)  # (T, L, R, H, D)
        cross_k = weight.new_zeros(layers, rows, attn.num_heads, s_cap, attn.head_dim)
        mask = torch.zeros(rows, s_cap, dtype=torch.bool)
        return DecoderCache(self_k, torch.zeros_like(self_k), cross_k, torch.zeros_like(cross_k), mask)

    def _admit(self, sources: list[list[int]], ids: tuple[int, ...], max_lens: list[int]) -> dict[int, _Sentence]:
        """Encode the admitted sentences and write their cross-attention K/V into K rows each."""
        k, mc = self.search.beam_size, self.model.config
        s = max(len(x) for x in sources)
        src_ids = torch.full((len(sources), s), mc.pad_token_id, dtype=torch.long)
        src_mask = torch.zeros((len(sources), s), dtype=torch.bool)
        for row, x in enumerate(sources):
            src_ids[row, : len(x)], src_mask[row, : len(x)] = torch.tensor(x), True
        fresh = self.model.init_cache(self.model.encode(src_ids, src_mask), src_mask, 1)  # cross K/V (L, A, H, S, D)
        blocks = [self.free.pop(0) for _ in sources]
        rows = torch.tensor([b * k + j for b in blocks for j in range(k)])  # (A*K,)
        self.cache.cross_k[:, rows, :, :s] = fresh.cross_k.repeat_interleave(k, dim=1)
        self.cache.cross_v[:, rows, :, :s] = fresh.cross_v.repeat_interleave(k, dim=1)
        self.cache.src_mask[rows] = False
        self.cache.src_mask[rows, :s] = src_mask.repeat_interleave(k, dim=0)
        out = {}
        for i, b in zip(ids, blocks):
            running = torch.full((k,), NEG_INF)
            running[0] = 0.0
            history = torch.full((k, self.cache.max_length), mc.pad_token_id, dtype=torch.long)
            last = torch.full((k,), mc.decoder_start_token_id, dtype=torch.long)
            out[i] = _Sentence(i, b, max_lens[i], running, history, last, FinishedPool(k))
        return out

    def _step(self, sentences: list[_Sentence]) -> tuple[list[int], dict[int, int]]:
        """One decoder step for ``sentences``; returns (finished ids, new live width of the others)."""
        k, mc, n = self.search.beam_size, self.model.config, len(sentences)
        lives = [s.live() for s in sentences]
        rows = torch.cat([s.block * k + live for s, live in zip(sentences, lives)])  # (N,) cache rows
        slots = torch.cat([j * k + live for j, live in enumerate(lives)])  # (N,) index into (B' * K)
        tokens = torch.cat([s.last[live] for s, live in zip(sentences, lives)])
        positions = torch.cat([torch.full((live.numel(),), s.length, dtype=torch.long) for s, live in zip(sentences, lives)])
        at_max = torch.tensor([s.length + 1 >= s.max_len for s in sentences])  # (B',)
        logits = self.model.decode_step(tokens, positions, self.cache, self._head, rows)  # (N, V|C)
        running = torch.stack([s.running for s in sentences])  # (B', K)
        cands, sel = score_step(logits, slots, running, at_max, mc, forced_eos=self.forced_eos,
                                candidates=self.candidates)
        self.stats.steps += 1
        self.stats.row_steps += rows.numel()
        self.stats.sentence_steps += n
        for j, c in sel.finished.nonzero().tolist():
            s, total = sentences[j], float(cands.scores[j, c])
            hyp_tokens = tuple(s.history[int(cands.beams[j, c]), : s.length].tolist()) + (int(cands.tokens[j, c]),)
            s.pool.add(Hypothesis(hyp_tokens, length_normalize(total, s.length + 1, self.search.length_penalty), total))
        best_finished = torch.tensor([s.pool.best_log_prob for s in sentences])
        running = prune_running(cands, sel, best_finished, self.search.pruning, self.stats)
        running, order = running.sort(dim=1, descending=True, stable=True)
        chosen = sel.running.gather(1, order)  # (B', K) candidate index of each new slot
        source_beam, new_tokens = cands.beams.gather(1, chosen), cands.tokens.gather(1, chosen)
        return self._advance(sentences, running, source_beam, new_tokens, at_max)

    def _advance(self, sentences: list[_Sentence], running: Tensor, source_beam: Tensor, new_tokens: Tensor,
                 at_max: Tensor) -> tuple[list[int], dict[int, int]]:
        """Reorder each continuing sentence's beams inside its block; report finished ones."""
        k, finished, widths, src_rows, dst_rows = self.search.beam_size, [], {}, [], []
        t = max(s.length for s in sentences) + 1
        for j, s in enumerate(sentences):
            best = float(running[j, 0])
            if bool(at_max[j]) or best == NEG_INF or is_done(s.pool, best, s.length + 1, self.search.length_penalty,
                                                             self.search.early_stopping):
                finished.append(s.index)
                continue
            live = torch.isfinite(running[j])
            src_rows.append(s.block * k + source_beam[j][live])
            dst_rows.append(s.block * k + torch.arange(k)[live])
            history = s.history[source_beam[j]]
            history[:, s.length] = new_tokens[j]
            s.history, s.running, s.last, s.length = history, running[j].clone(), new_tokens[j].clone(), s.length + 1
            widths[s.index] = int(live.sum())
        if src_rows:
            src, dst = torch.cat(src_rows), torch.cat(dst_rows)
            for kv in (self.cache.self_k, self.cache.self_v):
                kv[:t, :, dst] = kv[:t, :, src]  # gathered before written: overlapping rows are safe
        return finished, widths
