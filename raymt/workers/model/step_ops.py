"""The decode step's small operators, one typed backend chosen once per model and device.

    ATEN       AtenOps: ATen operators, any device and dtype
    TritonOps  ATen's with the fused Triton log-softmax + top-k (workers/kernels/triton_ops.py): a GPU's
    NativeOps  workers/kernels/native.py's fused C++ kernels: CPU, float32; each row reads exactly its own
               prefix through the cache's ancestry table (no zeroed cache needed: ``zeroed_cache``)

``Decoder.step`` and the search steps call ``ops.row_top`` / ``self_attention`` / ``cross_attention``
/ ``add_norm`` / ``feed_forward`` and never ask which backend they hold. A step the native kernels
cannot serve (another dtype or device) is handed to ``ATEN`` by ``for_step``, once per step.
The backend is set by ``workers/kernels/speedups.py`` on the CPU (``NativeOps`` where the kernels build) and
by ``workers/kernels/triton_ops.device_ops`` on a GPU (``TritonOps`` where Triton imports).
"""
from __future__ import annotations


import torch
from torch import Tensor, nn

from raymt.workers.model.cache import KVCache, StepAt

NEG_INF = float("-inf")


def attend(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """One query per row over cached positions. q (N, H, 1, D); keys/values (N, H, t, D), any strides;
    mask (N, 1, 1, t) bool or None -> (N, H, 1, D). Batched matmuls read the strided views in place;
    measured faster than SDPA's CPU kernel for a single query."""
    scores = torch.matmul(q, keys.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (N, H, 1, t)
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    return torch.matmul(torch.softmax(scores, dim=-1), values)


def gather_history(keys: Tensor, values: Tensor, ancestry: Tensor) -> tuple[Tensor, Tensor]:
    """Every run row's history copied out through the ancestry: keys/values (t, R, H, D), one layer
    of the cache; ancestry (t, N) -> (N, H, t, D) x 2 (ATen's path; the Triton kernel reads in place)."""
    steps = torch.arange(ancestry.shape[0], device=ancestry.device)[:, None]  # (t, 1)
    return keys[steps, ancestry].permute(1, 2, 0, 3), values[steps, ancestry].permute(1, 2, 0, 3)


class AtenOps:
    """ATen operators: any device and dtype."""

    beam_kernel = None  # the fused beam step after the output layer (NativeOps: the CPU, any K), or None
    backend = "aten"  # the kernels' name in a unit's stats (workers/kernels/native.py decoder_kernels)

    def for_step(self, x: Tensor, cache: KVCache) -> AtenOps:
        """The backend that serves this step (x (N, E))."""
        return self

    def zeroed_cache(self, dtype: torch.dtype, device: torch.device, static: bool) -> bool:
        """Whether the K/V cache must be zero where never written: ATen's attention reads every
        position up to the step's longest and masks (a masked NaN would still poison the softmax)."""
        return True

    def may_any(self, mask: Tensor) -> bool:
        """Whether any entry of ``mask`` may be set: the answer where reading it costs nothing (a CPU
        tensor is host memory), else True (unknown: the caller does the work, the device is never
        read mid-step)."""
        return bool(mask.any()) if mask.device.type == "cpu" else True

    def row_top(self, logits: Tensor, num: int, skip: int) -> tuple[Tensor, Tensor]:
        """logits (N, V|C) -> each row's ``num`` best log-probs and their columns (N, M); column ``skip``
        (``<pad>``, or -1) banned. One log-softmax (``<pad>`` in the normaliser, as HF), one top-k."""
        lp = torch.log_softmax(logits.float(), dim=-1)  # (N, V|C)
        if skip >= 0:
            lp[:, skip] = NEG_INF
        return torch.topk(lp, min(num, lp.shape[1]), dim=1)

    def self_attention(self, sa: nn.Module, x: Tensor, cache: KVCache, layer: int, at: StepAt) -> Tensor:
        """Write this step's K/V of ``layer`` at each row's position, then attend over the row's
        history through its ancestry. x (N, E) -> (N, E), heads merged."""
        n = x.shape[0]
        q, k, v = sa.step_qkv(x)  # (N, E), (N, H, D), (N, H, D)
        cache.write(layer, at, k, v)
        keys, values = gather_history(cache.self_k[:at.t, layer], cache.self_v[:at.t, layer], at.ancestry)
        return attend(sa.heads(q), keys, values, at.mask).view(n, -1)  # (N, H, 1, D) -> (N, E)

    def cross_attention(self, q: Tensor, cache: KVCache, layer: int, at: StepAt) -> Tensor:
        """Every row's query over its sentence's source. q (N, E) -> (N, E).

        The rows are laid out in the (B' x K) grid of the planned slots (empty entries get zero
        queries), so each sentence's beams meet its keys in one (K, D) x (D, s) product: scale, mask
        and scores in one ``baddbmm``, then softmax and ``bmm``."""
        b, k = at.slots.shape[0], cache.beam_size
        _, _, h, _, d = cache.cross_k.shape
        n, e = q.shape
        grid = q.new_zeros(b * k, e)
        grid[at.grid] = q
        q = grid.view(b, k, h, d).transpose(1, 2).reshape(b * h, k, d)  # (B'H, K, D)
        keys, values, bias = (_planned(x, at) for x in (cache.cross_k[layer], cache.cross_v[layer], cache.cross_bias))
        keys, values = keys[:, :, :at.s].reshape(b * h, at.s, d), values[:, :, :at.s].reshape(b * h, at.s, d)
        bias = bias[:, :, :at.s][:, None].expand(b, h, 1, at.s).reshape(b * h, 1, at.s)
        scores = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=d ** -0.5)  # (B'H, K, s)
        out = torch.bmm(torch.softmax(scores, dim=-1), values)  # (B'H, K, D)
        return out.view(b, h, k, d).transpose(1, 2).reshape(b * k, e)[at.grid]  # (N, E)

    def add_norm(self, norm: nn.LayerNorm, x: Tensor, h: Tensor) -> Tensor:
        """The post-norm residual ``norm(x + h)``, (N, E). Pre-norm models (M2M100) never call it:
        ``Decoder._pre_norm_step`` normalises and adds itself."""
        return norm(x + h)

    def feed_forward(self, layer: nn.Module, x: Tensor) -> Tensor:
        return layer.feed_forward(x)


def _planned(x: Tensor, at: StepAt) -> Tensor:
    """x (slots, ...) -> the planned slots' (B', ...): a view when they are consecutive."""
    if at.first >= 0:
        return x[at.first: at.first + at.slots.shape[0]]
    return x.index_select(0, at.slots)


ATEN = AtenOps()


class NativeOps(AtenOps):
    """The fused C++ kernels (``torch.ops.raymt``, workers/kernels/native.py): CPU, float32."""

    backend = "native"

    def __init__(self, kernels) -> None:
        self.kernels = kernels
        self.beam_kernel = kernels.beam_step  # (workers/kernels/csrc/beam_step.cpp; used by workers/search/beams.py)

    def for_step(self, x: Tensor, cache: KVCache) -> AtenOps:
        usable = x.dtype == torch.float32 and x.device.type == "cpu" and cache.self_k.is_contiguous()
        return self if usable else ATEN

    def zeroed_cache(self, dtype: torch.dtype, device: torch.device, static: bool) -> bool:
        """Each row reads exactly its own written positions, but a static step's idle rows read up
        to the scratch position; other dtypes and devices take ATen's path."""
        return static or dtype != torch.float32 or device.type != "cpu"

    def row_top(self, logits: Tensor, num: int, skip: int) -> tuple[Tensor, Tensor]:
        """Log-softmax, ``<pad>`` ban and top-k in one scan pair per row: bit-equal to ``AtenOps.row_top``."""
        if logits.device.type != "cpu":
            return ATEN.row_top(logits, num, skip)
        return self.kernels.row_top_log_softmax(logits.float().contiguous(), min(num, logits.shape[1]), skip)

    def self_attention(self, sa: nn.Module, x: Tensor, cache: KVCache, layer: int, at: StepAt) -> Tensor:
        scale = sa.head_dim ** -0.5  # (each row bounded by its own position, shared or not)
        if sa.qkv_proj is not None:  # K/V written from the fused QKV output and attended in one call
            return self.kernels.self_attention_step(sa.qkv_proj(x), cache.self_k, cache.self_v, at.ancestry, at.rows,
                                                    at.positions, layer, at.t, scale)
        q, k, v = sa.step_qkv(x)
        cache.write(layer, at, k, v)
        return self.kernels.self_attention(q, cache.self_k, cache.self_v, at.ancestry, at.positions, layer, at.t, scale)

    def cross_attention(self, q: Tensor, cache: KVCache, layer: int, at: StepAt) -> Tensor:
        if q.dtype != torch.float32 or not cache.cross_k.is_contiguous():
            return ATEN.cross_attention(q, cache, layer, at)
        return self.kernels.cross_attention(q, cache.cross_k, cache.cross_v, layer, None, at.sentence,
                                            cache.source_lengths, cache.cross_k.shape[-1] ** -0.5)

    def add_norm(self, norm: nn.LayerNorm, x: Tensor, h: Tensor) -> Tensor:
        return self.kernels.add_layer_norm(x, h, norm.weight, norm.bias, norm.eps)

    def feed_forward(self, layer: nn.Module, x: Tensor) -> Tensor:
        if layer.normalize_before:  # the fused add + LayerNorm is post-norm: a pre-norm layer keeps its own
            return layer.feed_forward(x)
        return self.add_norm(layer.final_layer_norm, x, layer.fc2(layer.act(layer.fc1(x))))
