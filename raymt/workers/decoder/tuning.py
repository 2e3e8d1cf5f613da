"""Closed-loop batch capacity: the decoder picks its batch size from measured throughput, under a
cap from free memory and from out-of-memory errors. No torch here: the caller times its batches.

    tuner = BatchTuner(TunerConfig(start=16))
    while work:
        size = tuner.next_size()
        tokens, seconds = decode(next `size` sentences)      # split and retried on OOM: tuner.out_of_memory(size)
        tuner.record(size, tokens, seconds)

A trial compares the current size with a challenger (x ``factor`` up, or down once up has lost)
on alternating batches, ``pairs`` of each: inputs arrive sorted by length, so neighbouring batches
are alike and alternation keeps the comparison fair while lengths drift. The challenger must win
by ``min_gain``; once neither neighbour wins, the size stays for ``settle_batches`` batches and the
search starts again (the best size moves with sentence length and machine load).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TunerConfig:
    start: int = 16
    min_size: int = 1
    max_size: int = 512
    factor: float = 2.0
    pairs: int = 3
    min_gain: float = 0.03
    settle_batches: int = 200


@dataclass
class BatchTuner:
    cfg: TunerConfig = field(default_factory=TunerConfig)
    size: int = 0
    cap: int = 0  # the largest size allowed (memory); 0 -> cfg.max_size
    history: list[tuple[int, float]] = field(default_factory=list)  # (size, tokens/s) of every batch
    _challenger: int = 0
    _direction: int = 1  # +1: trying larger sizes, -1: smaller
    _tried_down: bool = False
    _trial: dict[int, list[float]] = field(default_factory=dict)  # size -> [tokens, seconds, batches]
    _settled_for: int = 0

    def __post_init__(self) -> None:
        self.cap = self.cap or self.cfg.max_size
        self.size = self._clamp(self.size or self.cfg.start)
        self._challenger = self._neighbour(+1)

    def _clamp(self, n: float) -> int:
        return max(self.cfg.min_size, min(int(round(n)), self.cap))

    def _neighbour(self, direction: int) -> int:
        n = self._clamp(self.size * self.cfg.factor if direction > 0 else self.size / self.cfg.factor)
        return 0 if n == self.size else n

    def next_size(self) -> int:
        """The size of the next batch: during a trial, current and challenger alternate."""
        if not self._challenger:
            return self.size
        done = {s: int(v[2]) for s, v in self._trial.items()}
        return self._challenger if done.get(self.size, 0) > done.get(self._challenger, 0) else self.size

    def record(self, size: int, tokens: int, seconds: float) -> None:
        self.history.append((size, tokens / max(seconds, 1e-9)))
        if not self._challenger:
            self._settled_for += 1
            if self._settled_for >= self.cfg.settle_batches:
                self._start_trial(+1)
            return
        if size not in (self.size, self._challenger):
            return
        t = self._trial.setdefault(size, [0.0, 0.0, 0])
        t[0], t[1], t[2] = t[0] + tokens, t[1] + seconds, t[2] + 1
        if min(self._trial.get(s, [0, 0, 0])[2] for s in (self.size, self._challenger)) >= self.cfg.pairs:
            self._decide()

    def _rate(self, size: int) -> float:
        tokens, seconds, _ = self._trial[size]
        return tokens / max(seconds, 1e-9)

    def _decide(self) -> None:
        if self._rate(self._challenger) > self._rate(self.size) * (1 + self.cfg.min_gain):
            self.size = self._challenger  # keep going the same way
            self._start_trial(self._direction)
        elif self._direction > 0 and not self._tried_down:
            self._start_trial(-1)
        else:
            self._settle()

    def _start_trial(self, direction: int) -> None:
        self._direction, self._trial, self._settled_for = direction, {}, 0
        self._tried_down = self._tried_down or direction < 0
        self._challenger = self._neighbour(direction)
        if not self._challenger:
            if direction > 0 and not self._tried_down:
                self._start_trial(-1)
            else:
                self._settle()

    def _settle(self) -> None:
        self._challenger, self._trial, self._settled_for, self._tried_down = 0, {}, 0, False

    def out_of_memory(self, size: int) -> None:
        """A batch of ``size`` did not fit: never try it (or more) again."""
        self.cap = max(self.cfg.min_size, min(self.cap, size // 2 if size > 1 else 1))
        self.size = self._clamp(min(self.size, self.cap))
        if self._challenger and self._challenger > self.cap:
            self._settle()

    def limit_memory(self, free_bytes: int, bytes_per_sentence: int, fraction: float = 0.5) -> None:
        """Cap the size so a batch's estimated memory stays within ``fraction`` of free memory."""
        if bytes_per_sentence > 0:
            self.cap = max(self.cfg.min_size, fit_slots(self.cap, free_bytes, bytes_per_sentence, fraction))
            self.size = self._clamp(self.size)


def bytes_per_sentence(*, layers: int, d_model: int, vocab: int, beam: int, max_target: int, max_source: int,
                       bytes_per_value: int = 4) -> int:
    """Decoder memory one sentence holds at its longest: self- and cross-attention K/V of every
    layer for each of its beams, plus the step's logits and log-probs over the vocabulary."""
    kv = layers * 2 * d_model * (max_target + max_source)
    return beam * (kv + 2 * vocab) * bytes_per_value


def fit_slots(wanted: int, free_bytes: int, bytes_per_slot: int, fraction: float = 0.5) -> int:
    """The slots (sentences) to decode with: ``wanted``, or as many as fill ``fraction`` of the free
    memory at ``bytes_per_slot`` each when fewer (at least 1)."""
    if bytes_per_slot <= 0:
        return wanted
    return max(1, min(wanted, int(free_bytes * fraction // bytes_per_slot)))


def available_memory() -> int:
    """Bytes of host memory free for new allocations (Linux ``MemAvailable``; 0 if unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
