"""Handing a decoder's freed C-heap memory back to the operating system between work units.

A decoder allocates tensors of a different size at every step and in every unit (batch shapes,
source and target lengths). glibc keeps the chunks they are freed into and reuses them only for
requests that fit, so its heap spreads over more and more pages that hold nothing live, and the
process's resident memory creeps up unit after unit although the live data stays the same (measured
with ``benchmarks/bench_soak.py``). ``trim_heap`` calls glibc's ``malloc_trim(0)``, which returns the free
pages of every arena to the system (a few milliseconds for a decoder's heap); elsewhere it does
nothing.
"""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:  # no C library to open by that name (not a glibc system)
        return None


def trim_heap() -> bool:
    """Return the C heap's free pages to the operating system; whether it could (glibc only)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
