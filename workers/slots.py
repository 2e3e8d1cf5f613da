"""Slot cache of the streaming decoder and its one-step decoder math (no scheduling, no search).

Every admitted sentence owns a slot: K rows (its beams) of self-attention K/V, and one copy of its
cross-attention K/V shared by those beams. Two choices keep a step's cost close to the live work:

* **K/V never move.** Row r writes its key/value for position p at ``r * T + p`` once; beam
  reordering rewrites only ``ancestry`` (R, T) (which row holds position p of a beam's history), a
  table of ints, instead of copying (L, N, H, t, D) floats. Attention gathers keys by ancestry.
* **Cross-attention per sentence.** The live beams of a sentence are a prefix of its K rows
  (running scores are kept sorted, -inf last), so queries are laid out (B', W, ...) with W the
  widest planned sentence; each sentence's queries attend over its own (H, S, D) keys, read once
  (not once per beam), and only over the longest planned source, not the cache's capacity.

Dimension letters: L layers, R = slots x K rows, N planned live rows, B' planned sentences,
W widest planned sentence, H heads, T target capacity, t live target prefix, S source capacity,
s live source prefix, D head dim, E d_model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from workers.decoder_cache import cached_attention
from workers.model import Decoder


@dataclass
class SlotCache:
    """self_k/self_v (L, R*T + 1, H, D): K/V of row r at position p at index r*T + p; the last entry is
    zeros, read in place of every masked position (the rest is never zero-filled: only written entries are read);
    ancestry (R, T) long: the row whose K/V is position p of row r's history;
    cross_k/cross_v (L, slots, H, S, D); src_mask (slots, S) bool; source_lengths: per slot."""

    self_k: Tensor
    self_v: Tensor
    ancestry: Tensor
    cross_k: Tensor
    cross_v: Tensor
    src_mask: Tensor
    source_lengths: list[int]

    @classmethod
    def empty(cls, decoder: Decoder, slots: int, beam_size: int, s_cap: int, t_cap: int) -> "SlotCache":
        attn, layers = decoder.layers[0].self_attn, len(decoder.layers)
        h, d, rows = attn.num_heads, attn.head_dim, slots * beam_size
        weight = decoder.embed_tokens.weight
        self_k = weight.new_empty(layers, rows * t_cap + 1, h, d)
        self_k[:, -1] = 0.0
        cross_k = weight.new_zeros(layers, slots, h, s_cap, d)
        self_v = weight.new_empty(self_k.shape)
        self_v[:, -1] = 0.0
        return cls(self_k, self_v, torch.zeros(rows, t_cap, dtype=torch.long, device=weight.device), cross_k,
                   torch.zeros_like(cross_k), torch.zeros(slots, s_cap, dtype=torch.bool, device=weight.device),
                   [0] * slots)

    @property
    def max_length(self) -> int:
        return self.ancestry.shape[1]

    def admit(self, decoder: Decoder, memory: Tensor, src_mask: Tensor, blocks: list[int]) -> None:
        """Cross-attention K/V of newly admitted sentences into their slots. memory (A, s, E), src_mask (A, s)."""
        s, index = memory.shape[1], torch.tensor(blocks, device=memory.device)
        for i, layer in enumerate(decoder.layers):
            ca = layer.encoder_attn
            self.cross_k[i, index, :, :s] = ca.split(ca.k_proj(memory))  # (A, H, s, D)
            self.cross_v[i, index, :, :s] = ca.split(ca.v_proj(memory))
        self.src_mask[index] = False
        self.src_mask[index, :s] = src_mask
        for b, n in zip(blocks, src_mask.sum(1).tolist()):
            self.source_lengths[b] = n

    def reorder(self, src_rows: Tensor, dst_rows: Tensor, length: int) -> None:
        """Row dst_rows[i] continues the history of src_rows[i] (N',): the first ``length`` positions."""
        self.ancestry[dst_rows, :length] = self.ancestry[src_rows, :length]  # gathered before written


def _sentence_kv(kv: Tensor, blocks: list[int], index: Tensor, s: int) -> Tensor:
    """kv (slots, H, S, D) -> the planned sentences' (B', H, s, D); a view when the slots are consecutive."""
    first = blocks[0]
    if blocks == list(range(first, first + len(blocks))):
        return kv[first: first + len(blocks), :, :s]
    return kv[:, :, :s].index_select(0, index)


def slot_step(decoder: Decoder, cache: SlotCache, tokens: Tensor, positions: Tensor, rows: Tensor,
              blocks: list[int], pad: Tensor, width: int) -> Tensor:
    """One incremental decoder step for the planned live rows -> hidden (N, E).

    tokens, positions, rows (N,): input token, target position and cache row of each live beam;
    blocks: the planned sentences' slots (B'); pad (N,): each row's index in the (B' * W) layout.
    Writes each row's K/V at its position.
    """
    n, b, t_cap = tokens.shape[0], len(blocks), cache.max_length
    index = torch.tensor(blocks, device=tokens.device)  # (B',)
    t = int(positions.max()) + 1
    s = max(cache.source_lengths[blk] for blk in blocks)
    x = decoder.embed_tokens(tokens) * decoder.embed_scale + decoder.embed_positions.weight[positions]  # (N, E)
    e = x.shape[1]
    cache.ancestry[rows, positions] = rows
    steps = torch.arange(t, device=tokens.device)
    write_at = rows * t_cap + positions  # (N,)
    visible = steps[None, :] <= positions[:, None]  # (N, t)
    zero_entry = cache.self_k.shape[1] - 1
    read_at = torch.where(visible, cache.ancestry[rows, :t] * t_cap + steps, zero_entry).view(-1)  # (N * t,)
    self_mask = visible[:, None, None, :]  # (N, 1, 1, t)
    cross_mask = cache.src_mask[index, :s][:, None, None, :]  # (B', 1, 1, s)
    for i, layer in enumerate(decoder.layers):
        sa = layer.self_attn
        hd = (sa.num_heads, sa.head_dim)
        q, k, v = sa.step_qkv(x)  # (N, E), (N, H, D), (N, H, D): one fused GEMM when sped up
        cache.self_k[i].index_copy_(0, write_at, k)
        cache.self_v[i].index_copy_(0, write_at, v)
        keys = cache.self_k[i].index_select(0, read_at).view(n, t, *hd).transpose(1, 2)  # (N, H, t, D)
        values = cache.self_v[i].index_select(0, read_at).view(n, t, *hd).transpose(1, 2)
        h = cached_attention(sa.heads(q), keys, values, self_mask)  # (N, H, 1, D)
        x = layer.self_attn_layer_norm(x + sa.merge(h)[:, 0])
        ca = layer.encoder_attn
        q = x.new_zeros(b * width, e)
        q[pad] = ca.q_proj(x)
        q = q.view(b, width, *hd).transpose(1, 2)  # (B', H, W, D)
        h = F.scaled_dot_product_attention(q, _sentence_kv(cache.cross_k[i], blocks, index, s),
                                           _sentence_kv(cache.cross_v[i], blocks, index, s), attn_mask=cross_mask)
        h = h.transpose(1, 2).reshape(b * width, e)[pad]  # (N, E)
        x = layer.encoder_attn_layer_norm(x + ca.out_proj(h))
        x = layer.feed_forward(x)
    return x
