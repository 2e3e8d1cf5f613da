"""What a decoder actor is built from: ``DecoderSettings`` (the model, where it commits, one
``DecodeConfig`` for how it decodes, the job's hold on the output) and ``PartColumns`` (what each
committed part carries besides the translations)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from raymt.pipeline.lease import Fence
from raymt.workers.config import SearchConfig
from raymt.workers.decode_config import SHORTLIST, DecodeConfig
from raymt.workers.scheduler import SchedulerConfig
from raymt.workers.speedups import CpuSpeedups
from raymt.workers.static_step import StaticStep


@dataclass(frozen=True, slots=True)
class PartColumns:
    """What a committed part carries besides the translations."""

    evaluate: bool = False  # the unit's sacreBLEU sufficient statistics in its stats row
    token_logprobs: bool = False  # teacher-forced log-prob of each token of the best translation (distillation)
    keep_reference: bool = False  # the reference column travels to the output (a distillation bitext's target)


@dataclass(frozen=True, slots=True)
class DecoderSettings:
    """What a decoder actor needs: the model, where it commits, how it decodes (one ``DecodeConfig``)
    and the job's hold on the output. The read-only properties below are views of ``decode``."""

    model: str
    output: str
    decode: DecodeConfig
    signature: str  # what decodes, printed beside every output and part of the plan
    parts: PartColumns = PartColumns()
    plan: str | None = None  # the output's plan digest (pipeline/ledger.py): the unit files it commits carry it
    fence: Fence | None = None  # the job's hold on the output's lease (pipeline/lease.py): every commit passes it
    slice_s: float = 2.0  # stats over time: one slice of the live counters every this many seconds

    def with_threads(self, threads: int) -> DecoderSettings:
        return replace(self, decode=replace(self.decode, runtime=replace(self.decode.runtime, threads=threads)))

    @property
    def search(self) -> SearchConfig:
        return self.decode.search

    @property
    def batching(self) -> SchedulerConfig | None:
        return self.decode.batching.schedule

    @property
    def static(self) -> StaticStep | None:
        return self.decode.batching.static

    @property
    def max_batch_size(self) -> int:
        return self.decode.batching.max_batch_size

    @property
    def tune_batch(self) -> bool:
        return self.decode.batching.tune

    @property
    def threads(self) -> int:
        return self.decode.runtime.threads

    @property
    def speedups(self) -> CpuSpeedups:
        return self.decode.runtime.speedups

    @property
    def device(self) -> str:
        return self.decode.runtime.device

    @property
    def shortlist(self) -> str | None:
        return self.decode.shortlist.path if self.decode.shortlist else None

    @property
    def shortlist_m(self) -> int:
        return (self.decode.shortlist or SHORTLIST).top_m

    @property
    def shortlist_n(self) -> int:
        return (self.decode.shortlist or SHORTLIST).top_n

    @property
    def evaluate(self) -> bool:
        return self.parts.evaluate

    @property
    def token_logprobs(self) -> bool:
        return self.parts.token_logprobs

    @property
    def keep_reference(self) -> bool:
        return self.parts.keep_reference
