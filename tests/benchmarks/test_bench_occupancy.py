"""The occupancy simulation behind the GPU's batching defaults: the real scheduler over decode lengths."""
from __future__ import annotations

from benchmarks.bench_occupancy import Sentence, main, simulate
from tests.conftest import SHARED_DATA, shared_path


def test_one_full_batch_runs_as_long_as_its_longest_sentence():
    sentences = [Sentence(5, 3), Sentence(6, 5), Sentence(4, 2)]
    r = simulate(sentences, unit_rows=0, capacity=4)
    assert (r.steps, r.sentence_steps) == (5, 10)  # live: 3 + 5 + 2 sentence-steps over 5 steps of 4 slots
    assert r.occupancy == 10 / 20


def test_units_drain_and_a_deferred_readback_holds_slots():
    sentences = [Sentence(1, 4)] * 3 + [Sentence(2, 1)] * 3
    one_stream = simulate(sentences, unit_rows=0, capacity=2, refill_threshold=0.5)
    units = simulate(sentences, unit_rows=3, capacity=2, refill_threshold=0.5)
    assert units.sentence_steps == one_stream.sentence_steps == 15  # the same work
    assert units.steps > one_stream.steps  # the first unit's lone last sentence runs in a half-empty batch
    deferred = simulate(sentences, unit_rows=0, capacity=2, refill_threshold=0.5, readback_every=4)
    assert deferred.steps > one_stream.steps and deferred.sentence_steps == 15


def test_a_late_readback_frees_each_slot_one_step_later():
    """Two slots, sentences of 3 and 1 steps, readback every step: read at once, the short one's slot
    takes the third sentence at step 2; read a step late, at step 3."""
    sentences = [Sentence(1, 3), Sentence(2, 1), Sentence(3, 3)]
    now = simulate(sentences, unit_rows=0, capacity=2)
    late = simulate(sentences, unit_rows=0, capacity=2, late=True)
    assert now.sentence_steps == late.sentence_steps == 7
    assert (now.steps, late.steps) == (4, 6)  # (late: each end is heard a step after it, the last one's too)


def test_the_report_runs(demo_model_dir, tmp_path):
    shared_path("multi30k", "test_2016_flickr.de")
    out = tmp_path / "occupancy"
    main(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--sets", "multi30k", "--sample", "24",
          "--lines", "120", "--capacities", "8", "--unit-rows", "30,0", "--refill-thresholds", "0.5,0.05",
          "--readbacks", "1,4", "--out", str(out)])
    text = (out.with_suffix(".md")).read_text()
    assert "| 8 | 30 |" in text and "| 8 | one stream |" in text and "steps_vs_one_stream" in text
