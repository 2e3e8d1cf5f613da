"""What crosses actor boundaries or lands on disk, as frozen dataclasses: the encoded unit (encoder
-> decoder), a unit's stats (decoder -> driver -> ``_stats/`` Parquet -> reports), a unit's commit
marker (``_manifest/<unit>-<plan>.json``) and the job's summary (``_SUCCESS``).

An ``EncodedUnit`` travels through Ray Data as one Arrow row (``to_row`` / ``from_row``: the work
unit and the ids as JSON, so an id column of any type and a unit of any shape fit one schema).
``UnitStats`` holds typed fields; it is serialised only at the Arrow boundary (``to_row``: its
mappings and slices as JSON text, one Parquet row; ``from_row`` reads one back). Markers and the
summary are JSON files (``to_json`` / ``from_json``); ``from_json`` reads what earlier versions
wrote too: a field they lacked takes its default, a key it does not know is ignored.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from raymt.pipeline.reports.timeline import Slice
from raymt.pipeline.inputs.workunit import WorkUnit


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
    target_langs: list | None = None  # per row: its target language (M2M100 / NLLB column), None: the job's
    piece_space: list[str] | None = None  # the source's whitespace after each piece (None: a space; workers/text/rows.py)

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
    statuses: dict[str, int]  # rows per status (ok, empty, split, ...)
    batch_histogram: dict[int, int]  # steps per actual batch size
    bleu_stats: list | None
    chrf_stats: list | None
    slices: tuple[Slice, ...]  # the unit's time slices (pipeline/reports/timeline.py)
    kernels: str = ""  # the decoder's step kernels (workers/kernels/native.py decoder_kernels); "": not recorded

    def to_row(self) -> dict:
        """One Parquet row: the mappings and slices as JSON text (the ``_stats/`` files' format)."""
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**row, "statuses": json.dumps(self.statuses),
                "batch_histogram": json.dumps(dict(sorted(self.batch_histogram.items()))),
                "slices": json.dumps([s.to_dict() for s in self.slices])}

    @classmethod
    def from_row(cls, row: dict) -> UnitStats:
        values = {f.name: row.get(f.name) for f in fields(cls)}
        slices = tuple(Slice(**{k: v for k, v in s.items() if k != "tokens_per_s"})
                       for s in json.loads(row.get("slices") or "[]"))
        return cls(**{**values, "statuses": json.loads(row.get("statuses") or "{}"),
                      "batch_histogram": {int(k): v for k, v in json.loads(row.get("batch_histogram") or "{}").items()},
                      "slices": slices, "kernels": row.get("kernels") or ""})


def _known(cls: type, data: bytes | str) -> dict:
    """A JSON object's keys that are ``cls``'s fields (an earlier or later version's extras dropped)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in json.loads(data).items() if k in names}


@dataclass(frozen=True, slots=True)
class UnitMarker:
    """A unit's commit marker, ``_manifest/<unit>-<plan>.json``: written only after its part (and
    stats) are complete, so a unit with a marker is committed; a rerun skips it."""

    unit: str
    rows: int = 0  # rows in its part
    statuses: dict[str, int] = field(default_factory=dict)  # its rows per status (summed into _SUCCESS)
    actor: str = ""  # host:pid of the decoder that committed it ("driver": an unreadable unit written as such)
    signature: str = ""
    plan: str = ""  # the plan digest (pipeline/outputs/ledger.py) it was decoded under
    unreadable: str | None = None  # why its rows could not be read (--skip-corrupt)

    def to_json(self) -> bytes:
        d = asdict(self)
        if d["unreadable"] is None:
            del d["unreadable"]
        return json.dumps(d).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> UnitMarker:
        return cls(**_known(cls, data))


@dataclass(frozen=True, slots=True)
class JobSummary:
    """The output's ``_SUCCESS``: written once every planned row is in a committed part."""

    units: int
    rows: int
    skipped_units: int = 0  # committed by an earlier run (resumed)
    skipped_files: tuple[tuple[str, str], ...] = ()  # (path, reason) of corrupt input files skipped
    unreadable_units: dict[str, str] = field(default_factory=dict)  # unit -> why its rows were unreadable
    rows_by_status: dict[str, int] = field(default_factory=dict)
    signature: str = ""
    plan: str = ""
    lease_generation: int | None = None
    scores: str | None = None  # BLEU and chrF with their signatures (--evaluate)

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "skipped_files": [list(x) for x in self.skipped_files]}, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> JobSummary:
        d = _known(cls, data)
        return cls(**{**d, "skipped_files": tuple(tuple(x) for x in d.get("skipped_files", ()))})
