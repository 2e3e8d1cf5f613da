"""One decoder runner per actor (or ``CoreDecoder``), built once: what every decode call reuses.

nano-vllm's ModelRunner is the model: the runner owns the model on its device, the KV cache and the
beam state (sized once and reused by every decode call and work unit, growing only when a call
needs more: more slots, longer sources or targets), the static step's index buffers, the captured
CUDA graphs (one per batch bucket, all in one graph memory pool) and the pinned staging buffers.
A decode call (``Engine``) only fills slots.

The device is decided once, here: the model's. On CUDA the runner makes it the current device
(``torch.cuda.set_device``) and every call runs inside ``torch.cuda.device(index)`` (``scope``), so
streams, graphs, events, pinned copies and Triton launches land on device N, not on device 0.

Memory: a growth frees the old cache before allocating the new one (never two at once), and
first drops what reads the old one: every captured graph (its private pool, the step's logits
included), the static index buffers and the graphs' output heads, then hands torch's cached blocks
back (``graphs.release_cached``), so the new cache is never allocated beside them. Out of memory
while allocating, the slots halve until a cache fits, and the sizes tried are logged (or raised,
when not even one slot fits). ``close`` frees everything at once: nothing holds the runner or its
cache in a reference cycle.

A captured step reads its output head's memory at every replay, whichever call captured it. A
shortlist head is therefore copied into fixed buffers the graph owns (``graph``): a later call's
shortlist of the same size replays the same graph over its own candidates. A head that cannot be
copied (a packed module) is held by its graph, so no other head can take its memory or its ``id``.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from raymt.workers.search.beam_rules import length_norms
from raymt.workers.search.beams import SlotState
from raymt.workers.model.cache import KVCache
from raymt.workers.model.graphs import CapturedStep, GraphedStep, HostToDevice, Staging, release_cached
from raymt.workers.model.output_head import OutputHead
from raymt.workers.decoder.static_step import StaticIndices

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CacheNeed:
    """What one decode call needs of the cache: ``slots`` sentences of ``beam_size`` rows, sources of
    up to ``source_length`` tokens, ``target_length`` target positions (the longest cap + 1);
    ``static``: the static step's full-capacity cache (allocated at its target length up front)."""

    slots: int
    beam_size: int
    source_length: int
    target_length: int
    static: bool = False

    def __post_init__(self) -> None:
        if min(self.slots, self.beam_size, self.source_length, self.target_length) < 1:
            raise ValueError(f"a cache needs at least one slot, beam, source and target position: {self}")


@dataclass
class RunnerCounts:
    """What the runner built, for tests and logs: cache allocations, beam-state allocations, graph captures."""

    caches: int = 0
    states: int = 0
    captures: int = 0


def bucket(slots: int, limit: int) -> int:
    """The static step's batch bucket for ``slots`` sentences: the next power of two, at most ``limit``."""
    return min(1 << max(slots - 1, 0).bit_length(), max(limit, slots))


def source_capacity(length: int, positions: int) -> int:
    """The source positions a cache is allocated for, sources of up to ``length`` tokens: the next
    power of two, at most the model's ``positions`` (a run of growing sources reallocates a few
    times, not once per call). What a slot's cross-attention K/V take, so memory estimates use it."""
    return max(length, min(1 << (length - 1).bit_length(), positions))


@dataclass(frozen=True, slots=True)
class HeldGraph:
    """One bucket's captured step: ``key`` (generation, call signature, head key) it was captured
    for, the step, and the output head its replays read (fixed buffers, or a head it keeps alive)."""

    key: tuple
    step: GraphedStep
    head: OutputHead


def head_key(head: OutputHead) -> tuple:
    """What a captured step's output head must match to be replayed: a shortlist head's shape (its
    values are copied into the graph's buffers each call), else the head's own tensors (held)."""
    if head.ids is None:  # the whole vocabulary: the model's own weights
        return "vocabulary", id(head.weight), id(head.linear), head.bias is not None
    if head.linear is not None:  # a packed or quantised module: not copied, held by its graph
        return "held", id(head)
    return "shortlist", tuple(head.weight.shape), head.weight.dtype, head.bias is not None, head.skip


