"""Driver-side bookkeeping of the decoder actors: no Ray in here, so it is unit-tested directly.

The driver owns a pool of plain decoder actors and hands each at most ``depth`` items (an encoded
block or raw units) at a time: one decoding, the next already waiting in the actor's queue, so a
decoder never idles between units (top-up at the grain of a unit). ``Pool`` decides

* how many actors to run: between ``lo`` and ``hi``, no more than there is work left;
* which ready actor gets the next item: the least loaded one;
* which actors to let go when the work left shrinks (idle ones only, never below ``lo``);
* what a failure means: a unit is tried again until it has failed ``max_attempts`` times.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Pool:
    lo: int
    hi: int
    depth: int = 2
    max_attempts: int = 3
    ready: dict[str, int] = field(default_factory=dict)  # actor -> items in flight
    starting: set[str] = field(default_factory=set)  # created, model not loaded yet
    attempts: Counter = field(default_factory=Counter)  # unit -> failed attempts
    failed: dict[str, str] = field(default_factory=dict)  # unit -> last reason, attempts used up

    @property
    def size(self) -> int:
        return len(self.ready) + len(self.starting)

    def to_start(self, work_left: int) -> int:
        """How many more actors to create for ``work_left`` items (queued or in flight)."""
        want = min(self.hi, max(self.lo, work_left))
        return max(0, want - self.size)

    def to_stop(self, work_left: int) -> list[str]:
        """Idle ready actors beyond what ``work_left`` needs (never below ``lo``)."""
        spare = self.size - max(self.lo, work_left)
        idle = [a for a, n in self.ready.items() if n == 0]
        return idle[:max(0, spare)]

    def started(self, actor: str) -> None:
        self.starting.add(actor)

    def became_ready(self, actor: str) -> None:
        self.starting.discard(actor)
        self.ready[actor] = 0

    def stopped(self, actor: str) -> None:
        self.starting.discard(actor)
        self.ready.pop(actor, None)

    def next_actor(self) -> str | None:
        """The least loaded ready actor with room for another item, if any."""
        room = [(n, a) for a, n in self.ready.items() if n < self.depth]
        return min(room)[1] if room else None

    def sent(self, actor: str) -> None:
        self.ready[actor] += 1

    def returned(self, actor: str) -> None:
        if actor in self.ready:
            self.ready[actor] -= 1

    def failed_attempt(self, unit: str, reason: str) -> bool:
        """Record a failed attempt at ``unit``; True if it should be tried again."""
        self.attempts[unit] += 1
        if self.attempts[unit] < self.max_attempts:
            return True
        self.failed[unit] = reason
        return False
