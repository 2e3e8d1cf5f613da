"""What only a CUDA device needs, in one place (nano-vllm keeps every ``.cuda()`` in one runner file):
the static step captured as a CUDA graph, the pinned buffers the step's indices are staged in, the
pinned asynchronous copy of the encoder's inputs and the admitted slots, and the device's free
memory (the slots are fitted to it).
The runner (``workers/decoder/runner.py``) builds the graphs and the staging buffers once, on a CUDA device
only; the copies (``to_device``, ``HostCopy``, ``HostToDevice``) are plain copies elsewhere.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

logger = logging.getLogger(__name__)


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
    what torch's caching allocator holds unused in its default pool. A CUDA graph's private pool is
    not free: its idle blocks stay reserved for the graph's replays while the graph lives."""
    free, _ = torch.cuda.mem_get_info(device)
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    idle = sum(s["total_size"] - s["allocated_size"] for s in torch.cuda.memory_snapshot()
               if s.get("device", index) == index and tuple(s.get("segment_pool_id", (0, 0))) == (0, 0))
    return free + idle


def release_cached(device: torch.device) -> None:
    """Hands torch's cached, unused blocks on a CUDA ``device`` back to the driver (the blocks of
    graphs already dropped included), so the next allocation can use them; nothing elsewhere."""
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


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


class HostToDevice:
    """The step's host-built indices (int64 numpy) -> one tensor on ``device``, through ``staging``'s
    pinned buffers on a GPU (``Staging``; None elsewhere: a plain copy). A plain object holding no
    engine, so what keeps it (``StaticIndices``) keeps no engine alive."""

    def __init__(self, device: torch.device, staging: "Staging | None") -> None:
        self.device, self.staging = device, staging

    def __call__(self, values: np.ndarray) -> Tensor:
        packed = torch.from_numpy(values)
        return packed.to(self.device) if self.staging is None else self.staging.to_device(packed)


class CaptureOutOfMemory(torch.OutOfMemoryError):
    """Out of device memory while capturing the decode step: the message names the slots tried."""


class CapturedStep:
    """One decode step recorded as a CUDA graph on ``stream``, its memory from ``pool`` (one pool per
    runner, shared by every bucket's graph). ``replay`` reruns it and returns its output tensor."""

    def __init__(self, step: Callable[[], Tensor], stream, pool) -> None:
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            self.output = step()  # recorded, not run

    def replay(self) -> Tensor:
        self.graph.replay()
        return self.output


WARMUP_STEPS = 3  # eager steps on the capture stream before the capture (torch's CUDA graph guide warms up 3)


class GraphedStep:
    """The static step as a CUDA graph: the first ``WARMUP_STEPS`` steps run eagerly on the capture
    stream (they warm the kernels, cuBLAS's workspaces, Triton's compilation and the allocator on
    the stream the capture then uses, as torch's CUDA graph guide does), the next is captured on
    that stream and every step after replays it. The captured step reads the runner's persistent
    tensors only (cache, search state, the static index buffer, the output head's buffers), so a
    replay is the step for that step's indices; refills happen between replays. Capture is
    thread-local: a Ray actor's other threads may use CUDA meanwhile.

    A capture that fails falls back to eager steps with one warning naming the cause; out of
    memory while capturing raises ``CaptureOutOfMemory`` naming ``label`` (the slots tried).
    ``capture(step, stream, pool)``: builds the captured step (``CapturedStep``; tests inject one)."""

    def __init__(self, *, stream=None, pool=None, capture: Callable | None = None, label: str = "") -> None:
        self.stream, self.pool, self.label = stream, pool, label
        self.capture = capture or CapturedStep
        self.steps, self.captured, self.eager = 0, None, False

    @property
    def graph(self):
        """The captured CUDA graph, once captured (None before, or when steps run eagerly)."""
        return getattr(self.captured, "graph", None)

    def run(self, step: Callable[[], Tensor]) -> Tensor:
        self.steps += 1
        if self.eager:
            return step()
        if self.steps <= WARMUP_STEPS:  # warm-up, on the stream the capture will use
            return _on_stream(self.stream, step)
        if self.captured is None:
            try:
                self.captured = self.capture(step, self.stream, self.pool)
            except torch.OutOfMemoryError as e:
                raise CaptureOutOfMemory(f"out of memory capturing the decode step ({self.label}): {e}") from e
            except RuntimeError as e:
                logger.warning("capturing the decode step (%s) failed, decoding eagerly: %s: %s", self.label,
                               type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                self.eager = True
                return step()  # (a failed capture ran nothing)
        return self.captured.replay()


def _on_stream(stream, step: Callable[[], Tensor]) -> Tensor:
    """``step()`` on ``stream`` (ordered after the current stream's work, and it after the step's);
    None: on the current stream."""
    if stream is None:
        return step()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = step()
    torch.cuda.current_stream().wait_stream(stream)
    return out
