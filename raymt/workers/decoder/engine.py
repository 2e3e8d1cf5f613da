"""The one decoder: a slot engine whose step loop is ``plan = schedule(); step(plan); update(plan, out)``.

Every policy runs here: batch decoding is the FIXED policy over length-sorted input (admit a batch,
no refill until it is empty), VAR-BATCH / VAR-STREAM / FIFO / top-up are the scheduler's other
policies (``workers/decoder/scheduler.py``, no torch), and greedy decoding is beam 1 on the same loop.

Each step, for the sentences the scheduler planned:

1. the host builds the step's row indices from what it already knows (each planned sentence's
   slot, live width and length): one host-to-device copy;
2. the model runs one decoder step for their live beams (rows at different target positions
   share it; ``workers/model/cache.py``), then the pure search step functions (``workers/search/selection.py``)
   choose candidates, finished ones merge into the device-side pools, beams are reordered by
   rewriting ancestry (``workers/search/beams.py``); on the CPU the beam step is one native call
   (``workers/kernels/csrc/beam_step.cpp``, beam 1 included), elsewhere beam 1 takes the greedy step
   (``greedy_select``);
3. one device-to-host copy (``Readback``) returns which sentences are done, the others' new widths
   and the done sentences' hypotheses: **one host sync per step**, counted in ``DecodeStats.syncs``
   (the static step, ``workers/decoder/static_step.py``, may read back every few steps instead, and
   advances its own indices on the device while the plan is unchanged).

A sentence's result does not depend on which others share its steps, so every policy returns what
batch decoding returns (tests/workers/test_engine.py, test_stream.py).

An engine is one decode call: the KV cache, the beam state, the static step's buffers, its
captured graph and the output-head buffers that graph reads belong to the runner
(``workers/decoder/runner.py``), built once per actor and reused by every call; the engine fills its slots
(and copies its shortlist head into those buffers).

The model interface the engine uses (``MarianModel``; the tests' scripted stub): ``config``,
``device``, ``ops``, ``new_cache``, ``encode``, ``cross_kv``, ``output_head``, ``decode_hidden``, ``project``
and ``row_top``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import Tensor
from torch.profiler import record_function

from raymt.workers.search.beam_rules import BeamRules
from raymt.workers.search.beams import Readback
from raymt.workers.model.cache import EncodedBatch
from raymt.workers.config import SearchConfig
from raymt.workers.model.graphs import HostCopy, to_device
from raymt.workers.decoder.runner import CacheNeed, DecodeRunner, bucket
from raymt.workers.decoder.scheduler import (CapacityUnit, Policy, Request, Scheduler, SchedulerConfig, SchedulerStats,
                                     StepOutput, StepPlan)
from raymt.workers.search.sampling import sentence_key
from raymt.workers.search.selection import Hypothesis
from raymt.workers.search.search_step import StepContext, choose_step
from raymt.workers.decoder.static_step import StaticStep
from raymt.workers.search.step_index import StepIndex


@dataclass
class DecodeStats:
    """Counters of decoding calls; the engine adds to the one it is given (read live by the actors'
    time slices) and returns it."""

    steps: int = 0
    row_steps: int = 0  # decoder rows expanded (candidates = fan-out), summed over steps
    sentence_steps: int = 0  # live sentences, summed over steps
    target_tokens: int = 0
    pruned: int = 0  # running candidates discarded by pruning heuristics
    syncs: int = 0  # device-to-host reads: one per step, one per decode for ``pruned``
    batch_sizes: Counter = field(default_factory=Counter)  # steps per number of sentences in the step
    shortlist_sizes: list[int] = field(default_factory=list)  # candidate-set size of every decode
    scheduler: SchedulerStats = field(default_factory=SchedulerStats)  # refills, expansions

    def record_step(self, rows: int, sentences: int) -> None:
        self.steps += 1
        self.row_steps += rows
        self.sentence_steps += sentences
        self.batch_sizes[sentences] += 1

    @property
    def occupancy(self) -> float:
        """Mean live sentences per step."""
        return self.sentence_steps / self.steps if self.steps else 0.0


def pad_sources(sources: list[list[int]], pad_id: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Source id lists -> src_ids (B, S) padded with ``pad_id``, src_mask (B, S) bool (True = token),
    built on the host and moved to ``device`` in one copy each (pinned and asynchronous on a GPU)."""
    s = max(len(x) for x in sources)
    src_ids = torch.full((len(sources), s), pad_id, dtype=torch.long, device="cpu")
    for row, x in enumerate(sources):
        src_ids[row, : len(x)] = torch.tensor(x, device="cpu")
    return to_device(src_ids, device), prefix_mask([len(x) for x in sources], s, device)