def fixed_head(head: OutputHead) -> OutputHead:
    """The head a new graph reads: a shortlist head's tensors in buffers of the graph's own (copies),
    any other head as it is (the graph holds it)."""
    if head.ids is None or head.linear is not None:
        return head
    return OutputHead(head.ids.clone(), head.weight.clone(), None if head.bias is None else head.bias.clone(),
                      None, head.skip)


def fill_head(fixed: OutputHead, head: OutputHead) -> None:
    """This call's shortlist ``head`` copied into a graph's ``fixed`` buffers of the same shape
    (queued before the call's replays, on the same stream); nothing for a head the graph holds."""
    if fixed is head or head.ids is None or head.linear is not None:
        return
    fixed.ids.copy_(head.ids)  # (C,)
    fixed.weight.copy_(head.weight)  # (C, E)
    if head.bias is not None:
        fixed.bias.copy_(head.bias)  # (C,)


class DecodeRunner:
    """The decoder's long-lived state on one device (see the module docstring). ``capture``: builds a
    captured step (``graphs.CapturedStep``); given, graphs are used on any device (tests count them
    on the CPU); by default they are used on CUDA only."""

    def __init__(self, model, *, capture: Callable | None = None) -> None:
        self.model, self.device = model, torch.device(model.device)
        self.counts = RunnerCounts()
        self.cache: KVCache | None = None
        self.state: SlotState | None = None
        self.slot_cap = 0  # > 0: the most slots memory allowed (an allocation or capture ran out)
        self.generation = 0  # bumped whenever the cache or the state is reallocated (graphs read them)
        self._layout = 0  # the cache's target capacity when last reserved
        self._ops = None  # the model's step backend the cache was made for (it decides zeroing)
        self._capture, self._graphs_on = capture, capture is not None or self.device.type == "cuda"
        self._norm: tuple[float, Tensor] | None = None
        self._beams: dict[int, Tensor] = {}
        self._staging: Staging | None = None
        self._static: dict[tuple, StaticIndices] = {}
        self._graphs: dict[int, HeldGraph] = {}  # bucket -> its captured step
        self._stream = self._pool = None
        self._capture_tried: list[int] = []  # buckets whose capture ran out of memory
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)  # this actor's thread: device N from here on

    # ------------------------------------------------------------------ device
    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Run a decode call on the runner's device: ``torch.cuda.device(index)`` on CUDA, so streams,
        events, graphs and Triton launches created or queued inside land on it."""
        if self.device.type != "cuda":
            yield
            return
        with torch.cuda.device(self.device):
            yield

    # ------------------------------------------------------------------ cache and state
    def reserve(self, need: CacheNeed, *, pad: int) -> int:
        """A cache and beam state that hold ``need`` (reused when they already do) -> the slots granted:
        ``need.slots``, or fewer where memory allowed fewer (the caller then decodes in fewer slots)."""
        slots = min(need.slots, self.slot_cap) if self.slot_cap else need.slots
        if self.cache is not None and self.cache.max_length != self._layout:
            self.generation += 1  # (a dynamic call grew the cache: graphs read the old tensors)
        if not self._cache_fits(need, slots):
            slots = self._allocate(need, slots)
        cache = self.cache
        cache.limit = max(cache.limit, need.target_length)
        if need.static and cache.max_length < need.target_length:
            self._drop_graphs()  # (before the larger K/V are allocated)
            self.generation += 1
            cache.reserve(need.target_length)
        t_cap = max(need.target_length - 1, cache.max_length - 1 if need.static else 1)
        st = self.state
        if st is None or st.running.shape[0] < slots or st.running.shape[1] != need.beam_size \
                or st.pool_tokens.shape[2] < t_cap:
            self.state = st = None  # (the old state freed before the new one is made)
            self._drop_graphs()
            self.state = SlotState.empty(max(slots, cache.cross_k.shape[1]), need.beam_size, t_cap, pad, self.device)
            self.counts.states += 1
            self.generation += 1
        self.state.pruned.zero_()
        self._layout = cache.max_length
        return slots

    def _cache_fits(self, need: CacheNeed, slots: int) -> bool:
        cache = self.cache
        if cache is None or self.model.ops is not self._ops:  # (a cache is made for its step backend)
            return False
        if cache.beam_size != need.beam_size or cache.cross_k.shape[1] < slots \
                or cache.cross_k.shape[3] < need.source_length:
            return False
        zeroed = self.model.ops.zeroed_cache(cache.self_k.dtype, cache.self_k.device, need.static)
        if zeroed and not cache.zeroed:
            self._zero(cache)
        return True

    def _zero(self, cache: KVCache) -> None:
        cache.self_k.zero_()
        cache.self_v.zero_()
        cache.zeroed = True

    def _allocate(self, need: CacheNeed, slots: int) -> int:
        """A new cache for ``slots`` (halved on out of memory, the sizes tried logged): the old one is
        freed first, with every graph and buffer that reads it (``_drop_graphs``). Sources round up
        (``source_capacity``)."""
        old = self.cache
        source = source_capacity(need.source_length, self.model.config.max_position_embeddings)
        slots = max(slots, old.cross_k.shape[1] if old is not None and old.beam_size == need.beam_size else 0)
        slots = min(slots, self.slot_cap) if self.slot_cap else slots
        target = max(need.target_length if need.static else 1, old.max_length if old is not None else 0)
        shape = dict(static=True) if need.static else {}
        if target > 1:
            shape["target_capacity"] = target
        self.cache = self.state = old = None
        self._drop_graphs()
        tried = []
        while True:
            tried.append(slots)
            try:
                self.cache = self.model.new_cache(slots, need.beam_size, source, limit=need.target_length, **shape)
                break
            except (torch.OutOfMemoryError, MemoryError) as e:
                if slots == 1:
                    raise torch.OutOfMemoryError(f"out of memory allocating the decoder's KV cache; slots tried: "
                                                 f"{', '.join(map(str, tried))}: {e}") from e
                slots //= 2
        if len(tried) > 1:
            self.slot_cap = slots
            logger.warning("out of memory allocating the decoder's KV cache; slots tried: %s; decoding with %d",
                           ", ".join(map(str, tried)), slots)
        self._ops = self.model.ops
        self.counts.caches += 1
        self.generation += 1
        return min(slots, need.slots)

    def held_bytes(self) -> int:
        """Bytes the cache and the beam state hold (free to the next call's sizing: they are reused or freed)."""
        tensors = [getattr(x, f.name) for x in (self.cache, self.state) if x is not None
                   for f in x.__dataclass_fields__.values() if isinstance(getattr(x, f.name), Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)

    # ------------------------------------------------------------------ per-call tables
    def norm(self, length_penalty: float, length: int) -> Tensor:
        """(>= length,) float64 ``n ** length_penalty`` (1 at 0; ``beam_rules.length_norms``): one
        tensor, reused while it is long enough."""
        if self._norm is None or self._norm[0] != length_penalty or self._norm[1].shape[0] < length:
            size = max(length, self.cache.max_length + 2 if self.cache is not None else 0)
            self._norm = (length_penalty, length_norms(length_penalty, size, self.device))
            self.generation += 1
        return self._norm[1]

    def beams(self, beam_size: int) -> Tensor:
        """(K,) 0 .. K - 1 on the device."""
        if beam_size not in self._beams:
            self._beams[beam_size] = torch.arange(beam_size, device=self.device)
        return self._beams[beam_size]

    def copier(self, size: int, ahead: int) -> HostToDevice:
        """The step's host-to-device copy of up to ``size`` int64 values, up to ``ahead`` steps queued
        before one is read back: through pinned staging buffers on CUDA (kept and grown), plain elsewhere."""
        if self.device.type == "cuda":
            st = self._staging
            if st is None or st.buffers[0].numel() < size or len(st.buffers) < ahead + 1:
                self._staging = Staging.for_device(size, self.device, ahead)
        return HostToDevice(self.device, self._staging)

    # ------------------------------------------------------------------ static step and graphs
    def static_indices(self, slots: int, beam_size: int, forced_eos: bool, copier: HostToDevice,
                       forced_first: bool = False) -> StaticIndices:
        """The static step's index buffer for this bucket and cache, kept across calls (a graph reads it);
        ``forced_first``: its sentences' first tokens are forced (M2M100 / NLLB target languages)."""
        cache = self.cache
        key = (slots, beam_size, forced_eos, forced_first, cache.max_length, cache.cross_k.shape[3], self.generation)
        if key not in self._static:
            self._static = {k: v for k, v in self._static.items() if k[-1] == self.generation}
            self._static[key] = StaticIndices(slots, beam_size, cache.max_length - 1, cache.cross_k.shape[3],
                                              forced_eos, self.device, copier, forced_first)
        indices = self._static[key]
        indices.to_device = copier
        indices.reset()
        return indices

    def graph(self, slots: int, signature: tuple, head: OutputHead) -> tuple[GraphedStep | None, OutputHead]:
        """The captured static step for this bucket (``slots``), call ``signature`` (search, forced
        EOS, forced first tokens: what the step reads besides the runner's tensors and its head) and
        output ``head``, and the head the step must read: a shortlist head copied into the graph's
        fixed buffers (``fixed_head``), so every replay reads this call's candidates. (None, ``head``)
        where steps run eagerly. One capture per bucket while the cache, state, signature and the
        head's shape stay."""
        if not self._graphs_on:
            return None, head
        key = (self.generation, signature, head_key(head))
        held = self._graphs.get(slots)
        if held is not None and held.key == key:
            fill_head(held.head, head)
            return held.step, held.head
        self._graphs.pop(slots, None)  # (its graph's memory returns to the pool first)
        self._graphs = {b: g for b, g in self._graphs.items() if g.key[0] == self.generation}  # stale ones too
        if self.device.type == "cuda":
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device)
            if self._pool is None or not any(g.step.graph is not None for g in self._graphs.values()):
                self._pool = torch.cuda.graph_pool_handle()  # (torch refuses to capture into a pool no graph holds)
        graph = GraphedStep()  # (made without arguments: a stand-in that runs steps eagerly may replace it)
        graph.stream, graph.pool, graph.label = self._stream, self._pool, f"{slots} slots"
        graph.capture = functools.partial(self._counted_capture, slots)
        self._graphs[slots] = HeldGraph(key, graph, fixed_head(head))
        return graph, self._graphs[slots].head

    def _drop_graphs(self) -> None:
        """Every captured graph (its private pool with it: the step's logits and work tensors), the
        static index buffers and the graphs' heads dropped, and torch's cached blocks handed back,
        before the cache or the state is reallocated: they read the old tensors, and would hold
        their memory beside the new ones."""
        self._graphs.clear()
        self._static.clear()
        self._pool = None
        release_cached(self.device)

    def _counted_capture(self, slots: int, step: Callable[[], Tensor], stream, pool):
        """One capture (counted); out of memory, later calls decode in at most half the slots."""
        self.counts.captures += 1
        try:
            return (self._capture or CapturedStep)(step, stream, pool)
        except torch.OutOfMemoryError as e:
            self._capture_tried.append(slots)
            self.slot_cap = max(1, slots // 2)
            self._graphs.pop(slots, None)
            raise torch.OutOfMemoryError(f"slots tried: {', '.join(map(str, self._capture_tried))}; later calls "
                                         f"decode in at most {self.slot_cap}: {e}") from e

    def close(self) -> None:
        """Frees the cache, state, graphs and buffers now (a weakref to the cache dies here)."""
        self._graphs.clear()
        self._static.clear()
        self.cache = self.state = self._norm = self._staging = None
        self._beams.clear()
        self._stream = self._pool = None
        release_cached(self.device)
