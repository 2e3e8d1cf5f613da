"""The GPU's step kernels in Triton: the fused log-softmax + top-k (the top-up paper's Algorithm 3),
self-attention read in place through the cache's ancestry, and cross-attention over each
sentence's own source.

ATen's output step on a GPU is four kernels and three passes over the (N, V) logits: a float32
copy (bf16 logits), ``log_softmax`` (reads, writes), the ``<pad>`` ban, ``topk`` (reads again).
Here the logits are read once, in their own dtype, and only (N, k) comes back:

    _chunk_top  grid (N, chunks): each program reads BLOCK columns of one row once and writes the
                chunk's max, its sum of exp(x - max) and its k best (value, column), ``<pad>`` kept
                in the sum and out of the top-k (as HF normalises before banning);
    _merge_top  grid (N,): combines a row's chunk sums into its log-normaliser and its chunks' k
                best into the row's k best, best first; equal values keep the lower column first
                (as the CPU kernel, ``workers/kernels/csrc/decode_ops.cpp``).

The bytes-moved floor of the step is reading the logits once (N x V x the dtype's size);
``benchmarks/bench_gpu.py`` measures both against it. Log-probs are float32 whatever the logits' dtype.

``TritonOps`` is the step backend a GPU decoder gets (``device_ops``): ATen's, with this
``row_top`` and ``self_attention`` through ``_ancestry_attention``: each row reads its own K/V
history in place through the cache's ancestry table (workers/model/cache.py), where ATen's path gathers a
(t, N, H, D) copy of every row's keys and values over the step's longest history, per layer (a
static step's t is the cache's whole capacity); and ``cross_attention`` through ``_source_attention``:
each row reads its sentence's source K/V up to that source's length, where ATen's path reads every
planned slot's over the step's longest source (a static step's: the cache's whole source capacity,
the longest source of the work unit). The same kernels run on the CPU under Triton's
interpreter (``TRITON_INTERPRET=1``, set before this module is imported), which is how CI tests them
(tests/workers/test_triton_ops.py).
"""
from __future__ import annotations

import logging
import os

import torch
from torch import Tensor

from raymt.workers.model.cache import KVCache, StepAt
from raymt.workers.model.step_ops import ATEN, AtenOps

logger = logging.getLogger(__name__)

try:
    import triton
    import triton.language as tl
except ImportError:  # (the CPU product never needs it: the ATen row_top serves every device)
    triton = None

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
MAX_CANDIDATES = 4096  # chunks x k merged by one program: the block size grows with k to stay under it
ATTENTION_BLOCK = 16  # positions per iteration: sm_90, 4 warps, D 64: 56 registers (32: 143, 64: 253; 256 spills)

