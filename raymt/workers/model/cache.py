"""The decoder's cache: one layout for every scheduling policy, backend and device.

The engine decodes up to ``slots`` sentences at once; slot j owns K rows (its beams), rows
``j * K .. j * K + K - 1``, and one copy of its source's cross-attention K/V shared by them.

* **K/V never move.** Row r writes its self-attention key/value for position p at ``[p, :, r]``
  once. Beam reordering rewrites only ``ancestry`` (T, R): ``ancestry[p, r]`` is the row whose K/V
  (and input token) is position p of row r's history. A step copies R x t ints where a copying
  cache would move L x R x t x E floats, twice.
* **Rows at different positions share a step.** Each run row carries its own position; a row
  attends over its own prefix (the native kernels read exactly that, the ATen path masks).
* **Cross-attention per sentence.** A slot's K/V are written at admission (``admit``) and read by
  its beams through their slot; ``source_lengths`` bound what a sentence reads.

``tokens`` (T, R) holds the input token each row fed at each position, so a hypothesis is read back
through the ancestry (``history``) instead of being copied on every reorder.

Dimension letters: L layers, R = slots x K rows, N rows run this step, B' planned slots, T target
capacity, t visible positions this step, S source capacity, s longest planned source, H heads,
D head dim, E d_model.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from raymt.workers.model.graphs import to_device

INITIAL_CAPACITY = 32  # target positions allocated up front; the cache doubles past it


@dataclass(frozen=True, slots=True)
class StepAt:
    """Where one step writes and reads, built once per step by ``KVCache.step_at``.

    rows, positions, grid (N,): the cache row, target position and (B' x K) query-grid entry of each
    run row; sentence (N,) its slot; slots (B',) the planned slots (``first``: the first of them when
    they are consecutive, else -1); t visible positions (max position + 1); s the longest planned
    source; shared: every row at position t - 1 (no mask needed); ancestry (t, N) the rows' ancestry,
    gathered once for every layer; mask (N, 1, 1, t) bool for the ATen path (a zeroed cache), None
    when shared; reads (N,) how many positions each row attends over: its position + 1 (a static
    step's idle rows, whose output is discarded: 1), for kernels that read only a row's own history.
    """

    rows: Tensor
    positions: Tensor
    grid: Tensor
    sentence: Tensor
    slots: Tensor
    first: int
    t: int
    s: int
    shared: bool
    ancestry: Tensor
    mask: Tensor | None
    reads: Tensor


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """Sentences encoded together, waiting for slots: each decoder layer's cross-attention K/V,
    (B, H, S, D) x 2, computed once for the batch (``MarianModel.cross_kv``); ``KVCache.admit``
    copies a sentence's rows into its slot when it is admitted."""

    layers: list[tuple[Tensor, Tensor]]

    def select(self, rows: list[int], length: int) -> list[tuple[Tensor, Tensor]]:
        """Batch rows ``rows``' K/V over their first ``length`` source positions, (A, H, length, D) x 2."""
        keys = self.layers[0][0]
        if rows == list(range(keys.shape[0])) and length == keys.shape[2]:  # the whole batch (batch decoding)
            return self.layers
        pick = to_device(torch.tensor(rows, device="cpu"), keys.device)
        return [(k[pick, :, :length], v[pick, :, :length]) for k, v in self.layers]


@dataclass
class KVCache:
    """self_k/self_v (T, L, R, H, D) time-major; ancestry, tokens (T, R) int64; cross_k/cross_v
    (L, slots, H, S, D); cross_bias (slots, 1, S) additive (0 = token, -inf = padding);
    source_lengths (slots,) int64. ``zeroed``: K/V are zero where never written (the ATen path reads
    masked positions, which must be finite); the native kernels read only written positions."""

    self_k: Tensor
    self_v: Tensor
    ancestry: Tensor
    tokens: Tensor
    cross_k: Tensor
    cross_v: Tensor
    cross_bias: Tensor
    source_lengths: Tensor
    beam_size: int
    zeroed: bool
    limit: int = 0  # the most target positions a decode can reach (0: unbounded): growth stops there

    @classmethod
    def empty(cls, *, layers: int, heads: int, head_dim: int, slots: int, beam_size: int, source_capacity: int,
              dtype: torch.dtype, device: torch.device, zeroed: bool,
              target_capacity: int = INITIAL_CAPACITY, limit: int = 0) -> "KVCache":
        rows, opts = slots * beam_size, dict(dtype=dtype, device=device)
        shape = (target_capacity, layers, rows, heads, head_dim)
        new = torch.zeros if zeroed else torch.empty
        cross = torch.zeros(layers, slots, heads, source_capacity, head_dim, **opts)
        index = torch.zeros(target_capacity, rows, dtype=torch.long, device=device)
        return cls(new(shape, **opts), new(shape, **opts), index, index.clone(), cross, torch.zeros_like(cross),
                   torch.zeros(slots, 1, source_capacity, **opts),
                   torch.ones(slots, dtype=torch.long, device=device), beam_size, zeroed, limit)

    @property
    def max_length(self) -> int:
        """The current capacity in target positions (``reserve`` grows it)."""
        return self.self_k.shape[0]

    def reserve(self, length: int) -> None:
        """Room for ``length`` positions (doubling, so growth costs O(length) overall, but never past
        ``limit``: a doubling past the longest sentence's cap would only hold memory)."""
        if length <= self.max_length:
            return
        cap = max(length, 2 * self.max_length)
        cap = min(cap, max(self.limit, length)) if self.limit else cap
        for name in ("self_k", "self_v", "ancestry", "tokens"):
            old = getattr(self, name)
            zero = self.zeroed or old.dtype == torch.long  # indices stay valid rows everywhere
            new = old.new_zeros((cap, *old.shape[1:])) if zero else old.new_empty((cap, *old.shape[1:]))
            new[: old.shape[0]] = old
            setattr(self, name, new)

    def admit(self, slots: Tensor, cross_kv: Iterable[tuple[Tensor, Tensor]], src_mask: Tensor) -> None:
        """Newly admitted sentences' cross-attention K/V into their slots (A,), written layer by layer
        as ``cross_kv`` yields them: (A, H, s, D) each; src_mask (A, s) bool, a prefix of tokens per sentence."""
        s = src_mask.shape[1]
        for layer, (keys, values) in enumerate(cross_kv):
            self.cross_k[layer, slots, :, :s] = keys
            self.cross_v[layer, slots, :, :s] = values
        bias = torch.zeros(src_mask.shape, dtype=self.cross_bias.dtype, device=self.cross_bias.device)
        self.cross_bias[slots] = float("-inf")
        self.cross_bias[slots, 0, :s] = bias.masked_fill_(~src_mask, float("-inf"))
        self.source_lengths[slots] = src_mask.sum(1)

    def step_at(self, tokens: Tensor, rows: Tensor, positions: Tensor, grid: Tensor, slots: Tensor, *,
                t: int, s: int, shared: bool, first: int, idle: Tensor | None = None) -> StepAt:
        """Record the run rows' input tokens (N,) and make each row its own ancestor at its position,
        then gather the rows' ancestry (t, N) once for every layer (a view when the rows are every
        cache row in order: planned slots from 0 (``first``) covering all rows, as the static step's
        do). ``idle`` (N,) bool: rows run only for the step's shape (a static step's unplanned
        slots), whose output is discarded."""
        self.reserve(t)
        self.tokens[positions, rows] = tokens
        self.ancestry[positions, rows] = rows
        if first == 0 and rows.shape[0] == self.ancestry.shape[1]:  # every row, in order: the identity
            ancestry = self.ancestry[:t]  # (t, R) a view, no copy
        else:
            ancestry = self.ancestry[:t].index_select(1, rows)  # (t, N)
        mask = None
        if not shared and self.zeroed:  # only the ATen path reads masked positions (an unzeroed cache: the
            # native kernels, which bound each row by its own position)
            steps = torch.arange(t, device=rows.device)
            mask = (steps[None, :] <= positions[:, None])[:, None, None, :]  # (N, 1, 1, t)
        reads = positions + 1 if idle is None else torch.where(idle, 1, positions + 1)  # (N,)
        return StepAt(rows, positions, grid, torch.div(rows, self.beam_size, rounding_mode="floor"), slots, first,
                      t, s, shared, ancestry, mask, reads)

    def write(self, layer: int, at: StepAt, keys: Tensor, values: Tensor) -> None:
        """This step's K/V of ``layer`` (N, H, D) x 2, each run row's at its own position."""
        self.self_k[at.positions, layer, at.rows], self.self_v[at.positions, layer, at.rows] = keys, values

    def reorder(self, src_rows: Tensor, dst_rows: Tensor, length: int) -> None:
        """Row dst_rows[i] continues the history of src_rows[i] (M,): the first ``length`` positions."""
        self.ancestry[:length, dst_rows] = self.ancestry[:length, src_rows]  # gathered before written

    def history(self, rows: Tensor, length: int) -> Tensor:
        """The input tokens at positions 1..length-1 of rows (M,), read through their ancestry -> (M, length - 1)."""
        ancestry = self.ancestry[1:length].index_select(1, rows)  # (length - 1, M)
        return self.tokens[1:length].gather(1, ancestry).T
