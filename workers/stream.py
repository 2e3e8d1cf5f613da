"""Streaming beam search: a slot cache, the scheduler deciding admissions and expansions, and the
same pure beam-step functions as ``engine.beam_search``.

Every admitted sentence owns a slot: K cache rows (its beams) and one row of every per-slot state
tensor below. Each step: ``plan = scheduler.schedule()``; admitted sentences are encoded and their
cross-attention K/V written into their slot; the planned sentences' live beams run one decoder step
(rows at different target positions share the batch); ``scheduler.update(plan, output)`` frees the
slots of finished sentences, and the next ``schedule`` refills them. A sentence's result does not
depend on which others share its steps, so every policy returns what ``engine.beam_search`` returns.

The bookkeeping is tensor-wide over the planned slots (no per-sentence Python per step); only
hypotheses that finish go through Python (into their sentence's ``FinishedPool``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.profiler import record_function

from workers.config import SearchConfig
from workers.engine import (
    DecodeStats,
    PoolSummary,
    max_lengths,
    pad_sources,
    prune_running,
    score_step,
    stop_mask,
)
from workers.model import MarianModel
from workers.scheduler import Request, Scheduler, SchedulerConfig, SchedulerStats, StepOutput
from workers.search import Candidates, FinishedPool, Hypothesis, StepSelection, length_normalize
from workers.slots import SlotCache, slot_step

NEG_INF = float("-inf")


@dataclass
class _SlotState:
    """Search state per slot (sentence) and per row (slot * K + beam).

    running (slots, K) cumulative log-probs, live beams first (-inf = none); length (slots,) tokens
    generated; max_len (slots,); pools (slots,) the finished pools' summaries; history (R, T)
    tokens per row; last (R,) the row's next input token.
    """

    running: Tensor
    length: Tensor
    max_len: Tensor
    pools: PoolSummary
    history: Tensor
    last: Tensor

    @classmethod
    def empty(cls, slots: int, k: int, t_cap: int, pad: int, device: torch.device) -> "_SlotState":
        zero = torch.zeros(slots, dtype=torch.long, device=device)
        return cls(torch.full((slots, k), NEG_INF, device=device), zero, zero.clone(), PoolSummary.empty(slots, device),
                   torch.full((slots * k, t_cap), pad, dtype=torch.long, device=device),
                   torch.full((slots * k,), pad, dtype=torch.long, device=device))


@dataclass
class StreamDecoder:
    model: MarianModel
    search: SearchConfig
    schedule: SchedulerConfig
    forced_eos: bool = True
    candidates: Tensor | None = None
    stats: DecodeStats = field(default_factory=DecodeStats)
    scheduler_stats: SchedulerStats = field(default_factory=SchedulerStats)  # refills etc., live while decoding

    @torch.inference_mode()
    def decode(self, sources: list[list[int]]) -> list[list[Hypothesis]]:
        """Source id lists -> per sentence the ``num_hypotheses`` best hypotheses (input order)."""
        if not sources:
            return []
        mc, k, slots = self.model.config, self.search.beam_size, self.schedule.max_batch_sentences
        self.max_lens = max_lengths([len(s) for s in sources], self.search, mc.max_position_embeddings)
        t_cap = max(self.max_lens)
        self.cache = SlotCache.empty(self.model.model.decoder, slots, k, max(len(s) for s in sources), t_cap)
        self.state = _SlotState.empty(slots, k, t_cap, mc.pad_token_id, self.model.device)
        lp = self.search.length_penalty
        self._norm = torch.tensor([float(n) ** lp if n else 1.0 for n in range(t_cap + 2)], dtype=torch.float64,
                                  device=self.model.device)
        self._head = self.model.output_head(self.candidates) if self.candidates is not None else None
        self.free, self.slot_of, self.pools = list(range(slots)), {}, [FinishedPool(k) for _ in range(slots)]
        self.scheduler = Scheduler(self.schedule, self.scheduler_stats)
        for i, src in enumerate(sources):
            self.scheduler.add(Request(i, len(src)))
        results: list[list[Hypothesis]] = [[] for _ in sources]
        with record_function("search loop"):  # the step profile's "search": this minus the model's scopes
            while self.scheduler.has_work:
                plan = self.scheduler.schedule()
                if plan.admit:
                    self._admit([sources[i] for i in plan.admit], plan.admit)
                finished, widths = self._step([self.slot_of[i] for i in plan.expand], plan.expand)
                self.scheduler.update(plan, StepOutput(tuple(finished), widths))
                for i in finished:
                    block = self.slot_of.pop(i)
                    self.free.append(block)
                    results[i] = self.pools[block].hyps[: self.search.num_hypotheses]
        self.stats.target_tokens += sum(len(r[0].tokens) for r in results if r)
        return results

    def _admit(self, sources: list[list[int]], ids: tuple[int, ...]) -> None:
        """Encode the admitted sentences, write their cross-attention K/V, reset their slots."""
        k, mc, st = self.search.beam_size, self.model.config, self.state
        src_ids, src_mask = pad_sources(sources, mc.pad_token_id, self.model.device)
        blocks = [self.free.pop(0) for _ in sources]
        with record_function("encoder"):  # encoder + cross-attention K/V of the admitted sentences
            self.cache.admit(self.model.model.decoder, self.model.encode(src_ids, src_mask), src_mask, blocks)
        index = torch.tensor(blocks, device=self.model.device)  # (A,)
        st.running[index] = NEG_INF
        st.running[index, 0] = 0.0
        st.length[index] = 0
        st.max_len[index] = torch.tensor([self.max_lens[i] for i in ids], device=self.model.device)
        st.pools.reset(index)
        st.last[index * k] = mc.decoder_start_token_id
        for i, b in zip(ids, blocks):
            self.slot_of[i], self.pools[b] = b, FinishedPool(k)

    def _step(self, blocks: list[int], ids: tuple[int, ...]) -> tuple[list[int], dict[int, int]]:
        """One decoder step for the sentences in slots ``blocks``; returns (finished ids, new widths of the others)."""
        k, mc, st, n = self.search.beam_size, self.model.config, self.state, len(blocks)
        index = torch.tensor(blocks, device=self.model.device)  # (B',)
        running = st.running[index]  # (B', K)
        live = torch.isfinite(running)
        slots = live.view(-1).nonzero().flatten()  # (N,) index into (B' * K)
        sentence, beam = slots // k, slots % k
        rows = index[sentence] * k + beam  # (N,) cache rows
        length = st.length[index]  # (B',)
        at_max = length + 1 >= st.max_len[index]  # (B',)
        width = int(live.sum(1).max())
        with record_function("decoder layers"):
            hidden = slot_step(self.model.model.decoder, self.cache, st.last[rows], length[sentence], rows, blocks,
                               sentence * width + beam, width)  # (N, E)
        with record_function("output layer"):
            logits = self.model.project(hidden, self._head)  # (N, V|C)
        cands, sel = score_step(logits, slots, running, at_max, mc, forced_eos=self.forced_eos,
                                candidates=self.candidates, ops=self.model.ops)
        self.stats.record_step(rows.numel(), n)
        if bool(sel.finished.any()):
            self._finish(cands, sel, blocks, index, length)
        running = prune_running(cands, sel, st.pools.best[index], self.search.pruning, self.stats)
        running, order = running.sort(dim=1, descending=True, stable=True)  # live beams first
        chosen = sel.running.gather(1, order)  # (B', K) candidate index of each new slot
        best, generated = running[:, 0], length + 1
        done = stop_mask(best, at_max, st.pools.full[index], st.pools.worst[index], self._norm[generated],
                         self.search.early_stopping)
        keep = (~done).nonzero().flatten()  # (B'',)
        finished = [ids[j] for j in done.nonzero().flatten().tolist()]
        if keep.numel() == 0:
            return finished, {}
        self._advance(index[keep], running[keep], cands.beams[keep].gather(1, chosen[keep]),
                      cands.tokens[keep].gather(1, chosen[keep]), length[keep])
        return finished, dict(zip([ids[j] for j in keep.tolist()], torch.isfinite(running[keep]).sum(1).tolist()))

    def _finish(self, cands: Candidates, sel: StepSelection, blocks: list[int], index: Tensor, length: Tensor) -> None:
        """Finished candidates into their sentences' pools; refresh the pools' summary tensors.

        index (B',) the planned slots, length (B',) their tokens before this step; only the (F,)
        finished candidates go through Python, in (sentence, candidate) order as batch search adds them."""
        k, lp, st = self.search.beam_size, self.search.length_penalty, self.state
        j, c = sel.finished.nonzero().unbind(1)  # (F,) sentence, candidate
        rows = index[j] * k + cands.beams[j, c]  # (F,) row of the source beam
        lengths, totals = length[j].tolist(), cands.scores[j, c].tolist()
        history, tokens = st.history[rows, : max(lengths) + 1].tolist(), cands.tokens[j, c].tolist()
        touched = []
        for jj, n, total, hist, token in zip(j.tolist(), lengths, totals, history, tokens):
            pool = self.pools[blocks[jj]]
            pool.add(Hypothesis(tuple(hist[:n]) + (token,), length_normalize(total, n + 1, lp), total))
            touched.append(blocks[jj])
        touched = sorted(set(touched))
        st.pools.refresh(touched, [self.pools[b] for b in touched])

    def _advance(self, index: Tensor, running: Tensor, source_beam: Tensor, new_tokens: Tensor, length: Tensor) -> None:
        """Continuing sentences: slots ``index`` (B''), new running (B'', K) sorted, source beam and
        token (B'', K) of each new beam, length (B'',) before this step."""
        k, st = self.search.beam_size, self.state
        st.running[index] = running
        j, beam = torch.isfinite(running).nonzero().unbind(1)  # (N',) new live beams
        dst = index[j] * k + beam  # (N',) rows
        src = index[j] * k + source_beam[j, beam]
        t = int(length.max()) + 1
        self.cache.reorder(src, dst, t)
        st.history[dst, :t] = st.history[src, :t]
        st.history[dst, length[j]] = new_tokens[j, beam]
        st.last[dst] = new_tokens[j, beam]
        st.length[index] += 1
