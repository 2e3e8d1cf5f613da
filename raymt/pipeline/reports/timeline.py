"""A decoder's stats over time: a sampler thread cuts the live counters into slices every few seconds.

The decoding loop stays untouched: it already counts steps, live sentences per step and refills as
it goes (``raymt.workers.decoder.engine.DecodeStats``, ``raymt.workers.decoder.scheduler.SchedulerStats``). A daemon thread in
the decoder actor reads those counters every ``every_s`` seconds and records one ``Slice`` of their
differences; each slice is also handed to ``on_slice`` (the actor pushes it to its Ray metrics and
to the driver's progress board, so progress moves inside a unit, not only at unit commits). Every
live sentence gains one target token per step, so ``tokens`` (sentence-steps) is the live count of
target tokens decoded, beams' dead ends excluded.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace


@dataclass(frozen=True, slots=True)
class Counters:
    steps: int = 0
    tokens: int = 0  # live sentences summed over steps: the target tokens decoded so far
    refills: int = 0

    def __add__(self, other: Counters) -> Counters:
        return Counters(self.steps + other.steps, self.tokens + other.tokens, self.refills + other.refills)

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.steps - other.steps, self.tokens - other.tokens, self.refills - other.refills)


@dataclass(frozen=True, slots=True)
class Slice:
    start: float  # wall-clock seconds (time.time())
    end: float
    steps: int
    tokens: int
    refills: int
    occupancy: float  # live sentences per step / batch capacity

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.end - self.start, 1e-9)

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_s": round(self.tokens_per_s, 1)}


def slice_of(before: Counters, after: Counters, start: float, end: float, capacity: int) -> Slice:
    d = after - before
    return Slice(start, end, d.steps, d.tokens, d.refills, d.tokens / max(d.steps * capacity, 1))


class Sampler:
    """Reads ``counters()`` every ``every_s`` seconds on a daemon thread; keeps and reports the slices."""

    def __init__(self, counters: Callable[[], Counters], capacity: Callable[[], int], every_s: float = 2.0,
                 on_slice: Callable[[Slice], None] | None = None) -> None:
        self.counters, self.capacity, self.every_s, self.on_slice = counters, capacity, every_s, on_slice
        self.slices: list[Slice] = []
        self._lock = threading.Lock()
        self._last, self._last_t = counters(), time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raymt-stats-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> Slice | None:
        """Cut a slice now (also called at a unit's end, so a unit's slices cover it to its last step)."""
        with self._lock:
            now, current = time.time(), self.counters()
            if current == self._last:
                self._last_t = now
                return None
            s = slice_of(self._last, current, self._last_t, now, self.capacity())
            self._last, self._last_t = current, now
            self.slices.append(s)
        if self.on_slice is not None:
            try:
                self.on_slice(s)
            except Exception:  # noqa: BLE001 - metrics or the progress board must never stop decoding
                pass
        return s

    def take(self, since: float) -> list[Slice]:
        """The slices that ended after ``since`` (one unit's); all kept so far are forgotten."""
        with self._lock:
            mine, self.slices = [s for s in self.slices if s.end > since], []
            return mine

    def close(self) -> None:
        self._stop.set()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A decoder's progress at the end of one slice, as it reports it to the driver: its total target
    tokens, its speed over the slice, and how far it is into the unit it is decoding."""

    time: float  # the slice's end, wall clock
    tokens: int  # target tokens decoded so far, every unit
    tokens_per_s: float  # over the slice
    unit: str | None = None  # the unit being decoded
    unit_rows: int = 0
    unit_source_tokens: int = 0
    unit_tokens: int = 0  # target tokens decoded so far in this unit
    received: float | None = None  # when the board got it (wall clock)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Snapshot:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(data).items() if k in names})


class Board:
    """The driver's progress board (a Ray actor with no CPUs): decoders report, the driver reads."""

    def __init__(self) -> None:
        self.reports: dict[str, Snapshot] = {}

    def report(self, actor: str, snapshot: Snapshot) -> None:
        self.reports[actor] = replace(snapshot, received=time.time())

    def read(self) -> dict[str, Snapshot]:
        return dict(self.reports)


class Progress:
    """What the job prints as it goes: rows done (committed, plus inside units the decoded share,
    target tokens so far / source tokens, capped at 0.95 of the unit), decoding speed now (the
    slices of the last few seconds), and an ETA from the rows-done rate so far."""

    def __init__(self, rows_total: int, slice_s: float) -> None:
        self.rows_total, self.recent_s = rows_total, max(3 * slice_s, 5.0)
        self.rows_done = 0
        self.done_units: set[str] = set()
        self.reports: dict[str, Snapshot] = {}

    def committed(self, unit: str, rows: int) -> None:
        self.rows_done += rows
        self.done_units.add(unit)

    def report(self, actor: str, snapshot: Snapshot) -> None:
        self.reports[actor] = snapshot

    def line(self, elapsed: float, units: int) -> str:
        now, live_rows, speed = time.time(), 0.0, 0.0
        for r in list(self.reports.values()):
            if now - r.time < self.recent_s:
                speed += r.tokens_per_s
            if r.unit and r.unit not in self.done_units:
                live_rows += min(0.95, r.unit_tokens / max(r.unit_source_tokens, 1)) * r.unit_rows
        done = min(self.rows_done + live_rows, self.rows_total)
        eta = f"  ETA ~{(self.rows_total - done) * elapsed / done:.0f}s" if done else ""
        return (f"[{elapsed:7.1f}s] rows ~{done:.0f}/{self.rows_total} (units {len(self.done_units)}/{units} "
                f"committed)  decoding {speed:.0f} tokens/s{eta}")


class Ticker:
    """Calls ``fn`` every ``every_s`` seconds on a daemon thread while the ``with`` block runs."""

    def __init__(self, every_s: float, fn: Callable[[], None]) -> None:
        self.every_s, self.fn, self._stop = every_s, fn, threading.Event()
        self._thread = threading.Thread(target=self._run, name="raymt-progress", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.fn()

    def __enter__(self) -> "Ticker":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
