"""The dataclasses that cross actor boundaries survive the trip through Arrow unchanged."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from raymt.pipeline.outputs.records import EncodedUnit, JobSummary, UnitMarker
from raymt.pipeline.orchestration.units import WorkUnit


def test_encoded_unit_round_trips_through_an_arrow_block() -> None:
    unit = WorkUnit("00001-0000000040", "/in/b.parquet", 40, 43, 140, None)
    enc = EncodedUnit(unit, ["140", None, "x"], [140, 141, 142], ["Ein Hund.", None, "Zwei."], None,
                      ["ok", "null", "split"], ["", "", "split into 2 sentences"], [[5, 6, 0], [7, 0], [8, 0]],
                      [0, 2, 2], 0.01)
    block = pa.Table.from_pylist([{**enc.to_row(), "error": None}])  # as the encoder hands it to Ray Data
    back = EncodedUnit.from_row(block.to_pylist()[0])
    assert back == enc and back.source_tokens == 7


def test_unit_stats_hold_typed_fields_and_serialise_only_at_the_arrow_boundary() -> None:
    from raymt.pipeline.outputs.records import UnitStats
    from raymt.pipeline.reports.timeline import Slice
    stats = UnitStats(unit="u0", actor="h:1", node="n", started=1.0, finished=2.0, wait_s=0.0, encode_s=0.1,
                      decode_s=0.5, sentences=3, pieces=3, source_tokens=20, target_tokens=22, steps=9, row_steps=25,
                      occupancy=0.9, refills=1, batch_size=32, pruned_fraction=0.0, shortlist_size=0.0,
                      statuses={"ok": 2, "empty": 1}, batch_histogram={3: 5, 1: 4}, bleu_stats=None, chrf_stats=None,
                      slices=(Slice(1.0, 1.5, 4, 10, 1, 0.8), Slice(1.5, 2.0, 5, 12, 0, 0.7)))
    row = pa.Table.from_pylist([stats.to_row()]).to_pylist()[0]  # as the _stats/ Parquet holds it
    assert isinstance(row["statuses"], str) and json.loads(row["batch_histogram"]) == {"1": 4, "3": 5}
    assert json.loads(row["slices"])[0]["tokens_per_s"] == 20.0  # the reports' format is unchanged
    assert UnitStats.from_row(row) == stats


@pytest.mark.parametrize("data, expected", [
    # the previous version's marker
    ('{"unit": "u0", "rows": 4, "actor": "h:1", "signature": "s", "statuses": {"ok": 3, "empty": 1}, "plan": "ab"}',
     UnitMarker("u0", 4, {"ok": 3, "empty": 1}, "h:1", "s", "ab")),
    # an older one (no statuses), and one from the driver for an unreadable unit with a key this version lacks
    ('{"unit": "u1", "rows": 2, "actor": "h:2", "signature": "s", "plan": "ab"}', UnitMarker("u1", 2, {}, "h:2", "s", "ab")),
    ('{"unit": "u2", "actor": "driver", "unreadable": "bad", "signature": "s", "rows": 1, "statuses": {}, "plan": "",'
     ' "later": 1}', UnitMarker("u2", 1, {}, "driver", "s", "", "bad")),
])
def test_markers_of_earlier_versions_are_read(data: str, expected: UnitMarker) -> None:
    assert UnitMarker.from_json(data.encode()) == expected
    assert UnitMarker.from_json(expected.to_json()) == expected


def test_the_job_summary_round_trips_and_reads_the_previous_format() -> None:
    old = {"units": 2, "rows": 12, "skipped_units": 1, "skipped_files": [["/in/x.parquet", "corrupt"]],
           "unreadable_units": {}, "rows_by_status": {"ok": 12}, "signature": "s", "plan": "ab",
           "lease_generation": 3, "scores": None}
    summary = JobSummary.from_json(json.dumps(old, indent=1).encode())
    assert summary.skipped_files == (("/in/x.parquet", "corrupt"),) and summary.lease_generation == 3
    assert json.loads(summary.to_json()) == old  # the file's format is unchanged
    assert JobSummary.from_json(summary.to_json()) == summary


def test_a_progress_snapshot_round_trips_and_moves_the_progress_line_inside_a_unit() -> None:
    import time

    from raymt.pipeline.reports.timeline import Board, Progress, Snapshot
    snap = Snapshot(time=time.time(), tokens=500, tokens_per_s=250.0, unit="u0", unit_rows=100,
                    unit_source_tokens=1000, unit_tokens=500)
    assert Snapshot.from_json(snap.to_json()) == snap
    board = Board()
    board.report("a", snap)
    assert board.read()["a"].received is not None and board.read()["a"].unit == "u0"
    progress = Progress(rows_total=200, slice_s=2.0)
    progress.report("a", board.read()["a"])
    assert "rows ~50/200" in progress.line(10.0, 2) and "decoding 250 tokens/s" in progress.line(10.0, 2)
