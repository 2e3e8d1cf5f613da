"""What only a CUDA device needs, in one place (nano-vllm keeps every ``.cuda()`` in one runner file):
the static step captured as a CUDA graph, the pinned buffers the step's indices are staged in, the
pinned asynchronous copy of the encoder's inputs and the admitted slots, and the device's free
memory (the slots are fitted to it).
The engine asks for the graph and the staging buffers once per decode, on a CUDA device only; the
two copies (``to_device``, ``HostCopy``) are plain copies elsewhere.
"""
from __future__ import annotations

import torch
from torch import Tensor


def to_device(x: Tensor, device: torch.device | str) -> Tensor:
    """A host tensor on ``device``: on a GPU through pinned memory and asynchronously (torch's pinned
    allocator keeps the block until the copy has run), so the host goes on while it copies;
    elsewhere ``x.to(device)``. (The step's own indices go through ``Staging``'s fixed buffers.)"""
    device = torch.device(device)
    if device.type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


class HostCopy:
    """A device tensor's copy to the host, started now and waited for later: on a GPU into pinned
    memory, asynchronously, behind the work already queued (so a later step may be queued before
    the copy is read, and may overwrite ``x`` after the copy has run); elsewhere a copy now."""

    def __init__(self, x: Tensor) -> None:
        self.event = None
        if x.device.type != "cuda":
            self.host = x.to("cpu", copy=True)
            return
        self.host = torch.empty(x.shape, dtype=x.dtype, device="cpu", pin_memory=True)
        self.host.copy_(x, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()

    def wait(self) -> Tensor:
        """The copy, once it has run (the device may be running later work meanwhile)."""
        if self.event is not None:
            self.event.synchronize()
        return self.host


def free_memory(device: torch.device) -> int:
    """Bytes free on the CUDA ``device`` (the driver's count: other processes' use included), plus
    what torch's caching allocator holds but does not use."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


class Staging:
    """Pinned host buffers for the step's host-to-device copy, so the copy is asynchronous (CUDA only:
    ``for_device`` gives None elsewhere, where the copy is nothing).

    The host writes a buffer, then the device reads it when its stream reaches the copy. A buffer is
    written again only once that copy has run (an event per buffer): the dynamic step's readback
    waits for the device every step anyway, but the static step reads back every few steps, so the
    host runs up to ``depth`` steps ahead and a single buffer would be overwritten before the device
    read it."""

    def __init__(self, size: int, device: torch.device, depth: int) -> None:
        self.device = device
        self.buffers = [torch.empty(size, dtype=torch.long, device="cpu", pin_memory=True) for _ in range(depth)]
        self.copied: list[torch.cuda.Event | None] = [None] * depth
        self.turn = 0

    @classmethod
    def for_device(cls, size: int, device: torch.device, depth: int = 1) -> "Staging | None":
        return cls(size, device, depth + 1) if device.type == "cuda" else None

    def to_device(self, values: Tensor) -> Tensor:
        """values (M,) int64 on the host -> the same on the device, copied asynchronously."""
        i, self.turn = self.turn, (self.turn + 1) % len(self.buffers)
        if self.copied[i] is not None:
            self.copied[i].synchronize()  # (long done, unless the host is ``depth`` steps ahead)
        out = self.buffers[i][: values.numel()].copy_(values).to(self.device, non_blocking=True)
        self.copied[i] = torch.cuda.Event()
        self.copied[i].record()
        return out


class GraphedStep:
    """The static step as a CUDA graph (issue 16): the first step runs eagerly on a side stream (it
    warms the kernels, cuBLAS and the allocator there, as torch's graph docs ask), the second is
    captured and every step after replays it. The captured step reads the engine's persistent
    tensors only (cache, search state, the static index buffer), so a replay is the step for that
    step's indices; refills happen between replays. Capture is thread-local: a Ray actor's other
    threads may use CUDA meanwhile. Untested on CUDA as of this commit (no GPU was lent):
    ``tests/workers/test_gpu.py`` checks replay against eager."""

    def __init__(self) -> None:
        self.steps, self.graph, self.output = 0, None, None

    def run(self, step) -> Tensor:
        self.steps += 1
        if self.steps == 1:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = step()
            torch.cuda.current_stream().wait_stream(side)
            return out
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.output = step()  # recorded, not run
        self.graph.replay()
        return self.output
