"""Where a decoding run's time goes, by phase (the time-breakdown tables of the batching and search papers).

The decoder marks its phases with ``torch.profiler.record_function`` scopes: ``encoder`` (encoder
and cross-attention K/V), ``decoder layers`` and ``output layer`` (inside each step),
``cache reorder`` (beam reordering / dropping finished rows; on the CPU it runs inside the one-call
native beam step, counted as search) and ``search loop`` (the whole step
loop; its time outside the nested scopes is the search itself: log-softmax, top-k, finished
pools, pruning, bookkeeping). One profiled run splits each phase's wall time into time inside ATen
operators and the rest: Python and framework dispatch between them. Time outside every scope is
tokenisation, batching and detokenisation. The profiler itself adds overhead per operator, so
shares, not absolute times, are the result.
"""
from __future__ import annotations

import time
from typing import Callable

from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile

PHASES = ("encoder", "decoder layers", "output layer", "cache reorder", "search loop")
LABELS = {"search loop": "search (log-softmax, top-k, pools, pruning, bookkeeping; on the CPU the reorder too)",
          "other": "tokenise, batch, detokenise (outside the decoder)"}


def _split(event: FunctionEvent) -> tuple[float, float, list[FunctionEvent]]:
    """(exclusive wall, time in operators, nested phase scopes) of a scope, in microseconds."""
    exclusive, ops, nested = event.cpu_time_total, 0.0, []
    stack = list(event.cpu_children)
    while stack:
        child = stack.pop()
        if child.name in PHASES:
            nested.append(child)
            exclusive -= child.cpu_time_total
        elif child.name.startswith(("aten::", "mkldnn::", "quantized::", "raymt::")):  # raymt: workers/kernels/native.py
            ops += child.cpu_time_total  # its own children are its kernels: counted once here
        else:
            stack.extend(child.cpu_children)
    return exclusive, ops, nested


def step_breakdown(translate: Callable[[list[str]], object], lines: list[str]) -> list[dict]:
    """Profile one ``translate(lines)`` call -> rows: phase, share of wall, share in operators,
    share in Python/dispatch (shares of the profiled wall time)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        translate(lines)
        wall_us = (time.perf_counter() - start) * 1e6
    totals = {name: [0.0, 0.0] for name in PHASES}
    top = [e for e in prof.events() if e.name in PHASES and not _inside_phase(e)]
    stack = list(top)
    while stack:
        event = stack.pop()
        exclusive, ops, nested = _split(event)
        totals[event.name][0] += exclusive
        totals[event.name][1] += ops
        stack.extend(nested)
    covered = sum(t[0] for t in totals.values())
    rows = [{"phase": LABELS.get(name, name), "share": round(wall / wall_us, 3), "in_operators": round(ops / wall_us, 3),
             "python_dispatch": round((wall - ops) / wall_us, 3)} for name, (wall, ops) in totals.items()]
    rows.append({"phase": LABELS["other"], "share": round(max(wall_us - covered, 0.0) / wall_us, 3),
                 "in_operators": None, "python_dispatch": None})
    return rows


def _inside_phase(event: FunctionEvent) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in PHASES:
            return True
        parent = parent.cpu_parent
    return False
