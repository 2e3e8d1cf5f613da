"""The output layer as the search sees it: one projection decided per decode (the whole vocabulary or a
shortlist's columns), and its row top (log-softmax + top-k), fused with the product where the layer
has that kernel."""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class OutputHead:
    """The output projection, decided once per decode: over the whole vocabulary (``ids`` None) or a
    shortlist (``ids`` (C,) target ids); weight (V|C, E); bias (V|C,) or None; ``linear``: the same
    projection prepacked or quantised (workers/kernels/speedups.py), the bias added after it when
    ``add_bias``; ``skip``: the column of ``<pad>`` (banned by the search), -1 when not a column."""

    ids: Tensor | None
    weight: Tensor
    bias: Tensor | None
    linear: nn.Module | None = None
    skip: int = -1
    add_bias: bool = False

    def __call__(self, hidden: Tensor) -> Tensor:
        """hidden (..., E) -> logits (..., V|C)."""
        if self.linear is None:
            return F.linear(hidden, self.weight, self.bias)
        out = self.linear(hidden)
        return out + self.bias if self.add_bias and self.bias is not None else out

    def row_top(self, hidden: Tensor, num: int, ops) -> tuple[Tensor, Tensor]:
        """hidden (N, E) -> each row's ``num`` best log-probs and their columns (N, M), ``<pad>``
        (``skip``) banned: the product and the log-softmax + top-k in one pass where the layer has
        that kernel (``PackedLinear.row_top``: no (N, V) logits written), else ``ops.row_top`` over
        this head's logits."""
        fused = getattr(self.linear, "row_top", None)
        top = fused(hidden, num, self.skip, self.bias if self.add_bias else None) if fused is not None else None
        return top if top is not None else ops.row_top(self(hidden), num, self.skip)
