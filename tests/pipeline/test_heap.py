"""The C heap's free pages go back to the system after each decoded item."""
from __future__ import annotations

import ctypes
import sys

import pytest

from raymt.pipeline.decoders import heap
from raymt.pipeline.decoders.heap import trim_heap

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or heap._malloc_trim() is None,
                           reason="malloc_trim is glibc's")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


@glibc
def test_freed_chunks_below_a_live_one_leave_the_resident_set_only_when_trimmed():
    """120 MB of 2 KB chunks freed under one chunk still live: glibc keeps them resident (the heap's
    top cannot shrink past the live chunk) until the trim hands their pages back."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(2048) for _ in range(60_000)]
    for p in chunks:
        ctypes.memset(p, 1, 2048)
    pinned = libc.malloc(2048)  # above them all: the top of the heap stays put
    for p in chunks:
        libc.free(p)
    before = rss_mb()
    assert trim_heap()
    after = rss_mb()
    libc.free(pinned)
    assert before - after > 60, (before, after)  # most of the 120 MB: pages of free chunks only


def test_no_malloc_trim_is_a_no_op(monkeypatch):
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert trim_heap() is False


def test_the_decoder_trims_after_each_item(demo_model_dir, tmp_path, monkeypatch):
    from raymt.pipeline.orchestration import actors
    from raymt.pipeline.orchestration.actors import DecoderSettings, DecoderWorker
    from raymt.pipeline.orchestration.units import Columns, plan_units
    from raymt.workers.config import SearchConfig
    from raymt.workers.decoder.decode_config import DecodeConfig, RuntimeConfig

    src = tmp_path / "in.txt"
    src.write_text("Ein Hund läuft.\nZwei Männer spielen Fußball.\nEine Frau liest.\n")
    units = plan_units(str(src), Columns(), 2).units
    calls = []
    monkeypatch.setattr(actors, "trim_heap", lambda: calls.append(1) or True)
    settings = DecoderSettings(model=str(demo_model_dir), output=str(tmp_path / "out"), signature="heap-test",
                               decode=DecodeConfig(SearchConfig(beam_size=1), runtime=RuntimeConfig(threads=1)))
    worker = DecoderWorker(settings, Columns())
    try:
        stats = worker.decode(units)
    finally:
        worker.sampler.close()
    assert [s.sentences for s in stats] == [2, 1] and calls == [1]  # two units decoded, then one trim
