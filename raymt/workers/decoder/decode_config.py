"""One decode configuration, ``DecodeConfig`` (search, batching, runtime, shortlist, the row
limit), the one table of its defaults, ``DEFAULTS``, and what one decode call takes, ``DecodeRequest``.

Load-time settings (the model's runtime, the batch size, the shortlist's file) are read where the
decoder is loaded (``raymt.pipeline.decoders.loading.load_decoder``); the per-call ones travel whole as one
``DecodeRequest`` (``DecodeConfig.request``: the search, the loaded shortlist, the streaming
schedule, the static step) to ``CoreDecoder.decode_ids``, as CTranslate2 passes its
``TranslationOptions`` to ``translate_batch``. ``DecodeConfig.signature`` is the line printed beside
every output (and compared when a job resumes).

The command line (``raymt.jobs.translate``: every flag's default is read from here), the Python API
(``Translator.load`` / ``Translator.translate``) and the jobs build their decoding from this table,
so the same text translates the same whichever way it comes in; an M2M100 / NLLB directory's own
generation settings (``generation_config.json``) replace the search defaults for that model, in all
three alike, through one merge (``workers/checkpoints/generation.py``: ``effective_search``). Defaults that
depend on the device the decoders decode on (batch size, static step, refill threshold) are
``workers/decoder/device.py``'s ``CPU_DEFAULTS`` / ``GPU_DEFAULTS``, read by ``batching_for`` (and by
``CoreDecoder.load`` for a batch size not given); the table holds the CPU's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from raymt.workers.config import SearchConfig
from raymt.workers.decoder.device import CPU_DEFAULTS, batching_defaults_for
from raymt.workers.text.inputs import MAX_ROW_CHARS
from raymt.workers.decoder.scheduler import CapacityUnit, Policy, SchedulerConfig
from raymt.workers.kernels.speedups import EXACT, CpuSpeedups, precision_refusal
from raymt.workers.decoder.static_step import StaticStep

if TYPE_CHECKING:
    from raymt.workers.search.shortlist import AnyShortlist


@dataclass(frozen=True, slots=True)
class ShortlistSource:
    """A lexical shortlist to decode over (``raymt.pipeline.decoders.shortlist_files.load_shortlist``)."""

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
    gives the same translations. ``tune``: closed-loop batch size (``workers/decoder/tuning.py``) starting at
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
    """Where and how the model runs: ``device`` auto | cpu | cuda | cuda:N (``workers/decoder/device.py``),
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
    max_row_chars: int = MAX_ROW_CHARS  # a longer row is ``too_long``, not decoded (0: no limit; workers/text/inputs.py)
    split_sentences: bool = True  # a row of several sentences is decoded a sentence at a time (workers/text/sentences.py)

    def __post_init__(self) -> None:
        if self.max_row_chars < 0:
            raise ValueError(f"max_row_chars must be >= 0 (0: no limit), got {self.max_row_chars}")

    def request(self, shortlist: AnyShortlist | None = None) -> DecodeRequest:
        """What each decode call takes, built once per job or translator: the search, ``shortlist``
        (``self.shortlist``'s table as loaded, or None), the schedule and the static step."""
        return DecodeRequest(self.search, shortlist, self.batching.schedule, self.batching.static)

    def signature(self, model: str, *, source_lang: str | None = None, target_lang: str | None = None) -> str:
        """What decodes, in a line printed beside every output and part of a job's plan: ``model``
        named as one path however it is spelled (``./m/`` and ``m`` are the same model), the search,
        the batching mode, the shortlist, a precision other than float32, the languages, a row limit
        other than the default (which rows are decoded at all) and the sentence splitting."""
        name = model.rstrip("/") if "://" in model else os.path.normpath(model)
        precision = self.runtime.speedups.precision  # (what the decoders run: int8 off the CPU is refused first)
        return f"model:{name}|{self.search.signature()}|batching:{self.batching.mode}" + (
            f"|{self.shortlist.signature()}" if self.shortlist else "") + (
            "" if precision == "float32" else f"|{precision}") + (
            f"|langs:{source_lang}>{target_lang}" if source_lang or target_lang else "") + (
            f"|max-row-chars:{self.max_row_chars}" if self.max_row_chars != MAX_ROW_CHARS else "") + (
            "|sentences" if self.split_sentences else "")


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    """What one ``CoreDecoder.decode_ids`` call decodes with, passed whole: the search, the loaded
    shortlist (a ``Shortlist``, ``LanguageShortlists`` or None), the streaming schedule (None:
    length-sorted batches of the decoder's batch size) and the one-shape step (None: the dynamic
    step)."""

    search: SearchConfig
    shortlist: AnyShortlist | None = None
    schedule: SchedulerConfig | None = None
    static: StaticStep | None = None


# The one table of defaults. The command line's streaming knobs (policy, epsilon, capacity unit,
# flush) default to SCHEDULE's fields; ``--batching auto`` picks top-up, or batches with a
# shortlist or the batch-size tuner (their candidate sets and sizes are per batch).
DEFAULTS = DecodeConfig()
SCHEDULE = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=CPU_DEFAULTS.max_batch_size,
                           capacity=CPU_DEFAULTS.max_batch_size, refill_threshold=CPU_DEFAULTS.refill_threshold)
SHORTLIST = ShortlistSource(path="")



def batching_for(on_gpu: bool, *, shortlist: bool = False, max_batch_tokens: int = 0,
                 precision: str = "float32") -> BatchingConfig:
    """The batching of a device where nothing is given (``--batching auto``): top-up streaming with the
    device's batch size and refill threshold, or batches with a shortlist (its candidate set is per
    batch); a GPU's one-shape step. The Python API and the Ray Data operator decode with it, the
    command line applies its batching flags over it (``jobs/translate.py``: ``batching_config``).
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
