"""Marian transformer math, as HF ``MarianMTModel`` defines it, with incremental decoding.

Module names mirror the HF checkpoint keys (``model.encoder.layers.0.self_attn.q_proj.weight``,
``lm_head.weight``, ``final_logits_bias``), so loading is an identity map (see ``checkpoint.py``).

Post-norm layers, scaled embeddings, static sinusoidal positions, ``final_logits_bias``. The same
modules build HF ``M2M100ForConditionalGeneration`` (M2M100, NLLB-200) from ``ModelConfig``'s variant
fields: pre-norm layers (``normalize_before``), a LayerNorm closing encoder and decoder
(``final_layer_norms``: ``model.encoder.layer_norm``, ``model.decoder.layer_norm``) and fairseq's
position table (``position_style="fairseq"``); it has no ``final_logits_bias`` (the buffer stays zero).
Decoding keeps a self-attention KV cache and cross-attention K/V computed once per sentence
(Devlin et al. 2017, "pre-compute attention", in its transformer form; workers/model/cache.py). Every
decoder row carries its own target position, so rows at different target lengths share one step.

Dimension letters: B batch, N decoder rows (sentences x beams), S source, T target,
V vocab, H heads, D head dim, E d_model.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import record_function  # named scopes for the step profile (benchmarks/step_profile.py)

from raymt.workers.config import ModelConfig
from raymt.workers.model.output_head import OutputHead
from raymt.workers.model.cache import KVCache, StepAt
from raymt.workers.model.step_ops import ATEN, AtenOps


def sinusoidal_table(num_positions: int, dim: int) -> Tensor:
    """HF ``MarianSinusoidalPositionalEmbedding``: sin in the first half, cos in the second."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    j = torch.arange(dim, dtype=torch.float64)[None, :]
    angle = pos / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / dim)  # (P, E)
    sentinel = dim // 2 if dim % 2 == 0 else dim // 2 + 1
    out = torch.empty(num_positions, dim, dtype=torch.float64)
    out[:, :sentinel] = torch.sin(angle[:, 0::2])
    out[:, sentinel:] = torch.cos(angle[:, 1::2])
    return out.float()