if triton is not None:
    @triton.jit
    def _chunk_top(logits, stride, v, skip, chunk_max, chunk_sum, top_val, top_col, chunks,
                   K: tl.constexpr, BLOCK: tl.constexpr):
        row, chunk = tl.program_id(0), tl.program_id(1)
        cols = chunk * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
        inside = cols < v
        x = tl.load(logits + row.to(tl.int64) * stride + cols, mask=inside, other=float("-inf")).to(tl.float32)
        big = tl.max(x, axis=0)
        total = tl.sum(tl.where(inside & (x > float("-inf")), tl.exp(x - big), 0.0), axis=0)
        at = row * chunks + chunk
        tl.store(chunk_max + at, big)
        tl.store(chunk_sum + at, total)
        y = tl.where(cols == skip, float("-inf"), x)  # <pad>: in the normaliser, never a candidate
        lanes = tl.arange(0, BLOCK)
        for i in tl.static_range(K):  # k rounds of arg-max, each taking the best left out
            best, where = tl.max(y, axis=0, return_indices=True, return_indices_tie_break_left=True)
            tl.store(top_val + at * K + i, best)
            tl.store(top_col + at * K + i, chunk * BLOCK + where)
            y = tl.where(lanes == where, float("-inf"), y)

    @triton.jit
    def _merge_top(chunk_max, chunk_sum, top_val, top_col, out_val, out_col, chunks, fill,
                   K: tl.constexpr, CHUNKS: tl.constexpr, CANDIDATES: tl.constexpr):
        row = tl.program_id(0)
        c = tl.arange(0, CHUNKS)
        inside = c < chunks
        m = tl.load(chunk_max + row * chunks + c, mask=inside, other=float("-inf"))  # (CHUNKS,)
        s = tl.load(chunk_sum + row * chunks + c, mask=inside, other=0.0)
        big = tl.max(m, axis=0)
        norm = big + tl.log(tl.sum(tl.where(m > float("-inf"), s * tl.exp(m - big), 0.0), axis=0))
        j = tl.arange(0, CANDIDATES)  # every chunk's k best, chunk by chunk: lower columns first
        have = j < chunks * K
        val = tl.load(top_val + row * chunks * K + j, mask=have, other=float("-inf"))
        col = tl.load(top_col + row * chunks * K + j, mask=have, other=0)
        for i in tl.static_range(K):
            best, where = tl.max(val, axis=0, return_indices=True, return_indices_tie_break_left=True)
            picked = tl.sum(tl.where(j == where, col, 0), axis=0)
            tl.store(out_val + row * K + i, best - norm)
            tl.store(out_col + row * K + i, tl.where(best > float("-inf"), picked, fill))
            val = tl.where(j == where, float("-inf"), val)

    @triton.jit
    def _attend_block(query, k, v, inside, best, total, acc):
        """One block of keys and values (BLOCK, D) into a query's running softmax (float32): the
        running max ``best``, the sum of exp(score - best) ``total`` and the weighted values ``acc``
        (D,), rescaled when the max moves (the online softmax)."""
        scores = tl.where(inside, tl.sum(k * query[None, :], axis=1), float("-inf"))  # (BLOCK,)
        new_best = tl.maximum(best, tl.max(scores, axis=0))
        weights = tl.exp(scores - new_best)
        rescale = tl.exp(best - new_best)
        total = total * rescale + tl.sum(weights, axis=0)
        return new_best, total, acc * rescale + tl.sum(weights[:, None] * v, axis=0)

    @triton.jit
    def _ancestry_attention(q, keys, values, out, stride_kt, stride_kr, ancestry, reads, stride_at, scale,
                            H: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        row, head = tl.program_id(0), tl.program_id(1)
        d = tl.arange(0, D)
        query = tl.load(q + (row * H + head) * D + d).to(tl.float32) * scale  # (D,)
        count = tl.load(reads + row)  # positions 0 .. count - 1: the row's own history, nothing past it
        best, total, acc = float("-inf"), 0.0, tl.zeros((D,), dtype=tl.float32)
        for start in range(0, count, BLOCK):
            p = start + tl.arange(0, BLOCK)  # (BLOCK,)
            inside = p < count
            src = tl.load(ancestry + p.to(tl.int64) * stride_at + row, mask=inside, other=0)  # the row's ancestor at p
            at = p.to(tl.int64)[:, None] * stride_kt + src[:, None] * stride_kr + head * D + d[None, :]  # (BLOCK, D)
            k = tl.load(keys + at, mask=inside[:, None], other=0.0).to(tl.float32)
            v = tl.load(values + at, mask=inside[:, None], other=0.0).to(tl.float32)
            best, total, acc = _attend_block(query, k, v, inside, best, total, acc)
        tl.store(out + (row * H + head) * D + d, tl.where(total > 0, acc / total, 0.0).to(out.dtype.element_ty))

    @triton.jit
    def _source_attention(q, keys, values, out, stride_ks, stride_kh, sentence, lengths, scale,
                          H: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        row, head = tl.program_id(0), tl.program_id(1)
        d = tl.arange(0, D)
        query = tl.load(q + (row * H + head) * D + d).to(tl.float32) * scale  # (D,)
        slot = tl.load(sentence + row).to(tl.int64)
        count = tl.load(lengths + slot)  # the sentence's source tokens: nothing past them is read
        base = slot * stride_ks + head * stride_kh
        best, total, acc = float("-inf"), 0.0, tl.zeros((D,), dtype=tl.float32)
        for start in range(0, count, BLOCK):
            p = start + tl.arange(0, BLOCK)  # (BLOCK,)
            inside = p < count
            at = base + p.to(tl.int64)[:, None] * D + d[None, :]  # (BLOCK, D): one contiguous block
            k = tl.load(keys + at, mask=inside[:, None], other=0.0).to(tl.float32)
            v = tl.load(values + at, mask=inside[:, None], other=0.0).to(tl.float32)
            best, total, acc = _attend_block(query, k, v, inside, best, total, acc)
        tl.store(out + (row * H + head) * D + d, tl.where(total > 0, acc / total, 0.0).to(out.dtype.element_ty))


def available() -> bool:
    """Whether the kernels can run here: Triton imports, and a GPU (or the interpreter) runs them."""
    return triton is not None and (INTERPRETED or torch.cuda.is_available())


def block_size(v: int, k: int) -> int:
    """Columns per program: 2048, or more where chunks x k would pass ``MAX_CANDIDATES``."""
    block = 2048
    while triton.cdiv(v, block) * k > MAX_CANDIDATES:
        block *= 2
    return block


def row_top_log_softmax(logits: Tensor, k: int, skip: int = -1) -> tuple[Tensor, Tensor]:
    """logits (N, V), any float dtype, unit column stride -> (log_probs (N, k) float32, columns (N, k)
    int64), best first; column ``skip`` (or -1) in the normaliser, never a candidate. Slots no column
    fills (k > V - 1, or -inf logits) hold -inf and ``skip`` (0 when there is none)."""
    n, v = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    k = min(k, v)
    block = block_size(v, k)
    chunks = triton.cdiv(v, block)
    dev = logits.device
    chunk_max = torch.empty((n, chunks), dtype=torch.float32, device=dev)
    chunk_sum = torch.empty((n, chunks), dtype=torch.float32, device=dev)
    top_val = torch.empty((n, chunks, k), dtype=torch.float32, device=dev)
    top_col = torch.empty((n, chunks, k), dtype=torch.int64, device=dev)
    out_val = torch.empty((n, k), dtype=torch.float32, device=dev)
    out_col = torch.empty((n, k), dtype=torch.int64, device=dev)
    if n == 0:
        return out_val, out_col
    _chunk_top[(n, chunks)](logits, logits.stride(0), v, skip, chunk_max, chunk_sum, top_val, top_col, chunks,
                            K=k, BLOCK=block)
    _merge_top[(n,)](chunk_max, chunk_sum, top_val, top_col, out_val, out_col, chunks, skip if 0 <= skip < v else 0,
                     K=k, CHUNKS=triton.next_power_of_2(chunks), CANDIDATES=triton.next_power_of_2(chunks * k))
    return out_val, out_col


def _per_row_and_head(kernel, q: Tensor, keys: Tensor, values: Tensor, *args) -> Tensor:
    """Launch an attention kernel with one program per (row, head): q (N, H, D) -> out (N, H, D).
    Its arguments: q, keys, values, out, keys' two outer strides, then ``args``; keys/values one
    cache layer, unit strides over the last two dimensions."""
    n, h, d = q.shape
    out = torch.empty_like(q)
    if n == 0:
        return out
    assert keys.stride(3) == 1 and keys.stride(2) == d and keys.stride() == values.stride(), "one cache layer"
    kernel[(n, h)](q.contiguous(), keys, values, out, keys.stride(0), keys.stride(1), *args,
                   H=h, D=d, BLOCK=ATTENTION_BLOCK)
    return out


def ancestry_attention(q: Tensor, keys: Tensor, values: Tensor, ancestry: Tensor, reads: Tensor,
                       scale: float) -> Tensor:
    """One query per row over its own history, read in place through the ancestry table (no gathered
    copy of the K/V). q (N, H, D); keys/values (T, R, H, D), one layer of the cache (unit strides
    over H and D); ancestry (t, N): the cache row holding position p of run row n; reads (N,): how
    many positions row n attends over (its position + 1) -> (N, H, D) in q's dtype, float32 inside.
    Bytes moved: each row's own K/V once (the floor), where ATen's gather writes (t, N, H, D) and
    reads it again, over every row's t, not its own length."""
    return _per_row_and_head(_ancestry_attention, q, keys, values, ancestry, reads, ancestry.stride(0), scale)


def source_attention(q: Tensor, keys: Tensor, values: Tensor, sentence: Tensor, lengths: Tensor,
                     scale: float) -> Tensor:
    """Each row's query over its own sentence's source, read in place. q (N, H, D); keys/values
    (slots, H, S, D), one layer of the cross-attention cache (contiguous over S and D); sentence (N,)
    each row's slot; lengths (slots,) each slot's source tokens -> (N, H, D) in q's dtype, float32
    inside. Bytes moved: each row's own source K/V (its beams share them, through the L2 cache),
    where ATen's path reads every planned slot's K/V over the step's longest source (a static
    step's: the cache's whole source capacity)."""
    return _per_row_and_head(_source_attention, q, keys, values, sentence, lengths, scale)


class TritonOps(AtenOps):
    """ATen's operators with the fused Triton ``row_top``, ``self_attention`` and ``cross_attention``:
    the GPU decoder's backend."""

    backend = "triton"

    def zeroed_cache(self, dtype: torch.dtype, device: torch.device, static: bool) -> bool:
        """The kernel reads each row's own written history (a static step's idle rows: position 0,
        always written), so no zeroing: a memset of the whole cache per decode saved."""
        return not (device.type == "cuda" or INTERPRETED)

    def row_top(self, logits: Tensor, num: int, skip: int) -> tuple[Tensor, Tensor]:
        if logits.device.type != "cuda" and not INTERPRETED:
            return ATEN.row_top(logits, num, skip)
        return row_top_log_softmax(logits, num, skip)

    def self_attention(self, sa, x: Tensor, cache: KVCache, layer: int, at: StepAt) -> Tensor:
        """ATen's K/V write, then ``ancestry_attention``: each row reads its own history in place.
        x (N, E) -> (N, E)."""
        if x.device.type != "cuda" and not INTERPRETED:
            return ATEN.self_attention(sa, x, cache, layer, at)
        q, k, v = sa.step_qkv(x)  # (N, E), (N, H, D), (N, H, D)
        cache.write(layer, at, k, v)
        n = x.shape[0]
        out = ancestry_attention(q.reshape(n, sa.num_heads, sa.head_dim), cache.self_k[:, layer],
                                 cache.self_v[:, layer], at.ancestry, at.reads, sa.head_dim ** -0.5)
        return out.view(n, -1)

    def cross_attention(self, q: Tensor, cache: KVCache, layer: int, at: StepAt) -> Tensor:
        """``source_attention``: each row reads its own sentence's source K/V, its length and no more.
        q (N, E) -> (N, E)."""
        if q.device.type != "cuda" and not INTERPRETED:
            return ATEN.cross_attention(q, cache, layer, at)
        _, _, h, _, d = cache.cross_k.shape
        n = q.shape[0]
        out = source_attention(q.view(n, h, d), cache.cross_k[layer], cache.cross_v[layer], at.sentence,
                               cache.source_lengths, d ** -0.5)
        return out.view(n, -1)


def device_ops(device: torch.device) -> AtenOps:
    """The step backend of a decoder on ``device`` other than the CPU (the CPU's is set by
    ``workers/kernels/speedups.py``): ``TritonOps`` where Triton runs, else ATen's (and the log says so)."""
    if device.type == "cuda" and available():
        return TritonOps()
    if device.type == "cuda":
        logger.warning("Triton is not installed (pip install 'raymt[gpu]'): the GPU step runs ATen's operators")
    return ATEN
