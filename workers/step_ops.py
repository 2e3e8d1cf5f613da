"""The decode step's small operators, one typed backend chosen once per model and device.

    ATEN       AtenOps: ATen operators, any device and dtype; the batch cache copies rows when
               beams reorder
    NativeOps  workers/native.py's fused C++ kernels: CPU, float32, one shared position per step;
               K/V stay where written and beams reorder an ancestry table (``in_place``)

``Decoder.step`` and the search steps call ``ops.row_top`` / ``self_attention`` / ``cross_attention``
/ ``add_norm`` / ``feed_forward`` and never ask which backend they hold. A step the native kernels
cannot serve (another dtype, per-row positions) is handed to ``ATEN`` by ``for_step``, once per step.
The backend is set by ``workers/speedups.py`` (``NativeOps`` where the kernels build on the CPU).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from workers.decoder_cache import DecoderCache, cached_attention, cross_attention

NEG_INF = float("-inf")


@dataclass(frozen=True, slots=True)
class StepAt:
    """Where a step writes and reads: ``t`` positions visible; ``shared``: every row at position t - 1
    (the batch decoders); else ``positions`` (N,), ``rows`` (N,) cache rows and ``mask`` (N, 1, 1, t)."""

    t: int
    shared: bool
    positions: Tensor | None = None
    rows: Tensor | None = None
    mask: Tensor | None = None


class AtenOps:
    """ATen operators: any device and dtype."""

    in_place = False  # no ancestry table: reordered beams copy their cache rows

    def for_step(self, x: Tensor, cache: DecoderCache, shared: bool) -> AtenOps:
        """The backend that serves this step (x (N, E))."""
        return self

    def row_top(self, logits: Tensor, num: int, pad_id: int, token_ids: Tensor | None) -> tuple[Tensor, Tensor]:
        """logits (N, V|C) -> each row's ``num`` best log-probs and their columns (N, M), ``<pad>`` banned.
        One log-softmax (``<pad>`` in the normaliser, as HF), one top-k. ``token_ids`` (C,): the columns'
        vocabulary ids (a shortlist)."""
        lp = torch.log_softmax(logits.float(), dim=-1)  # (N, V|C)
        if token_ids is None:
            lp[:, pad_id] = NEG_INF
        else:
            lp.masked_fill_((token_ids == pad_id)[None, :], NEG_INF)
        return torch.topk(lp, min(num, lp.shape[1]), dim=1)

    def self_attention(self, sa: nn.Module, x: Tensor, cache: DecoderCache, layer: int, at: StepAt) -> Tensor:
        """Write this step's K/V of ``layer`` into the cache, then attend. x (N, E) -> (N, E), heads merged."""
        n = x.shape[0]
        q, k, v = sa.step_qkv(x)  # (N, E), (N, H, D), (N, H, D)
        if at.shared:
            cache.self_k[at.t - 1, layer, :n], cache.self_v[at.t - 1, layer, :n] = k, v
        else:
            cache.self_k[at.positions, layer, at.rows], cache.self_v[at.positions, layer, at.rows] = k, v
        keys = cache.self_k[:at.t, layer].permute(1, 2, 0, 3)  # (N, H, T, D) strided views of the time-major cache
        values = cache.self_v[:at.t, layer].permute(1, 2, 0, 3)
        return cached_attention(sa.heads(q), keys, values, at.mask).view(n, -1)  # (N, H, 1, D) -> (N, E)

    def cross_attention(self, q: Tensor, cache: DecoderCache, layer: int) -> Tensor:
        """Every row's query over its sentence's source. q (N, E) -> (N, E)."""
        return cross_attention(q, cache, layer)

    def add_norm(self, norm: nn.LayerNorm, x: Tensor, h: Tensor) -> Tensor:
        """The post-norm residual ``norm(x + h)``, (N, E)."""
        return norm(x + h)

    def feed_forward(self, layer: nn.Module, x: Tensor) -> Tensor:
        return layer.feed_forward(x)


ATEN = AtenOps()


class NativeOps(AtenOps):
    """The fused C++ kernels (``torch.ops.raymt``, workers/native.py): CPU, float32."""

    in_place = True  # K/V written once at their row; beams reorder the ancestry table

    def __init__(self, kernels) -> None:
        self.kernels = kernels

    def for_step(self, x: Tensor, cache: DecoderCache, shared: bool) -> AtenOps:
        usable = shared and x.dtype == torch.float32 and cache.self_k.is_contiguous()
        return self if usable else ATEN

    def row_top(self, logits: Tensor, num: int, pad_id: int, token_ids: Tensor | None) -> tuple[Tensor, Tensor]:
        """Log-softmax, ``<pad>`` ban and top-k in one scan pair per row: bit-equal to ``AtenOps.row_top``."""
        if logits.device.type != "cpu":
            return ATEN.row_top(logits, num, pad_id, token_ids)
        skip = pad_id if token_ids is None else _position(token_ids, pad_id)
        return self.kernels.row_top_log_softmax(logits.float().contiguous(), min(num, logits.shape[1]), skip)

    def self_attention(self, sa: nn.Module, x: Tensor, cache: DecoderCache, layer: int, at: StepAt) -> Tensor:
        scale = sa.head_dim ** -0.5
        if sa.qkv_proj is not None:  # K/V written from the fused QKV output and attended in one call
            return self.kernels.self_attention_step(sa.qkv_proj(x), cache.self_k, cache.self_v, cache.ancestry,
                                                    layer, at.t, scale)
        n = x.shape[0]
        q, k, v = sa.step_qkv(x)
        cache.self_k[at.t - 1, layer, :n], cache.self_v[at.t - 1, layer, :n] = k, v
        return self.kernels.self_attention(q, cache.self_k, cache.self_v, cache.ancestry, layer, at.t, scale)

    def cross_attention(self, q: Tensor, cache: DecoderCache, layer: int) -> Tensor:
        if q.dtype != torch.float32 or not cache.cross_k.is_contiguous():
            return ATEN.cross_attention(q, cache, layer)
        return self.kernels.cross_attention(q, cache.cross_k, cache.cross_v, layer, cache.cross_bias,
                                            cache.row_sentences(), cache.cross_k.shape[-1] ** -0.5)

    def add_norm(self, norm: nn.LayerNorm, x: Tensor, h: Tensor) -> Tensor:
        return self.kernels.add_layer_norm(x, h, norm.weight, norm.bias, norm.eps)

    def feed_forward(self, layer: nn.Module, x: Tensor) -> Tensor:
        return self.add_norm(layer.final_layer_norm, x, layer.fc2(layer.act(layer.fc1(x))))


def _position(token_ids: Tensor, token: int) -> int:
    """Where ``token`` sits in a candidate list (C,), or -1."""
    at = (token_ids == token).nonzero()
    return int(at[0, 0]) if at.numel() else -1
