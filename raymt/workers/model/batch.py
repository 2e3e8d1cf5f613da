"""Padded (source, target) id pairs as one teacher-forced batch: what scoring a given translation
(``CoreDecoder.score``) and training read.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Batch:
    src_ids: Tensor  # (B, S)
    src_mask: Tensor  # (B, S) bool
    tgt_in: Tensor  # (B, T) decoder inputs: start token + labels[:-1]
    labels: Tensor  # (B, T) with pad where absent
    num_tokens: int


def collate(pairs: list[tuple[list[int], list[int]]], pad_id: int, start_id: int) -> Batch:
    s = max(len(src) for src, _ in pairs)
    t = max(len(tgt) for _, tgt in pairs)
    src_ids = torch.full((len(pairs), s), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), t), pad_id, dtype=torch.long)
    for i, (src, tgt) in enumerate(pairs):
        src_ids[i, : len(src)] = torch.tensor(src)
        labels[i, : len(tgt)] = torch.tensor(tgt)
    tgt_in = torch.cat([torch.full((len(pairs), 1), start_id, dtype=torch.long), labels[:, :-1]], dim=1)
    src_mask = torch.zeros_like(src_ids, dtype=torch.bool)
    for i, (src, _) in enumerate(pairs):
        src_mask[i, : len(src)] = True
    return Batch(src_ids, src_mask, tgt_in, labels, int(sum(len(t) for _, t in pairs)))
