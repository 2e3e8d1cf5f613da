"""The per-phase time breakdown of a decoding run (benchmarks.bench --profile)."""
from __future__ import annotations

from benchmarks.step_profile import LABELS, PHASES, step_breakdown
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
from raymt.workers.decoder.core_decoder import CoreDecoder
from tests.pipeline.ray_helpers import clean_corpus


def test_breakdown_covers_the_run_by_phase(demo_model_dir) -> None:
    translator = CoreDecoder.load(str(demo_model_dir))
    texts, cfg = clean_corpus(12), SearchConfig(beam_size=3)
    rows = step_breakdown(lambda lines: translator.translate(lines, cfg), texts)
    by = {r["phase"]: r for r in rows}
    assert [r["phase"] for r in rows] == [LABELS.get(p, p) for p in PHASES] + [LABELS["other"]]
    assert 0.97 <= sum(r["share"] for r in rows) <= 1.03  # disjoint phases cover the wall time
    for name in ("decoder layers", "output layer", "encoder", LABELS["search loop"]):
        assert by[name]["share"] > 0 and 0 <= by[name]["in_operators"] <= by[name]["share"] + 1e-3
    assert by["decoder layers"]["share"] > by["encoder"]["share"]
    reorder = by["cache reorder"]["share"]  # on the CPU the native beam step reorders inside "search"
    assert reorder == 0 if translator.checkpoint.model.ops.beam_kernel else reorder > 0


def test_breakdown_of_the_streaming_decoder(demo_model_dir) -> None:
    translator = CoreDecoder.load(str(demo_model_dir))
    batching = SchedulerConfig(policy=Policy.VAR_STREAM, max_batch_sentences=4, capacity=4)
    rows = step_breakdown(lambda lines: translator.translate(lines, SearchConfig(beam_size=3), batching=batching),
                          clean_corpus(12))
    by = {r["phase"]: r["share"] for r in rows}
    assert by["decoder layers"] > 0 and by["output layer"] > 0 and by["encoder"] > 0
    assert by[LABELS["search loop"]] > 0  # one decoder: every policy runs the same beam step (and its reorder)
    assert (by["cache reorder"] == 0) == (translator.checkpoint.model.ops.beam_kernel is not None)
