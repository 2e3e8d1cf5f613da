"""Ray metrics of a decoder actor (Prometheus through Ray's metrics agent; Grafana, the dashboard).

Exported names (Ray prefixes ``ray_``; counters get ``_total``), all tagged ``actor``:

    live, every time slice (a few seconds, inside a unit too):
      ray_raymt_decoded_tokens_total   target tokens decoded (every live sentence's step: one token)
      ray_raymt_tokens_per_second      decoded tokens per second over the last slice
      ray_raymt_batch_occupancy        live sentences per step / batch capacity, last slice
      ray_raymt_refills_total          streaming refills (VAR-STREAM / top-up)
    per committed unit:
      ray_raymt_sentences_total        rows translated
      ray_raymt_target_tokens_total    tokens of the output translations
      ray_raymt_wait_seconds_total     time the actor waited for its next unit
      ray_raymt_pruned_fraction        share of candidates pruned, last unit
      ray_raymt_shortlist_size         mean shortlist size, last unit
"""
from __future__ import annotations

from raymt.pipeline.outputs.records import UnitStats
from raymt.pipeline.reports.timeline import Slice


class Metrics:
    def __init__(self) -> None:
        from ray.util import metrics
        keys = ("actor",)
        self.decoded = metrics.Counter("raymt_decoded_tokens", "target tokens decoded, live", tag_keys=keys)
        self.speed = metrics.Gauge("raymt_tokens_per_second", "decoded tokens per second, last slice", tag_keys=keys)
        self.occupancy = metrics.Gauge("raymt_batch_occupancy", "live sentences per step / capacity, last slice",
                                       tag_keys=keys)
        self.refills = metrics.Counter("raymt_refills", "streaming refills", tag_keys=keys)
        self.sentences = metrics.Counter("raymt_sentences", "rows translated", tag_keys=keys)
        self.tokens = metrics.Counter("raymt_target_tokens", "target tokens of the translations", tag_keys=keys)
        self.wait = metrics.Counter("raymt_wait_seconds", "seconds waiting for input", tag_keys=keys)
        self.pruned = metrics.Gauge("raymt_pruned_fraction", "pruned share of candidates, last unit", tag_keys=keys)
        self.shortlist = metrics.Gauge("raymt_shortlist_size", "mean shortlist size, last unit", tag_keys=keys)

    def record_slice(self, actor: str, s: Slice) -> None:
        tags = {"actor": actor}
        if s.tokens:
            self.decoded.inc(s.tokens, tags)
        if s.refills:
            self.refills.inc(s.refills, tags)
        self.speed.set(s.tokens_per_s, tags)
        self.occupancy.set(s.occupancy, tags)

    def record_unit(self, stats: UnitStats) -> None:
        tags = {"actor": stats.actor}
        if stats.target_tokens:
            self.tokens.inc(stats.target_tokens, tags)
        if stats.sentences:
            self.sentences.inc(stats.sentences, tags)
        self.wait.inc(max(stats.wait_s, 0.0), tags)
        self.pruned.set(stats.pruned_fraction, tags)
        self.shortlist.set(stats.shortlist_size, tags)
