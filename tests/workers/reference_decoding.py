"""Reference decoding calls of the tests: one padded batch decoded to its end on the engine, and a
decoder's hypotheses alone. The product decodes through ``CoreDecoder.decode_ids`` and the actors;
these are the plain forms the engine and parity tests compare against."""
from __future__ import annotations

from dataclasses import replace

from torch import Tensor

from raymt.workers.config import SearchConfig
from raymt.workers.decoder.core_decoder import CoreDecoder
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.engine import DecodeStats, Engine, batch_schedule
from raymt.workers.decoder.runner import DecodeRunner
from raymt.workers.decoder.scheduler import SchedulerConfig
from raymt.workers.search.selection import Hypothesis
from raymt.workers.search.shortlist import AnyShortlist


def beam_search(model, src_ids: Tensor, src_mask: Tensor, cfg: SearchConfig, *, forced_eos: bool = True,
                candidates: Tensor | None = None, stats: DecodeStats | None = None,
                runner: DecodeRunner | None = None) -> list[list[Hypothesis]]:
    """One padded batch, src_ids / src_mask (B, S), decoded to its end on the engine (FIXED policy)
    -> per sentence the ``cfg.num_hypotheses`` best hypotheses, HF ``generate`` semantics
    (``raymt.workers.search.selection``). ``candidates`` (C,): a shortlist of target ids; ``runner``: the
    decoder's long-lived state to reuse (``workers/decoder/runner.py``), else a fresh one."""
    sources = [row[:n] for row, n in zip(src_ids.tolist(), src_mask.sum(1).tolist())]
    engine = Engine(model, cfg, batch_schedule(len(sources)), forced_eos=forced_eos,
                    candidates=candidates, stats=stats, runner=runner)
    return engine.decode(sources)


def greedy_search(model, src_ids: Tensor, src_mask: Tensor, cfg: SearchConfig, **kwargs) -> list[list[Hypothesis]]:
    """Argmax decoding: beam search of width 1 on the same engine."""
    return beam_search(model, src_ids, src_mask, replace(cfg, beam_size=1, num_hypotheses=1), **kwargs)


def translate_ids(decoder: CoreDecoder, sources: list[list[int]], cfg: SearchConfig,
                  shortlist: AnyShortlist | None = None,
                  batching: SchedulerConfig | None = None) -> list[list[Hypothesis]]:
    """``decoder.decode_ids``' hypotheses alone."""
    return decoder.decode_ids(sources, DecodeRequest(cfg, shortlist, batching)).hypotheses
