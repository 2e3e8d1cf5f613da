"""What crosses actor boundaries, as dataclasses: the encoded unit (encoder -> decoder) and a
unit's stats (decoder -> driver -> ``_stats/`` Parquet -> reports).

An ``EncodedUnit`` travels through Ray Data as one Arrow row (``to_row`` / ``from_row``: the work
unit and the ids as JSON, so an id column of any type and a unit of any shape fit one schema).
``UnitStats`` is stored as one Parquet row (``to_row``); the reports read those rows back as dicts.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from raymt.pipeline.units import WorkUnit


@dataclass(frozen=True, slots=True)
class EncodedUnit:
    unit: WorkUnit
    ids: list[str | None]  # one type per job: the id column as text, or the row number as text
    rows: list[int]  # global row numbers
    sources: list  # str | None per row, as read (invalid UTF-8 replaced)
    references: list[str] | None
    statuses: list[str]  # per row: ok, null, empty, normalised, split
    reasons: list[str]
    pieces: list[list[int]]  # token ids of every piece to translate (a row cut to fit: several)
    piece_row: list[int]  # the row (index into ``rows``) each piece belongs to
    encode_s: float

    @property
    def source_tokens(self) -> int:
        return sum(map(len, self.pieces))

    def to_row(self) -> dict:
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**row, "unit": json.dumps(asdict(self.unit)), "ids": json.dumps(self.ids)}

    @classmethod
    def from_row(cls, row: dict) -> EncodedUnit:
        values = {f.name: row[f.name] for f in fields(cls)}
        return cls(**{**values, "unit": WorkUnit(**json.loads(row["unit"])), "ids": json.loads(row["ids"])})


@dataclass(frozen=True, slots=True)
class UnitStats:
    unit: str
    actor: str
    node: str
    started: float  # wall clock, time.time()
    finished: float
    wait_s: float  # since the actor's previous unit ended
    encode_s: float
    decode_s: float
    sentences: int  # rows of the unit
    pieces: int
    source_tokens: int
    target_tokens: int
    steps: int
    row_steps: int
    occupancy: float  # live sentences per step / batch capacity
    refills: int
    batch_size: int
    pruned_fraction: float
    shortlist_size: float
    statuses: str  # JSON: rows per status
    batch_histogram: str  # JSON: steps per actual batch size
    bleu_stats: list | None
    chrf_stats: list | None
    slices: str  # JSON: the unit's time slices (pipeline/timeline.py)

    def to_row(self) -> dict:
        return asdict(self)
