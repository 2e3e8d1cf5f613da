"""Driver-side bookkeeping of the decoder actors: no Ray in here, so it is unit-tested directly.

The driver owns a pool of plain decoder actors and hands each at most ``depth`` items (an encoded
block or raw units) at a time: one decoding, the next already waiting in the actor's queue, so a
decoder never idles between units (top-up at the grain of a unit). ``Pool`` decides

* how many actors to run: between ``lo`` and ``hi``, no more than there is work left;
* which ready actor gets the next item: the least loaded one;
* which actors to let go when the work left shrinks (idle ones only, never below ``lo``);
* what a failure means: a unit is tried again until it has failed ``max_attempts`` times, and
  whether its last failure was its own error (bad data) or its actor's loss (killed, node gone);
* how a decoder's health is judged (``Health``): a death is counted once however many items it
  lost (items carry the actor's incarnation); a dead actor is probed again with exponential
  back-off until it answers, or it is replaced by a fresh one once it has been down
  ``restart_timeout_s`` or died ``max_deaths`` times; an actor with work that shows no sign of
  life for ``stall_timeout_s`` is restarted; and the job gives up, naming what is left, once no
  decoder has been ready for ``decoder_wait_s``.

Every wait of the driver is bounded by one of these times.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum


@dataclass(frozen=True, slots=True)
class Health:
    restart_timeout_s: float = 300.0  # a dead actor not answering again within this is replaced
    stall_timeout_s: float = 1800.0  # an actor with items and no sign of life this long is killed (and restarted)
    decoder_wait_s: float = 600.0  # no ready decoder for this long while work is left: the job fails
    max_deaths: int = 5  # an actor that died this often is replaced by a fresh one
    backoff_s: float = 0.5  # first re-probe delay, doubled each failed probe
    max_backoff_s: float = 10.0


class Verdict(Enum):
    RETRY = "retry"  # probe again later
    REPLACE = "replace"  # kill it for good; a fresh actor takes its place


@dataclass
class Down:
    since: float
    next_probe: float
    tries: int = 0
    probing: bool = False


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
    lost: set[str] = field(default_factory=set)  # units whose last attempt died with its actor (no error of theirs)
    health: Health = field(default_factory=Health)
    down: dict[str, Down] = field(default_factory=dict)  # died, being probed until it answers
    deaths: Counter = field(default_factory=Counter)  # actor -> deaths seen
    incarnation: Counter = field(default_factory=Counter)  # actor -> deaths so far: tags the items sent
    last_alive: dict[str, float] = field(default_factory=dict)  # actor -> last time it returned or answered
    none_ready_since: float | None = None

    @property
    def size(self) -> int:
        return len(self.ready) + len(self.starting) + len(self.down)

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
        self.down.pop(actor, None)
        self.last_alive.pop(actor, None)

    def next_actor(self, waiting: int | None = None) -> str | None:
        """The least loaded ready actor with room for another item, if any. With ``waiting`` items
        left to send, a busy actor gets no second one while actors still starting could take them
        all: the first decoder to load its model took both units of a 2-unit job, and the second
        decoder idled."""
        room = [(n, a) for a, n in self.ready.items() if n < self.depth]
        if not room:
            return None
        n, actor = min(room)
        return None if n and waiting is not None and waiting <= len(self.starting) else actor

    def sent(self, actor: str, now: float = 0.0) -> None:
        if self.ready[actor] == 0:
            self.last_alive[actor] = now  # the stall clock starts when it gets work
        self.ready[actor] += 1

    def returned(self, actor: str, incarnation: int = 0, now: float = 0.0) -> None:
        """An item came back (done or raised) from ``actor`` as it was at ``incarnation``."""
        if actor in self.ready and incarnation == self.incarnation[actor]:
            self.ready[actor] -= 1
            self.last_alive[actor] = now

    def died(self, actor: str, incarnation: int, now: float) -> bool:
        """An item sent at ``incarnation`` was lost because the actor died; True if this is a new death."""
        if actor not in self.ready or incarnation != self.incarnation[actor]:
            return False  # another item of a death already counted, or an actor already let go
        del self.ready[actor]
        self.incarnation[actor] += 1
        self.deaths[actor] += 1
        self.down[actor] = Down(since=now, next_probe=now + self.health.backoff_s)
        return True

    def down_since(self, actor: str, now: float) -> None:
        """A starting actor died before it answered (killed while loading the model): probe it with back-off."""
        self.starting.discard(actor)
        self.deaths[actor] += 1
        self.down[actor] = Down(since=now, next_probe=now + self.health.backoff_s)

    def probes_due(self, now: float) -> list[str]:
        """Down actors to probe now (not already being probed, back-off elapsed)."""
        due = [a for a, d in self.down.items() if not d.probing and d.next_probe <= now]
        for a in due:
            self.down[a].probing = True
        return due

    def probe_failed(self, actor: str, now: float, permanent: bool = False) -> Verdict:
        d = self.down[actor]
        d.probing, d.tries = False, d.tries + 1
        if permanent or now - d.since >= self.health.restart_timeout_s:
            return Verdict.REPLACE
        d.next_probe = now + min(self.health.backoff_s * 2 ** d.tries, self.health.max_backoff_s)
        return Verdict.RETRY

    def probe_ok(self, actor: str, now: float) -> Verdict:
        """A down actor answered: back in the pool, unless it has died too often (then replace it)."""
        self.down.pop(actor, None)
        if self.deaths[actor] >= self.health.max_deaths:
            return Verdict.REPLACE
        self.ready[actor] = 0
        self.last_alive[actor] = now
        return Verdict.RETRY

    def stalled(self, now: float) -> list[str]:
        """Ready actors with items in flight and no sign of life for ``stall_timeout_s``."""
        return [a for a, n in self.ready.items()
                if n and now - self.last_alive.get(a, now) >= self.health.stall_timeout_s]

    def waited_for_decoders(self, now: float, work_left: int) -> float:
        """Seconds without any ready decoder while work is left (0 when one is ready or nothing is left)."""
        if self.ready or not work_left:
            self.none_ready_since = None
            return 0.0
        if self.none_ready_since is None:
            self.none_ready_since = now
        return now - self.none_ready_since

    def failed_attempt(self, unit: str, reason: str, lost: bool = False) -> bool:
        """Record a failed attempt at ``unit`` (``lost``: its actor died or vanished, the unit itself
        raised nothing); True if it should be tried again."""
        (self.lost.add if lost else self.lost.discard)(unit)
        self.attempts[unit] += 1
        if self.attempts[unit] < self.max_attempts:
            return True
        self.failed[unit] = reason
        return False
