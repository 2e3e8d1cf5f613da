"""One decode configuration, ``DecodeConfig`` (search, batching, runtime, shortlist, the row
limit), and the one table of its defaults, ``DEFAULTS``.

The command line (``raymt.jobs.translate``: every flag's default is read from here), the Python API
(``Translator.load`` / ``Translator.translate``) and the jobs build their decoding from this table,
so the same text translates the same whichever way it comes in; an M2M100 / NLLB directory's own
generation settings (``generation_config.json``: ``workers/generation.py``) replace the search
defaults for that model, in all three alike. Defaults that depend on the device
the decoders decode on (batch size, static step, refill threshold) are ``workers/device.py``'s
``CPU_DEFAULTS`` / ``GPU_DEFAULTS``; the table holds the CPU's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from raymt.workers.config import SearchConfig
from raymt.workers.device import CPU_DEFAULTS, batching_defaults_for
from raymt.workers.inputs import MAX_ROW_CHARS
from raymt.workers.scheduler import CapacityUnit, Policy, SchedulerConfig
from raymt.workers.speedups import EXACT, CpuSpeedups, precision_refusal
from raymt.workers.static_step import StaticStep


@dataclass(frozen=True, slots=True)
class ShortlistSource:
    """A lexical shortlist to decode over (``raymt.pipeline.shortlist_files.load_shortlist``)."""

    path: str  # lex.s2t (with its .freq) or a CTranslate2 .vmap file
    top_m: int = 10  # top translations kept per source token
    top_n: int = 100  # most frequent target tokens always kept

    def __post_init__(self) -> None:
        if self.top_m < 0 or self.top_n < 0:
            raise ValueError("shortlist top_m and top_n must be >= 0")

    def signature(self) -> str:
        return f"shortlist:{self.path}:{self.top_m}:{self.top_n}"


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """How sentences are grouped into decoder steps.

    ``schedule`` None: length-sorted batches of ``max_batch_size`` decoded to their end; otherwise
    the engine streams under that policy with ``schedule.max_batch_sentences`` slots. Every policy
    gives the same translations. ``tune``: closed-loop batch size (``workers/tuning.py``) starting at
    ``max_batch_size``. ``static``: the one-shape step (a CUDA graph on a GPU); None: the dynamic step.
    """

    max_batch_size: int = CPU_DEFAULTS.max_batch_size
    schedule: SchedulerConfig | None = None
    tune: bool = False
    static: StaticStep | None = None

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")

    @property
    def slots(self) -> int:
        """Sentences decoded side by side: the schedule's slots, else the batch size."""
        return self.schedule.max_batch_sentences if self.schedule else self.max_batch_size

    @property
    def mode(self) -> str:
        return self.schedule.policy.value if self.schedule else "batch"


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Where and how the model runs: ``device`` auto | cpu | cuda | cuda:N (``workers/device.py``),
    ``threads`` torch intra-op threads (0: the caller's choice), ``speedups`` the CPU rewrites and
    the precision (int8 with a GPU device is refused: it runs on the CPU only)."""

    device: str = "cpu"
    threads: int = 0
    speedups: CpuSpeedups = EXACT

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        if why := precision_refusal(self.speedups, self.device):
            raise ValueError(why)


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    """Everything that decides how a decoder decodes, built once (``jobs/`` or the caller) and passed down."""

    search: SearchConfig = SearchConfig()
    batching: BatchingConfig = BatchingConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    shortlist: ShortlistSource | None = None
    max_row_chars: int = MAX_ROW_CHARS  # a longer row is ``too_long``, not decoded (0: no limit; workers/inputs.py)
    split_sentences: bool = True  # a row of several sentences is decoded a sentence at a time (workers/sentences.py)

    def __post_init__(self) -> None:
        if self.max_row_chars < 0:
            raise ValueError(f"max_row_chars must be >= 0 (0: no limit), got {self.max_row_chars}")


# The one table of defaults. The command line's streaming knobs (policy, epsilon, capacity unit,
# flush) default to SCHEDULE's fields; ``--batching auto`` picks top-up, or batches with a
# shortlist or the batch-size tuner (their candidate sets and sizes are per batch).
DEFAULTS = DecodeConfig()
SCHEDULE = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=CPU_DEFAULTS.max_batch_size,
                           capacity=CPU_DEFAULTS.max_batch_size, refill_threshold=CPU_DEFAULTS.refill_threshold)
SHORTLIST = ShortlistSource(path="")



def batching_for(on_gpu: bool, *, shortlist: bool = False, max_batch_tokens: int = 0,
                 precision: str = "float32") -> BatchingConfig:
    """The command line's batching (``--batching auto``) on a device, for callers without flags (the
    Python API, the Ray Data operator): top-up streaming with the device's batch size and refill
    threshold, or batches with a shortlist (its candidate set is per batch); a GPU's one-shape step.
    ``max_batch_tokens`` > 0 caps each step's source tokens instead of its sentences."""
    d = batching_defaults_for(on_gpu, precision)
    schedule = None
    if not shortlist:
        schedule = replace(SCHEDULE, max_batch_sentences=d.max_batch_size, capacity=d.max_batch_size,
                           refill_threshold=d.refill_threshold)
        if max_batch_tokens:
            schedule = replace(schedule, capacity=max_batch_tokens, capacity_unit=CapacityUnit.TOKENS)
    return BatchingConfig(max_batch_size=d.max_batch_size, schedule=schedule,
                          static=StaticStep(readback_every=d.static_step) if d.static_step else None)
