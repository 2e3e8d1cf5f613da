"""Training math for small Marian models: token-budget batches, label-smoothed loss, LR schedule,
checkpoint averaging. Pure torch; IO lives in ``tools/train_demo.py``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from raymt.workers.model.batch import Batch, collate  # noqa: F401  (collate: the training loop's batches)
from raymt.workers.model.model import MarianModel


@dataclass(frozen=True, slots=True)
class TrainConfig:
    max_tokens: int = 4096  # padded target+source tokens per batch (max side)
    peak_lr: float = 1.5e-3
    warmup_steps: int = 800
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    max_length: int = 100
    seed: int = 1
    average_last: int = 5

    def __post_init__(self) -> None:
        if self.max_tokens < 64 or self.peak_lr <= 0 or self.warmup_steps < 1:
            raise ValueError("max_tokens >= 64, peak_lr > 0, warmup_steps >= 1 required")


def make_batches(pairs: list[tuple[list[int], list[int]]], max_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices of ``pairs`` grouped into length-bucketed batches of at most ``max_tokens`` padded tokens."""
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]) + rng.random(), len(pairs[i][1])))
    batches, current, longest = [], [], 0
    for i in order:
        longest_next = max(longest, len(pairs[i][0]), len(pairs[i][1]))
        if current and longest_next * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_next = [], max(len(pairs[i][0]), len(pairs[i][1]))
        current.append(i)
        longest = longest_next
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def loss_fn(model: MarianModel, batch: Batch, label_smoothing: float) -> tuple[Tensor, Tensor]:
    """(mean label-smoothed loss over target tokens, summed NLL), from one log-softmax pass."""
    logits = model(batch.src_ids, batch.src_mask, batch.tgt_in)  # (B, T, V)
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    keep = batch.labels != model.config.pad_token_id  # (B, T)
    nll = -lprobs.gather(-1, batch.labels[..., None]).squeeze(-1)[keep]  # (N_tok,)
    smooth = -lprobs.mean(-1)[keep]  # uniform share over all V classes, as F.cross_entropy does
    loss = ((1.0 - label_smoothing) * nll + label_smoothing * smooth).mean()
    return loss, nll.detach().sum()


def inverse_sqrt_lr(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``peak_lr`` then ``peak_lr * sqrt(warmup / step)``."""
    step = max(step, 1)
    if step < cfg.warmup_steps:
        return cfg.peak_lr * step / cfg.warmup_steps
    return cfg.peak_lr * (cfg.warmup_steps / step) ** 0.5


def average_states(states: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Element-wise mean of several state dicts with identical keys (checkpoint averaging)."""
    if not states:
        raise ValueError("nothing to average")
    return {k: torch.stack([s[k].float() for s in states]).mean(0).to(states[0][k].dtype) for k in states[0]}