def fairseq_table(num_positions: int, dim: int, pad_id: int) -> Tensor:
    """HF ``M2M100SinusoidalPositionalEmbedding`` (fairseq's), its rows from ``pad_id + 1`` on, so row t
    is target or source position t: sin | cos halves at frequencies ``exp(-j log(10000) / (dim/2 - 1))``,
    computed in float32 as HF computes them (bit-equal tables)."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)  # (E/2,)
    angle = torch.arange(num_positions + pad_id + 1, dtype=torch.int64).float()[:, None] * freq[None, :]
    table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)  # (P + pad + 1, 2 * (E/2))
    if dim % 2:
        table = torch.cat([table, torch.zeros(table.shape[0], 1)], dim=1)
    return table[pad_id + 1:].contiguous()  # (P, E)


def activation(name: str):
    return {"swish": F.silu, "silu": F.silu, "relu": F.relu, "gelu": F.gelu,
            "gelu_new": lambda x: F.gelu(x, approximate="tanh")}[name]


class SinusoidalPositions(nn.Module):
    """Static position table; a (frozen) parameter so the checkpoint key ``...embed_positions.weight`` maps."""

    def __init__(self, num_positions: int, dim: int, style: str = "marian", pad_id: int = 0) -> None:
        super().__init__()
        meta = torch.get_default_device().type == "meta"  # a model built for its shapes only: left uncomputed
        if meta:
            table = torch.empty(num_positions, dim)
        elif style == "fairseq":
            table = fairseq_table(num_positions, dim, pad_id)
        else:
            table = sinusoidal_table(num_positions, dim)  # (P, E)
        self.weight = nn.Parameter(table, requires_grad=False)


def positions_of(cfg: ModelConfig) -> SinusoidalPositions:
    return SinusoidalPositions(cfg.max_position_embeddings, cfg.d_model, cfg.position_style, cfg.pad_token_id)


class Attention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.dropout = num_heads, d_model // num_heads, dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.qkv_proj: nn.Module | None = None  # fused (3E, E) projection for decoding (workers/kernels/speedups.py)

    def step_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Decoding step projections. x (N, E) -> q (N, E), k (N, H, D), v (N, H, D)."""
        n = x.shape[0]
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).chunk(3, dim=-1)  # one GEMM instead of three
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return q, k.reshape(n, self.num_heads, self.head_dim), v.reshape(n, self.num_heads, self.head_dim)

    def heads(self, q: Tensor) -> Tensor:
        """q (N, E) -> (N, H, 1, D): one query per row, split into heads."""
        return q.view(q.shape[0], self.num_heads, 1, self.head_dim)

    def split(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def merge(self, x: Tensor) -> Tensor:
        b, _, t, _ = x.shape
        return self.out_proj(x.transpose(1, 2).reshape(b, t, -1))  # (B, T, E)

    def forward(self, x: Tensor, kv: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
        """Full-sequence attention. x (B, T, E), kv (B, S, E), mask (B, 1, T|1, S) bool, True = attend."""
        q, k, v = self.split(self.q_proj(x)), self.split(self.k_proj(kv)), self.split(self.v_proj(kv))
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal and mask is None)
        return self.merge(out)


def feed_forward(layer: nn.Module, x: Tensor) -> Tensor:
    """A layer's FFN sublayer with its residual and norm: post-norm ``norm(x + ffn(x))``, or pre-norm
    ``x + ffn(norm(x))``. x (N|B, [T,] E)."""
    h = layer.final_layer_norm(x) if layer.normalize_before else x
    h = F.dropout(layer.act(layer.fc1(h)), layer.activation_dropout, layer.training)
    h = F.dropout(layer.fc2(h), layer.dropout, layer.training)
    return x + h if layer.normalize_before else layer.final_layer_norm(x + h)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e = cfg.d_model
        self.self_attn = Attention(e, cfg.encoder_attention_heads, cfg.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(e)
        self.fc1 = nn.Linear(e, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, e)
        self.final_layer_norm = nn.LayerNorm(e)
        self.act = activation(cfg.activation_function)
        self.dropout, self.activation_dropout = cfg.dropout, cfg.activation_dropout
        self.normalize_before = cfg.normalize_before

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, S, E), mask (B, 1, 1, S). Post-norm (Marian) or pre-norm (M2M100: x + attn(norm(x)))."""
        if not self.normalize_before:
            h = F.dropout(self.self_attn(x, x, mask), self.dropout, self.training)
            return feed_forward(self, self.self_attn_layer_norm(x + h))
        h = self.self_attn_layer_norm(x)
        x = feed_forward(self, x + F.dropout(self.self_attn(h, h, mask), self.dropout, self.training))
        if x.dtype == torch.float16:  # as HF: the residual stream kept finite in float16
            bound = torch.finfo(x.dtype).max - 1000
            x = x.clamp(-bound, bound)
        return x


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e = cfg.d_model
        self.self_attn = Attention(e, cfg.decoder_attention_heads, cfg.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(e)
        self.encoder_attn = Attention(e, cfg.decoder_attention_heads, cfg.attention_dropout)
        self.encoder_attn_layer_norm = nn.LayerNorm(e)
        self.fc1 = nn.Linear(e, cfg.decoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.decoder_ffn_dim, e)
        self.final_layer_norm = nn.LayerNorm(e)
        self.act = activation(cfg.activation_function)
        self.dropout, self.activation_dropout = cfg.dropout, cfg.activation_dropout
        self.normalize_before = cfg.normalize_before

    def feed_forward(self, x: Tensor) -> Tensor:
        return feed_forward(self, x)

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher-forced. x (B, T, E), memory (B, S, E), src_mask (B, 1, 1, S)."""
        if self.normalize_before:
            h = self.self_attn_layer_norm(x)
            x = x + F.dropout(self.self_attn(h, h, None, causal=True), self.dropout, self.training)
            h = self.encoder_attn(self.encoder_attn_layer_norm(x), memory, src_mask)
            return self.feed_forward(x + F.dropout(h, self.dropout, self.training))
        h = F.dropout(self.self_attn(x, x, None, causal=True), self.dropout, self.training)
        x = self.self_attn_layer_norm(x + h)
        h = F.dropout(self.encoder_attn(x, memory, src_mask), self.dropout, self.training)
        x = self.encoder_attn_layer_norm(x + h)
        return self.feed_forward(x)


class Encoder(nn.Module):
    def __init__(self, cfg: ModelConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.embed_positions = positions_of(cfg)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        self.dropout = cfg.dropout
        self.layer_norm = nn.LayerNorm(cfg.d_model) if cfg.final_layer_norms else None
        self.zero_padding_positions = cfg.position_style == "fairseq"  # fairseq: a <pad> gets the zero row

    def forward(self, src_ids: Tensor, src_mask: Tensor) -> Tensor:
        """src_ids (B, S) long, src_mask (B, S) bool (True = token) -> memory (B, S, E)."""
        s = src_ids.shape[1]
        positions = self.embed_positions.weight[:s]  # (S, E)
        if self.zero_padding_positions:
            positions = positions * src_mask[:, :, None].to(positions.dtype)  # (B, S, E)
        x = self.embed_tokens(src_ids) * self.embed_scale + positions
        x = F.dropout(x, self.dropout, self.training)
        mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, mask)
        return x if self.layer_norm is None else self.layer_norm(x)


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.embed_positions = positions_of(cfg)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        self.dropout = cfg.dropout
        self.layer_norm = nn.LayerNorm(cfg.d_model) if cfg.final_layer_norms else None
        self.normalize_before = cfg.normalize_before
        self.ops: AtenOps = ATEN  # the step's small operators (workers/model/step_ops.py), set by workers/kernels/speedups.py

    def forward(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher-forced. tgt_ids (B, T) -> hidden (B, T, E)."""
        t = tgt_ids.shape[1]
        x = self.embed_tokens(tgt_ids) * self.embed_scale + self.embed_positions.weight[:t]
        x = F.dropout(x, self.dropout, self.training)
        mask = src_mask[:, None, None, :]
        for layer in self.layers:
            x = layer(x, memory, mask)
        return x if self.layer_norm is None else self.layer_norm(x)

    def new_cache(self, slots: int, beam_size: int, source_capacity: int, *, static: bool = False,
                  **kwargs) -> KVCache:
        """An empty cache for ``slots`` sentences of ``beam_size`` rows each (workers/model/cache.py), in the
        weights' dtype and device; zeroed unless the step backend reads only written positions
        (``static``: for the static step, whose idle rows run too)."""
        attn = self.layers[0].self_attn
        weight = self.embed_tokens.weight
        zeroed = kwargs.pop("zeroed", False) or self.ops.zeroed_cache(weight.dtype, weight.device, static)
        return KVCache.empty(layers=len(self.layers), heads=attn.num_heads, head_dim=attn.head_dim, slots=slots,
                             beam_size=beam_size, source_capacity=source_capacity, dtype=weight.dtype,
                             device=weight.device, zeroed=zeroed, **kwargs)

    def cross_kv(self, memory: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
        """Cross-attention K/V of each layer in turn, once per sentence. memory (A, s, E) -> (A, H, s, D) x 2."""
        for layer in self.layers:
            ca = layer.encoder_attn
            yield ca.split(ca.k_proj(memory)), ca.split(ca.v_proj(memory))

    def step(self, tokens: Tensor, at: StepAt, cache: KVCache) -> Tensor:
        """One incremental step of the rows ``at`` runs (workers/model/cache.py). tokens (N,) -> hidden (N, E);
        writes each row's K/V at its position."""
        positions = self.embed_positions.weight.index_select(0, at.positions)  # (N, E)
        x = self.embed_tokens(tokens) * self.embed_scale + positions
        ops = self.ops.for_step(x, cache)
        if self.normalize_before:
            return self._pre_norm_step(ops, x, at, cache)
        for i, layer in enumerate(self.layers):
            sa, ca = layer.self_attn, layer.encoder_attn
            x = ops.add_norm(layer.self_attn_layer_norm, x, sa.out_proj(ops.self_attention(sa, x, cache, i, at)))
            h = ops.cross_attention(ca.q_proj(x), cache, i, at)  # (N, E): each sentence's beams together
            x = ops.add_norm(layer.encoder_attn_layer_norm, x, ca.out_proj(h))
            x = ops.feed_forward(layer, x)
        return x if self.layer_norm is None else self.layer_norm(x)

    def _pre_norm_step(self, ops: AtenOps, x: Tensor, at: StepAt, cache: KVCache) -> Tensor:
        """``step``'s layers for pre-norm models (M2M100, NLLB): x + sublayer(norm(x)). The backend's
        attention serves them as it serves post-norm ones; its fused add + LayerNorm is post-norm only,
        so the norms and residual adds are ATen's here. x (N, E) -> (N, E)."""
        for i, layer in enumerate(self.layers):
            sa, ca = layer.self_attn, layer.encoder_attn
            x = x + sa.out_proj(ops.self_attention(sa, layer.self_attn_layer_norm(x), cache, i, at))
            h = ops.cross_attention(ca.q_proj(layer.encoder_attn_layer_norm(x)), cache, i, at)  # (N, E)
            x = layer.feed_forward(x + ca.out_proj(h))  # (pre-norm: never the backend's post-norm FFN)
        return x if self.layer_norm is None else self.layer_norm(x)


class MarianInner(nn.Module):
    """HF's ``model.`` prefix: shared embedding, encoder, decoder."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_token_id)
        if cfg.share_encoder_decoder_embeddings:
            enc_embed = dec_embed = self.shared
        else:
            enc_embed = self.shared
            dec_embed = nn.Embedding(cfg.decoder_vocab_size, cfg.d_model, padding_idx=cfg.pad_token_id)
        self.encoder = Encoder(cfg, enc_embed)
        self.decoder = Decoder(cfg, dec_embed)


class MarianModel(nn.Module):
    """Encoder-decoder with output projection ``lm_head`` (+ ``final_logits_bias``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = MarianInner(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.decoder_vocab_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(1, cfg.decoder_vocab_size))
        self.vocab_head: nn.Module | None = None  # faster full-vocabulary output layer (workers/kernels/speedups.py)
        self.pack_head = None  # (weight (C, E), bias) -> module: a faster shortlist head (workers/kernels/speedups.py)
        self.has_logits_bias: bool | None = None  # read from the weights once (load_checkpoint: on the host)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.decoder.embed_tokens.weight

    @property
    def ops(self) -> AtenOps:
        """The step's small operators (workers/model/step_ops.py); the decoder holds them, the search steps
        read them here."""
        return self.model.decoder.ops

    @property
    def device(self) -> torch.device:
        """Where the weights are: every tensor a decode creates is created here."""
        return self.final_logits_bias.device

    def encode(self, src_ids: Tensor, src_mask: Tensor) -> Tensor:
        """src_ids (B, S), src_mask (B, S) bool -> memory (B, S, E)."""
        with record_function("encoder"):
            return self.model.encoder(src_ids, src_mask)

    def logits_bias(self) -> Tensor | None:
        """``final_logits_bias`` (V,), or None when it is all zeros (most Marian checkpoints): a bias
        makes the output GEMM first copy it into the (N, V) result, a measurable cost per step. Whether it
        is zero is read once per model (``load_checkpoint`` reads it on the host, before the move to a
        device), not once per decode."""
        if self.has_logits_bias is None:
            self.has_logits_bias = bool(self.final_logits_bias.any())
        return self.final_logits_bias[0] if self.has_logits_bias else None

    def output_head(self, candidates: Tensor | None = None) -> OutputHead:
        """The output layer, over the whole vocabulary or cut to a shortlist of target ids (C,):
        decided (and gathered, packed) once per decode, so no step reads anything back from the device."""
        bias, pad = self.logits_bias(), self.config.pad_token_id
        if candidates is None:
            return OutputHead(None, self.lm_head.weight, bias, self.vocab_head, pad, add_bias=True)
        weight = self.lm_head.weight.index_select(0, candidates).contiguous()
        bias = None if bias is None else bias.index_select(0, candidates)
        at = (candidates == pad).nonzero()
        return OutputHead(candidates, weight, bias, self.pack_head(weight, bias) if self.pack_head else None,
                          int(at[0, 0]) if at.numel() else -1)

    def project(self, hidden: Tensor, head: OutputHead | Tensor | None = None) -> Tensor:
        """hidden (..., E) -> logits (..., V), or (..., C) over a shortlist head (or candidate ids (C,))."""
        if not isinstance(head, OutputHead):
            head = self.output_head(head)
        return head(hidden)

    def forward(self, src_ids: Tensor, src_mask: Tensor, tgt_ids: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for decoder inputs tgt_ids (B, T)."""
        memory = self.encode(src_ids, src_mask)
        return self.project(self.model.decoder(tgt_ids, memory, src_mask))

    def new_cache(self, slots: int, beam_size: int, source_capacity: int, **kwargs) -> KVCache:
        return self.model.decoder.new_cache(slots, beam_size, source_capacity, **kwargs)

    def cross_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """memory (B, S, E) -> each decoder layer's cross-attention K/V (B, H, S, D) x 2: computed once
        per sentence, with its encoder output (``KVCache.admit`` copies them into slots)."""
        with record_function("encoder"):
            return list(self.model.decoder.cross_kv(memory))

    def decode_step(self, tokens: Tensor, at: StepAt, cache: KVCache, head: OutputHead | None = None) -> Tensor:
        """tokens (N,) of the rows ``at`` runs -> logits (N, V) (or (N, C) with a shortlist head)."""
        hidden = self.decode_hidden(tokens, at, cache)
        with record_function("output layer"):
            return self.project(hidden, head)

    def row_top(self, hidden: Tensor, head: OutputHead, num: int) -> tuple[Tensor, Tensor]:
        """hidden (N, E) -> each row's ``num`` best log-probs over ``head`` and their columns (N, M),
        ``<pad>`` banned (``OutputHead.row_top``: one native pass on the CPU where it can)."""
        with record_function("output layer"):
            return head.row_top(hidden, num, self.ops)

    def decode_hidden(self, tokens: Tensor, at: StepAt, cache: KVCache) -> Tensor:
        """tokens (N,) of the rows ``at`` runs -> the decoder's last hidden states (N, E)."""
        with record_function("decoder layers"):
            return self.model.decoder.step(tokens, at, cache)
