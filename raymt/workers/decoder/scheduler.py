"""Decoder scheduler: which sentences to admit and which to expand at each step. No torch.

Interface (nano-vllm style): ``add(request)``; ``schedule() -> StepPlan`` (admissions, each into a
free slot, the sentences to encode now and the sentences to expand this step); the engine runs one
model step for the planned sentences and calls ``update(plan, StepOutput) -> finished ids``, which
frees their slots so the next ``schedule`` refills them. The scheduler owns the slots (the free
list and each running sentence's ``Request.slot``) and the encode-ahead queue: a policy that admits
a sentence or two a step (FIFO, top-up) has the sentences about to be admitted encoded together
with the next waiting ones, up to one batch of slots (the top-up paper's encoded-ahead queue), so
the encoder runs on batches and admission only copies. Policies:

* ``FIXED`` / ``VAR_BATCH``: admit a batch of ``n`` sentences when none is active, expand all of
  them until all finish (VAR_BATCH differs only in the search's pruning, not in scheduling);
* ``VAR_STREAM`` (Yang et al. 2020, Algorithm 1): when at most ``epsilon * n`` sentences remain,
  refill up to ``n``; expand only the sentences at the minimal current target length (new ones
  catch up while older ones wait); ``flush_every`` > 0 expands everyone every that many steps so
  long sentences cannot stay stuck behind a stream of short ones;
* ``FIFO`` (VAR-STR-FIFO): expand up to capacity starting from the longest (oldest) sentences,
  admitting whenever capacity is left;
* ``TOPUP`` (top-up batching, Algorithms 5-6): expand all active sentences; refill from the
  (encoded-ahead) queue once the batch is at least ``refill_threshold`` empty.

Capacity counts ``sentences``, ``beams`` (live beam width: candidate expansions per step) or
``tokens`` (source tokens of the active sentences, a memory proxy for cached cross-attention).
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from enum import Enum


class Policy(str, Enum):
    FIXED = "fixed"
    VAR_BATCH = "var-batch"
    VAR_STREAM = "var-stream"
    FIFO = "fifo"
    TOPUP = "topup"


class CapacityUnit(str, Enum):
    SENTENCES = "sentences"
    BEAMS = "beams"
    TOKENS = "tokens"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    policy: Policy = Policy.FIXED
    max_batch_sentences: int = 32  # n
    capacity: int = 32  # in ``capacity_unit``
    capacity_unit: CapacityUnit = CapacityUnit.SENTENCES
    epsilon: float = 1 / 6  # VAR_STREAM refill threshold
    refill_threshold: float = 0.5  # TOPUP: refill when at least this share of the batch is empty
    flush_every: int = 0  # VAR_STREAM: expand every active sentence every that many steps (0: never)

    def __post_init__(self) -> None:
        # the names as strings too ("topup", "beams"): an unknown one fails here, not as another unit later
        object.__setattr__(self, "policy", Policy(self.policy))
        object.__setattr__(self, "capacity_unit", CapacityUnit(self.capacity_unit))
        if self.max_batch_sentences < 1 or self.capacity < 1:
            raise ValueError("max_batch_sentences and capacity must be >= 1")
        if not 0.0 <= self.epsilon < 1.0:
            raise ValueError(f"epsilon must be in [0, 1), got {self.epsilon}")
        if not 0.0 < self.refill_threshold <= 1.0:
            raise ValueError(f"refill_threshold must be in (0, 1], got {self.refill_threshold}")
        if self.flush_every < 0:
            raise ValueError("flush_every must be >= 0")


class Status(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    id: int
    source_length: int
    width: int = 1  # live beams (1 at admission: the start token)
    length: int = 0  # target tokens generated so far
    status: Status = Status.WAITING
    max_length: int = 0  # the cap on its generated tokens (the engine's; the scheduler only carries it)
    slot: int = -1  # its slot while running (given at admission, freed when it finishes)
    forced_first: int = -1  # a token its first generated step must emit (M2M100 / NLLB: the target language), or -1


@dataclass(frozen=True)
class StepPlan:
    admit: tuple[int, ...]  # request ids entering the batch this step (then expanded too)
    expand: tuple[int, ...]  # request ids to run one decoder step for, admitted ones included
    encode: tuple[int, ...] = ()  # request ids to encode now (admitted ones not encoded yet, then waiting ones)


@dataclass(frozen=True)
class StepOutput:
    """What the engine reports back: finished ids, and the new live width of the others."""

    finished: tuple[int, ...] = ()
    widths: dict[int, int] = field(default_factory=dict)


@dataclass
class SchedulerStats:
    steps: int = 0
    refills: int = 0
    expansions: int = 0  # sum over steps of the expanded sentences' live widths
    batch_sizes: list[int] = field(default_factory=list)  # sentences expanded per step


class Scheduler:
    """``beam_size``: the search's beam width, the width a new sentence may grow to (capacity counted
    in beams reserves that much for it at admission)."""

    def __init__(self, cfg: SchedulerConfig, stats: SchedulerStats | None = None, *, beam_size: int = 1) -> None:
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        self.cfg, self.beam_size = cfg, beam_size
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}  # admission order
        self.free: list[int] = list(range(cfg.max_batch_sentences))  # free slots, taken from the front
        self.encoded: set[int] = set()  # waiting ids encoded ahead of their admission
        self.stats = stats if stats is not None else SchedulerStats()  # given: read live by the caller

    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        self.waiting.append(request)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ capacity
    def _cost(self, r: Request, admitted: bool) -> int:
        unit = self.cfg.capacity_unit
        if unit is CapacityUnit.SENTENCES:
            return 1
        if unit is CapacityUnit.BEAMS:
            return self.beam_size if admitted else max(r.width, 1)
        return r.source_length

    def _load(self) -> int:
        return sum(self._cost(r, admitted=self.cfg.capacity_unit is CapacityUnit.BEAMS) for r in self.running.values())

    def _admit(self, limit_sentences: int) -> list[Request]:
        """Move waiting requests into the batch while both the sentence limit and capacity allow."""
        admitted, load = [], self._load()
        while self.waiting and len(self.running) + len(admitted) < limit_sentences:
            cost = self._cost(self.waiting[0], admitted=True)
            if (self.running or admitted) and load + cost > self.cfg.capacity:
                break
            r = self.waiting.popleft()
            r.status, load = Status.RUNNING, load + cost
            admitted.append(r)
        for r in admitted:
            r.slot = self.free.pop(0)
            self.running[r.id] = r
        if admitted:
            self.stats.refills += 1
        return admitted

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> StepPlan:
        """Algorithm: decide admissions by policy, then which running sentences expand this step."""
        cfg, n = self.cfg, self.cfg.max_batch_sentences
        policy = cfg.policy
        if policy in (Policy.FIXED, Policy.VAR_BATCH):
            admitted = self._admit(n) if not self.running else []
        elif policy is Policy.VAR_STREAM:  # refill by m = n(1 - epsilon) once <= epsilon * n remain
            refill = not self.running or len(self.running) <= cfg.epsilon * n
            admitted = self._admit(len(self.running) + max(1, round(n * (1 - cfg.epsilon)))) if refill else []
        elif policy is Policy.TOPUP:
            empty = 1.0 - len(self.running) / n
            admitted = self._admit(n) if not self.running or empty >= cfg.refill_threshold else []
        else:  # FIFO: admit whenever room is left
            admitted = self._admit(n)
        expand = self._select(policy)
        self.stats.steps += 1
        self.stats.batch_sizes.append(len(expand))
        self.stats.expansions += sum(self.running[i].width for i in expand)
        admit = tuple(r.id for r in admitted)
        return StepPlan(admit, tuple(expand), self._encode_ahead(admit))

    def _encode_ahead(self, admit: tuple[int, ...]) -> tuple[int, ...]:
        """Algorithm: when an admitted sentence is not encoded yet, encode it now together with the
        next waiting ones not encoded yet, up to one batch of slots; the waiting ones are then
        admitted without encoding."""
        missing = [i for i in admit if i not in self.encoded]
        self.encoded.difference_update(admit)
        if not missing:
            return ()
        room = max(self.cfg.max_batch_sentences - len(missing), 0)
        ahead = [r.id for r in itertools.islice(self.waiting, self.cfg.max_batch_sentences)
                 if r.id not in self.encoded][:room]
        self.encoded.update(ahead)
        return tuple(missing + ahead)

    def occupied(self) -> list[tuple[int, int]]:
        """(id, slot) of every running sentence, in admission order."""
        return [(i, r.slot) for i, r in self.running.items()]

    def slot_of(self, request_id: int) -> Request:
        """A running sentence's request: its ``slot`` and ``max_length``."""
        return self.running[request_id]

    def _select(self, policy: Policy) -> list[int]:
        running = list(self.running.values())
        if not running:
            return []
        if policy is Policy.VAR_STREAM:
            flush = self.cfg.flush_every and self.stats.steps % self.cfg.flush_every == self.cfg.flush_every - 1
            if not flush:
                shortest = min(r.length for r in running)
                running = [r for r in running if r.length == shortest]
        elif policy is Policy.FIFO:
            chosen, load = [], 0
            for r in sorted(running, key=lambda r: -r.length):  # longest (oldest) first; stable in admission order
                cost = self._cost(r, admitted=False)
                if chosen and load + cost > self.cfg.capacity:
                    continue
                chosen.append(r)
                load += cost
            chosen_ids = {r.id for r in chosen}
            running = [r for r in running if r.id in chosen_ids]  # back to admission order
        return [r.id for r in running]

    # ------------------------------------------------------------------ update
    def update(self, plan: StepPlan, out: StepOutput) -> list[int]:
        """Advance expanded sentences by one token, record widths, free the finished."""
        for rid in plan.expand:
            r = self.running[rid]
            r.length += 1
            if rid in out.widths:
                r.width = out.widths[rid]
        finished = []
        for rid in out.finished:
            r = self.running.pop(rid)
            r.status = Status.FINISHED
            self.free.append(r.slot)
            finished.append(rid)
        return finished
