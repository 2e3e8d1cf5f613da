"""What only a CUDA device needs, in one place (nano-vllm keeps every ``.cuda()`` in one runner file):
the static step captured as a CUDA graph, and the pinned buffer the step's indices are staged in.
The engine asks for them once per decode, on a CUDA device only; elsewhere it never comes here.
"""
from __future__ import annotations

import torch
from torch import Tensor


def staging_buffer(size: int, device: torch.device) -> Tensor | None:
    """A pinned host buffer of ``size`` int64 for the step's host-to-device copy, so the copy is
    asynchronous; None off CUDA (the copy is nothing there)."""
    if device.type != "cuda":
        return None
    return torch.empty(size, dtype=torch.long, device="cpu", pin_memory=True)


class GraphedStep:
    """The static step as a CUDA graph (issue 16): the first step runs eagerly (it warms the kernels
    and allocator), the second is captured and every step after replays it. The captured step reads
    the engine's persistent tensors only (cache, search state, the static index buffer), so a replay
    is the step for that step's indices; refills happen between replays. Untested on CUDA as of this
    commit (no GPU was lent): ``tests/workers/test_gpu.py`` checks replay against eager."""

    def __init__(self) -> None:
        self.steps, self.graph, self.output = 0, None, None

    def run(self, step) -> Tensor:
        self.steps += 1
        if self.steps == 1:
            return step()
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.output = step()  # recorded, not run
        self.graph.replay()
        return self.output
