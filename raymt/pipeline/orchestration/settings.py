"""What a job is built from and gives back, shared by the job's runner (``pipeline/orchestration/run.py``) and its
driver (``pipeline/orchestration/driver.py``): ``PipelineConfig`` and ``PipelineResult``; ``DecoderSettings``
(what a decoder actor is built from: the model, where it commits, one ``DecodeConfig`` for how it
decodes, the job's hold on the output) and ``PartColumns`` (what each committed part carries
besides the translations)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from raymt.pipeline.orchestration.dispatch import Health
from raymt.pipeline.reports.evaluate import Scores
from raymt.pipeline.outputs.lease import LEASE_TTL_S, Fence
from raymt.pipeline.outputs.records import UnitStats
from raymt.pipeline.orchestration.units import Columns
from raymt.workers.decoder.decode_config import DecodeConfig

ACTOR_THREADS = 2  # torch threads of a decoder actor on Ray where the decode's runtime leaves them open (0)


@dataclass(frozen=True, slots=True)
class PartColumns:
    """What a committed part carries besides the translations."""

    evaluate: bool = False  # the unit's sacreBLEU sufficient statistics in its stats row
    token_logprobs: bool = False  # teacher-forced log-prob of each token of the best translation (distillation)
    keep_reference: bool = False  # the reference column travels to the output (a distillation bitext's target)
    passthrough: bool = False  # the input's other columns / fields travel to the output (pipeline/inputs/passthrough.py)


@dataclass(frozen=True, slots=True)
class DecoderSettings:
    """What a decoder actor needs: the model, where it commits, how it decodes (one ``DecodeConfig``,
    read whole: ``settings.decode.search``, ``settings.decode.batching``) and the job's hold on the output."""

    model: str
    output: str
    decode: DecodeConfig
    signature: str  # what decodes, printed beside every output and part of the plan
    parts: PartColumns = PartColumns()
    plan: str | None = None  # the output's plan digest (pipeline/outputs/ledger.py): the unit files it commits carry it
    fence: Fence | None = None  # the job's hold on the output's lease (pipeline/outputs/lease.py): every commit passes it
    model_pins: tuple[tuple[str, str], ...] = ()  # (file name, SHA-256) of the model files the plan recorded
    slice_s: float = 2.0  # stats over time: one slice of the live counters every this many seconds
    source_lang: str | None = None  # M2M100 / NLLB: the source language code (``deu_Latn``, ``de``)
    target_lang: str | None = None  # M2M100 / NLLB: the target language, forced as each translation's first token

    def with_threads(self, threads: int) -> DecoderSettings:
        return replace(self, decode=replace(self.decode, runtime=replace(self.decode.runtime, threads=threads)))


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    input: str
    columns: Columns
    decoder: DecoderSettings  # threads 0: ACTOR_THREADS per decoder actor on Ray, every core in-process
    unit_rows: int | None = None  # None: the output's plan's when resuming, else ``auto_unit_rows`` (CPU 2500)
    decoders: int | tuple[int, int] = 0  # 0: as many as the cluster's CPUs (or GPUs) allow; (min, max): autoscale
    encoders: int = 1  # 0: decoder actors tokenise their units themselves
    cpus_per_decoder: float = 0.0  # 0: the decoder's thread count
    gpus_per_decoder: float = 0.0
    encoder_cpus: float = 0.0  # encoders only tokenise: they share the decoders' cores by default
    skip_corrupt: bool = False
    max_attempts: int = 3  # a unit that fails this often (its actor died, or it raised) is reported failed
    progress_every_s: float = 10.0
    restart: bool = False  # discard an output started by another plan instead of refusing
    overwrite: bool = False  # replace an existing --output file raymt did not write, or write among others' files
    local_rows: int = 1000  # no cluster address and at most this many rows: decode in this process (0: never)
    in_process: bool = False  # always decode in this process (no Ray)
    health: Health = field(default_factory=Health)
    assemble_to: str | None = None  # one file assembled from the parts, under the lease, before it is released
    lease_ttl_s: float = LEASE_TTL_S  # how long a paused or cut-off job keeps the output before another may take it


@dataclass
class PipelineResult:
    units: int
    skipped_units: int  # already committed by an earlier run
    rows: int
    target_tokens: int = 0
    seconds: float = 0.0
    scores: Scores | None = None
    stats: list[UnitStats] = field(default_factory=list)  # this run's units
    skipped_files: tuple = ()
    failed: dict[str, str] = field(default_factory=dict)  # unit -> reason, after max_attempts
    lost: set[str] = field(default_factory=set)  # failed units whose last attempt died with its actor
    unreadable: dict[str, str] = field(default_factory=dict)  # failed units written as rows saying so (skip_corrupt)
    statuses: dict[str, int] = field(default_factory=dict)  # rows of the whole output by status (ok, empty, ...)
    where: str = "ray"  # "ray", "in-process" (a small job) or "nothing to do"

    @property
    def tokens_per_second(self) -> float:
        return self.target_tokens / max(self.seconds, 1e-9)

    @property
    def decode_tokens_per_second(self) -> float:
        """Target tokens per second of decoding, per decoder (this run's units)."""
        return self.target_tokens / max(sum(r.decode_s for r in self.stats), 1e-9)
