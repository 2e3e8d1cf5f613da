"""The GPU benchmark's kernel tables (``python -m benchmarks.bench_gpu --tables output``): one decoder
operator at a time, ATen's against the Triton kernel's (``workers/kernels/triton_ops.py``), each against the
floor of the bytes it must move at the device's measured copy bandwidth. Runs on any device (CUDA
events on a GPU; the Triton rows only where it runs kernels)."""
from __future__ import annotations

import statistics
import time

import torch

from raymt.workers.model.step_ops import ATEN


def device_seconds(device: torch.device, fn, repeats: int) -> float:
    """Median seconds of ``fn()`` on ``device`` (CUDA events on a GPU), after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, mb: int = 512) -> float:
    """Bytes per second a device-to-device copy moves (read + written), the floor's yardstick."""
    src = torch.empty(mb * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / device_seconds(device, lambda: dst.copy_(src), 10)


def output_step_rows(device: torch.device, vocab: int, row_counts: list[int], k: int = 10) -> tuple[list[dict], float]:
    """The output step alone, (N, vocab) logits -> each row's k best log-probs: ATen (float32 copy,
    log_softmax, <pad> ban, topk) and the fused Triton kernels, float32 and bf16 logits, against the
    floor of reading the logits once -> (rows, the device's copy bandwidth in bytes/s)."""
    from raymt.workers.kernels import triton_ops  # (imports Triton where it is installed)

    bandwidth = copy_bandwidth(device)
    kernels = {"aten": lambda x: ATEN.row_top(x, k, 0)}
    if device.type == "cuda" and triton_ops.available():
        kernels["triton fused"] = lambda x: triton_ops.row_top_log_softmax(x, k, 0)
    rows = []
    for n in row_counts:
        for dtype in (torch.float32, torch.bfloat16):
            logits = torch.randn(n, vocab, device=device).to(dtype)
            floor = logits.numel() * logits.element_size() / bandwidth
            for name, fn in kernels.items():
                seconds = device_seconds(device, lambda: fn(logits), 20)
                rows.append({"rows": n, "vocab": vocab, "logits": str(dtype).removeprefix("torch."), "kernel": name,
                             "us": round(seconds * 1e6, 1), "floor_us": round(floor * 1e6, 1),
                             "floor_share": round(floor / seconds, 3)})
    return rows, bandwidth


def attention_rows(device: torch.device, model: torch.nn.Module, row_counts: list[int], histories: list[int],
                   capacity: int, bandwidth: float) -> list[dict]:
    """One layer's self-attention step alone, every row over a ``history``-long prefix through the
    cache's ancestry: ATen's path (gather a (t, N, H, D) copy, mask, attend) against the Triton kernel
    reading in place, over the step's history (the dynamic step: t = history) and over the cache's
    whole ``capacity`` (the static step: ATen reads it all, the kernel each row's own prefix). The
    floor: each row's K and V prefix read once, at the device's copy bandwidth."""
    from raymt.workers.kernels import triton_ops
    from raymt.workers.model.step_ops import attend, gather_history

    sa = model.model.decoder.layers[0].self_attn
    h, d, dtype = sa.num_heads, sa.head_dim, next(model.parameters()).dtype
    rows = []
    for n, history in ((n, x) for n in row_counts for x in histories):
        for t in sorted({history, max(capacity, history)}):
            keys, values = (torch.randn(t, n, h, d, device=device).to(dtype) for _ in range(2))
            ancestry = torch.randint(0, n, (t, n), device=device)
            reads = torch.full((n,), history, device=device)
            q = torch.randn(n, h, d, device=device).to(dtype)
            steps, mask = torch.arange(t, device=device), None
            if t > history:
                mask = (steps[None, :] < reads[:, None])[:, None, None, :]

            def aten():
                return attend(q[:, :, None], *gather_history(keys, values, ancestry), mask)  # (N, H, t, D) copies
            kernels = {"aten gather": aten}
            if device.type == "cuda" and triton_ops.available():
                kernels["triton in place"] = lambda: triton_ops.ancestry_attention(q, keys, values, ancestry, reads,
                                                                                   d ** -0.5)
            floor = 2 * n * history * h * d * keys.element_size() / bandwidth
            for name, fn in kernels.items():
                seconds = device_seconds(device, fn, 20)
                rows.append({"rows": n, "history": history, "t": t, "dtype": str(dtype).removeprefix("torch."),
                             "kernel": name, "us": round(seconds * 1e6, 1), "floor_us": round(floor * 1e6, 1),
                             "floor_share": round(floor / seconds, 3)})
    return rows



def source_attention_rows(device: torch.device, model: torch.nn.Module, slot_counts: list[int], lengths: list[int],
                          capacity: int, beam: int, bandwidth: float) -> list[dict]:
    """One layer's cross-attention step alone, ``beam`` rows per slot, every source ``length`` long
    in a cache of ``capacity`` source positions: ATen's path (the planned slots' K/V over the step's
    longest source ``s``, padding masked: ``s`` = length for the dynamic step, the whole capacity for
    the static one) against the Triton kernel reading each row's own source. The floor: each slot's
    K and V read once, at the device's copy bandwidth."""
    from raymt.workers.kernels import triton_ops
    from raymt.workers.model.cache import KVCache

    ca = model.model.decoder.layers[0].encoder_attn
    h, d, dtype = ca.num_heads, ca.head_dim, next(model.parameters()).dtype
    rows = []
    for slots, length in ((b, x) for b in slot_counts for x in lengths):
        cache = KVCache.empty(layers=1, heads=h, head_dim=d, slots=slots, beam_size=beam, source_capacity=capacity,
                              dtype=dtype, device=device, zeroed=False)
        cache.cross_k.normal_(), cache.cross_v.normal_()
        cache.source_lengths.fill_(length)
        cache.cross_bias[:, :, length:] = float("-inf")
        n = slots * beam
        row_ids = torch.arange(n, device=device)
        q = torch.randn(n, h * d, device=device).to(dtype)
        floor = 2 * slots * length * h * d * cache.cross_k.element_size() / bandwidth
        for s in sorted({length, capacity}):
            at = cache.step_at(torch.zeros(n, dtype=torch.long, device=device), row_ids, torch.zeros_like(row_ids),
                               row_ids, torch.arange(slots, device=device), t=1, s=s, shared=True, first=0)
            kernels = {f"aten (s = {s})": lambda: ATEN.cross_attention(q, cache, 0, at)}
            if device.type == "cuda" and triton_ops.available() and s == capacity:
                kernels["triton own source"] = lambda: triton_ops.TritonOps().cross_attention(q, cache, 0, at)
            for name, fn in kernels.items():
                seconds = device_seconds(device, fn, 20)
                rows.append({"slots": slots, "beam": beam, "length": length, "capacity": capacity,
                             "dtype": str(dtype).removeprefix("torch."), "kernel": name, "us": round(seconds * 1e6, 1),
                             "floor_us": round(floor * 1e6, 1), "floor_share": round(floor / seconds, 3)})
    return rows
