"""The dataclasses that cross actor boundaries survive the trip through Arrow unchanged."""
from __future__ import annotations

import pyarrow as pa

from raymt.pipeline.records import EncodedUnit
from raymt.pipeline.units import WorkUnit


def test_encoded_unit_round_trips_through_an_arrow_block() -> None:
    unit = WorkUnit("00001-0000000040", "/in/b.parquet", 40, 43, 140, None)
    enc = EncodedUnit(unit, ["140", None, "x"], [140, 141, 142], ["Ein Hund.", None, "Zwei."], None,
                      ["ok", "null", "split"], ["", "", "split into 2 sentences"], [[5, 6, 0], [7, 0], [8, 0]],
                      [0, 2, 2], 0.01)
    block = pa.Table.from_pylist([{**enc.to_row(), "error": None}])  # as the encoder hands it to Ray Data
    back = EncodedUnit.from_row(block.to_pylist()[0])
    assert back == enc and back.source_tokens == 7