def prefix_mask(lengths: list[int], width: int, device: torch.device | str = "cpu") -> Tensor:
    """(B, width) bool: True on each row's first lengths[b] positions, built on the host, one copy."""
    return to_device(torch.arange(width, device="cpu")[None, :] < torch.tensor(lengths, device="cpu")[:, None], device)


def max_lengths(source_lengths: list[int], cfg: SearchConfig, positions: int) -> list[int]:
    """Per-sentence cap on generated tokens, never past the model's position table."""
    return [min(cfg.max_length_for(n), positions) for n in source_lengths]


class Engine:
    """Decodes lists of source ids under one search config and scheduler policy."""

    def __init__(self, model, search: SearchConfig, schedule: SchedulerConfig, *, forced_eos: bool = True,
                 candidates: Tensor | None = None, stats: DecodeStats | None = None,
                 static: StaticStep | None = None, runner: DecodeRunner | None = None) -> None:
        """``static``: every step has one shape (``workers/decoder/static_step.py``). Every slot's K rows run
        each step (rows not planned write at a scratch position and keep their state), over the
        full target and source capacity: the step a CUDA graph can capture and replay. On the CPU
        it only costs; the tests run it there against the dynamic step. ``runner``: the decoder's
        long-lived state (cache, beam state, graphs, staging; ``workers/decoder/runner.py``), shared by every
        decode call of an actor; by default the engine builds its own."""
        self.model, self.search, self.schedule, self.forced_eos = model, search, schedule, forced_eos
        self.candidates, self.static = candidates, static
        self.stats = stats if stats is not None else DecodeStats()
        self.runner = runner if runner is not None else DecodeRunner(model)

    @torch.inference_mode()
    def decode(self, sources: list[list[int]], forced_first: list[int] | None = None) -> list[list[Hypothesis]]:
        """Source id lists -> per sentence the ``num_hypotheses`` best hypotheses (input order).
        ``forced_first``: per sentence a token its first generated step must emit, at log-prob 0, or -1
        (M2M100 / NLLB: its target language, HF's ``forced_bos_token_id`` per row; ``search.force_first_rows``)."""
        if not sources:
            return []
        if forced_first is not None and len(forced_first) != len(sources):
            raise ValueError(f"{len(forced_first)} forced first tokens for {len(sources)} sources")
        with self.runner.scope():  # (on CUDA: the runner's device is the current one)
            scheduler, requests = self._prepare(sources, forced_first)
            results: list[list[Hypothesis]] = [[] for _ in sources]
            with record_function("search loop"):  # the step profile's "search": this minus the model's scopes
                while scheduler.has_work:
                    plan = scheduler.schedule()
                    if plan.encode:
                        self._encode(plan.encode, sources)
                    if plan.admit:
                        self._admit(plan.admit, requests)
                    out, hyps = self._step(plan, requests)
                    for i in scheduler.update(plan, out):
                        results[i] = hyps[i]
            if self.search.pruning.active:
                self.stats.pruned += int(self.state.pruned)
                self.stats.syncs += 1
        self.stats.target_tokens += sum(len(r[0].tokens) for r in results if r)
        return results

    def _prepare(self, sources: list[list[int]], forced_first: list[int] | None = None
                 ) -> tuple[Scheduler, dict[int, Request]]:
        """The call's slots in the runner's cache and beam state (reused; grown only where this call
        needs more), its tables, and a scheduler holding every sentence as a request."""
        mc, k, n = self.model.config, self.search.beam_size, self.schedule.max_batch_sentences
        caps = max_lengths([len(s) for s in sources], self.search, mc.max_position_embeddings)
        wanted = min(n, len(sources))
        if self.static:  # one captured graph per bucket: a power of two (or n) slots
            wanted = bucket(wanted, n)
        need = CacheNeed(wanted, k, max(1, max(len(s) for s in sources)), max(caps) + 1, static=bool(self.static))
        slots = self.runner.reserve(need, pad=mc.pad_token_id)
        schedule = self.schedule
        if slots < min(n, len(sources)):  # memory allowed fewer slots than asked
            sentences = schedule.capacity_unit is CapacityUnit.SENTENCES
            schedule = replace(schedule, max_batch_sentences=slots,
                               capacity=min(schedule.capacity, slots) if sentences else schedule.capacity)
        self.cache, self.state = self.runner.cache, self.runner.state
        self._norm = self.runner.norm(self.search.length_penalty, max(caps) + 2)
        head = self.model.output_head(self.candidates)
        self._beams = self.runner.beams(k)  # (K,)
        # pinned staging buffers make the step's one host-to-device copy asynchronous on a GPU
        ahead = self.static.readback_every if self.static else 1  # steps the host may run ahead of the device
        self._to_device = self.runner.copier(5 * slots * k + 3 * slots, ahead)
        if self.candidates is not None:
            self.stats.shortlist_sizes.append(int(self.candidates.numel()))
        self._encoded: dict[int, tuple[EncodedBatch, int]] = {}  # id -> (its batch's K/V, row)
        forcing = forced_first is not None and max(forced_first) >= 0
        self._static = (self.runner.static_indices(slots, k, self.forced_eos, self._to_device, forcing)
                        if self.static else None)
        self._unread = 0  # static steps run since the last readback
        self._in_flight: tuple[HostCopy, list[tuple[int, int]]] | None = None  # late: a readback and its sentences
        # a graph reads the runner's head buffers, into which this call's head is copied (``DecodeRunner.graph``)
        self._graph, self._head = self.runner.graph(slots, (self.search, self.forced_eos, forcing), head) \
            if self.static else (None, head)
        self._search_step = choose_step(self.model, self.search, bool(self.static))
        self._context = StepContext(self.model, self.search, BeamRules.of(self.search), self.state, self.cache,
                                    self._head, self._norm, self._beams)
        self._scheduler = Scheduler(schedule, self.stats.scheduler, beam_size=k)
        firsts = forced_first if forcing else [-1] * len(sources)
        requests = {i: Request(i, len(src), max_length=caps[i], forced_first=firsts[i]) for i, src in enumerate(sources)}
        sampling = self.search.sampling  # each sentence's draws keyed by its seed, source and language
        self._keys = [sentence_key(sampling.seed, src, firsts[i]) for i, src in enumerate(sources)] if sampling else None
        for r in requests.values():
            self._scheduler.add(r)
        return self._scheduler, requests

    def _admit(self, ids: tuple[int, ...], requests: dict[int, Request]) -> None:
        """The admitted sentences into the slots the scheduler gave them: their cross-attention K/V
        (computed ahead with their batch's encoder output) copied in, fresh search state."""
        entries = [self._encoded.pop(i) for i in ids]
        dev = self.model.device
        host = torch.tensor([requests[i].slot for i in ids], device="cpu")  # (A,)
        index = to_device(host, dev)
        groups: dict[int, tuple[EncodedBatch, list[int]]] = {}  # each encode batch the admitted came from
        for j, (batch, _) in enumerate(entries):
            groups.setdefault(id(batch), (batch, []))[1].append(j)
        for batch, members in groups.values():
            lengths = [requests[ids[j]].source_length for j in members]
            slots = index if len(members) == len(ids) else to_device(host[members], dev)
            self.cache.admit(slots, batch.select([entries[j][1] for j in members], max(lengths)),
                             prefix_mask(lengths, max(lengths), dev))
        keys = None if self._keys is None else to_device(torch.tensor([self._keys[i] for i in ids], device="cpu"), dev)
        self.state.admit(index, self.model.config.decoder_start_token_id, keys)

    def _encode(self, ids: tuple[int, ...], sources: list[list[int]]) -> None:
        """The sentences the scheduler asks to encode now (those admitted now, then the next waiting
        ones: its encode-ahead queue) in one batch, cross-attention K/V included."""
        src_ids, src_mask = pad_sources([sources[i] for i in ids], self.model.config.pad_token_id, self.model.device)
        encoded = EncodedBatch(self.model.cross_kv(self.model.encode(src_ids, src_mask)))
        for row, i in enumerate(ids):
            self._encoded[i] = (encoded, row)

    def _indices(self, plan: StepPlan, requests: dict[int, Request]) -> StepIndex:
        """The step's indices, built on the host from what it already knows (each planned
        sentence's slot, live width and length) and copied over at once. The sentences run in slot
        order (a streaming policy plans them in admission order): rows ascend through the cache, and
        where the planned slots are consecutive the ATen path slices instead of gathering. Per
        sentence the host only reads its numbers; numpy expands them to rows (against a Python loop,
        same inputs: 47 -> 39 us at 32 sentences, 1211 -> 309 us at 1000)."""
        if self.static:
            return self._static.step_index(plan, requests, self._scheduler.slot_of)
        k = self.search.beam_size
        expand = sorted(plan.expand, key=lambda i: requests[i].slot)
        b = len(expand)
        held = [requests[i] for i in expand]
        slots = np.fromiter((s.slot for s in held), np.int64, b)  # (B',)
        cap = np.fromiter((s.max_length for s in held), np.int64, b)
        width = np.fromiter((requests[i].width for i in expand), np.int64, b)  # 1 at admission, then read back
        length = np.fromiter((requests[i].length for i in expand), np.int64, b)
        at_max = (length + 1 >= cap).astype(np.int64)  # (B',)
        n = int(width.sum())
        within = np.arange(n) - np.repeat(np.cumsum(width) - width, width)  # each row's beam, (N,)
        rows = np.repeat(slots * k, width) + within
        grid = np.repeat(np.arange(b) * k, width) + within
        force = self.forced_eos and bool(at_max.any())
        first = np.fromiter((s.forced_first if s.length == 0 else -1 for s in held), np.int64, b)
        forcing = bool((first >= 0).any())  # some sentence's first step, its first token forced
        parts = [rows, np.repeat(length, width), grid, slots, length + 1, at_max]
        parts += ([np.repeat(at_max, width)] if force else []) + ([np.repeat(first, width)] if forcing else [])
        packed = self._to_device(np.concatenate(parts))
        rows_t, positions_t, grid_t = packed[:n], packed[n: 2 * n], packed[2 * n: 3 * n]
        slots_t, generated_t = packed[3 * n: 3 * n + b], packed[3 * n + b: 3 * n + 2 * b]
        at_max_t = packed[3 * n + 2 * b: 4 * n + 3 * b]  # at_max (B',), then force (N,) when forced EOS applies
        forced_t = packed[-n:] if forcing else None
        where = {i: j for j, i in enumerate(expand)}  # each planned sentence's row of the step
        return StepIndex(rows_t, positions_t, None if n == b * k else grid_t, grid_t, slots_t, generated_t,
                         at_max_t[:b], at_max_t[b:] if force else None, t=int(length.max()) + 1,
                         s=max(s.source_length for s in held), shared=bool(length.min() == length.max()),
                         first=int(slots[0]) if slots[-1] - slots[0] == b - 1 else -1,
                         planned=None, order=[where[i] for i in plan.expand], live_rows=n, forced=forced_t)

    def _step(self, plan: StepPlan, requests: dict[int, Request]) -> tuple[StepOutput, dict[int, list[Hypothesis]]]:
        """One decoder step for the planned sentences -> (finished ids and the others' widths, the
        finished sentences' hypotheses)."""
        ix = self._indices(plan, requests)
        self.stats.record_step(ix.live_rows, len(plan.expand))
        if self._graph is not None:  # a static step on a GPU: captured once per bucket (runner), then replayed
            packed = self._graph.run(lambda: self._device_step(ix))
        else:
            packed = self._device_step(ix)
        if self.static:
            return self._static_readback(packed, ix)
        return self._outcome(Readback.read(packed), list(zip(plan.expand, ix.order)), ix.t)  # the step's one copy

    def _static_readback(self, packed: Tensor, ix: StepIndex) -> tuple[StepOutput, dict[int, list[Hypothesis]]]:
        """The static step's outcome: every slot is in the readback, which comes every
        ``readback_every`` steps (at once when no sentence can run). ``late``: the readback is copied
        behind this step and read at the next, after that step is queued (the one in flight, read
        first: its sentences were those then in their slots)."""
        self._unread += 1
        due = self._unread >= self.static.readback_every or not ix.live_rows
        if not self.static.late:
            if not due:
                return StepOutput(), {}
            self._unread = 0
            return self._outcome(Readback.read(packed), self._scheduler.occupied(), ix.t)
        outcome = StepOutput(), {}
        if self._in_flight is not None:
            copy, sentences = self._in_flight
            self._in_flight = None
            outcome = self._outcome(Readback.of(copy.wait()), sentences, ix.t)
        if due:
            self._unread = 0
            finished = set(outcome[0].finished)
            self._in_flight = HostCopy(packed), [(i, s) for i, s in self._scheduler.occupied() if i not in finished]
        return outcome

    def _outcome(self, back: Readback, sentences: list[tuple[int, int]], t: int
                 ) -> tuple[StepOutput, dict[int, list[Hypothesis]]]:
        """A readback of ``sentences`` (id, its row in the readback) -> (finished ids and the others'
        widths, the finished sentences' hypotheses)."""
        self.stats.syncs += 1
        nbest = self.search.num_hypotheses
        finished = tuple(i for i, j in sentences if back.done[j])
        hyps = {i: back.hypotheses(j, nbest, t - 1) for i, j in sentences if back.done[j]}
        widths = {i: back.widths[j] for i, j in sentences if not back.done[j]}
        return StepOutput(finished, widths), hyps

    def _device_step(self, ix: StepIndex) -> Tensor:
        """The step's device work, no read back: the model step, then the search step
        (``workers/search/search_step.py``: candidates, pools, reorder) -> the packed readback (``Readback.gather``)."""
        k, cache, ix = self.search.beam_size, self.cache, ix.as_masks()
        tokens = self.state.last[ix.rows]  # (N,)
        idle = None if ix.planned is None else ~ix.planned[:, None].expand(-1, k).reshape(-1)  # (R,): static
        at = cache.step_at(tokens, ix.rows, ix.positions, ix.grid_all, ix.slots, t=ix.t, s=ix.s, shared=ix.shared,
                           first=ix.first, idle=idle)
        hidden = self.model.decode_hidden(tokens, at, cache)  # (N, E)
        packed = self._search_step(self._context, hidden, ix)
        if ix.planned is not None:
            self._static.advance()  # (after every read of this step's indices)
        return packed


def batch_schedule(sentences: int) -> SchedulerConfig:
    """Batch decoding as a policy: admit all ``sentences`` at once, no refill until they are done."""
    return SchedulerConfig(policy=Policy.FIXED, max_batch_sentences=sentences, capacity=sentences)

