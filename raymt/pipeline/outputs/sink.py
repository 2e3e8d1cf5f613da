"""Output on any fsspec URL, committed per work unit: exactly once, resumable.

Layout under the output directory (``<plan>``: the first 8 hex digits of the plan record's digest)::

    part-<unit>-<plan>.parquet     translations of one unit (written first)
    _manifest/<unit>-<plan>.json   the commit marker, written only after its part is complete
    _stats/<unit>-<plan>.parquet   the decoder actor's stats row(s) for that unit
    _SUCCESS                   the job summary, once every unit is committed

    _ASSEMBLED.json            the single file assembled from the parts (path, size, content), if any
    _PLAN.json                 what the units were cut from and how they are decoded (pipeline/outputs/ledger.py)
    _LEASE.json                the job writing the output, while it runs (pipeline/outputs/lease.py)
    _LEASE.lock                its lock on local disk, naming its holder (pipeline/outputs/disklock.py)

A unit's files carry its plan, so a unit of one plan can never be taken for the same-named unit of
another (other unit sizes, input, model or search): a store counts only its own plan's markers, even
if a killed job's actor commits late into an output that was restarted. A unit counts only when
its marker exists. Part names are fixed by the unit, so a unit retried
after a crash (actor killed mid-write, driver killed, node lost) replaces its own part and never
adds a second copy; readers take only parts that have a marker. Nothing is rewritten in place:
every file (part, stats, marker) is a single PUT on object stores, which a reader sees whole or
not at all, and on local disk a write to a temporary name then an atomic rename, so a reader never
sees a half-written or empty part. Every part is cast to ``OUTPUT_SCHEMA`` (its extra columns,
e.g. distillation's, kept after them), so parts from different files always concatenate.

A job deletes only files these records name (``clear`` for ``--restart``, ``prune``): a file
merely named like a part, or any other file of the user's, is kept.
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import IO, Iterator

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from raymt.pipeline.errors import stop_for
from raymt.pipeline.formats import OutputFormat, output_format
from raymt.pipeline.outputs.lease import LEASE, LOCK, Fence
from raymt.pipeline.outputs.ledger import ASSEMBLED, PLAN, PlanRecord, assembled_record
from raymt.pipeline.outputs.records import JobSummary, UnitMarker
from raymt.pipeline.storage import on_disk, open_whole, put_whole, retrying, storage_options
from raymt.pipeline.writers import lines_of, part_columns

OUTPUT_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("row", pa.int64()),
    ("source", pa.string()),
    ("translation", pa.string()),
    ("score", pa.float32()),
    ("nbest", pa.list_(pa.struct([("text", pa.string()), ("score", pa.float32())]))),
    ("status", pa.string()),
    ("reason", pa.string()),
    ("signature", pa.string()),
])
logger = logging.getLogger(__name__)


class OutputStore:
    """The committed units of one plan under ``url`` (``plan``: its digest; None: the recorded plan's).

    Given the job's ``fence`` (``pipeline/outputs/lease.py``), every write and deletion is made only while
    the job holds the output's lease; one that no longer does raises ``LeaseLost`` and writes nothing.
    A transient storage error is retried with back-off; no space or no permission stops the job
    (``StorageFull``) without a retry."""

    def __init__(self, url: str, plan: str | None = None, fence: Fence | None = None) -> None:
        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **storage_options(self.url))
        self._plan = plan
        self.fence = fence

    def guard(self):
        """The context every write's last step and every deletion runs in (the fence, if any)."""
        return self.fence.guard(self.fs) if self.fence is not None else contextlib.nullcontext()

    def _rm_all(self, paths: list[str], batch: int = 1000) -> None:
        """Delete ``paths`` (files), ``batch`` at a time (one request on object stores), each batch under the fence."""
        for i in range(0, len(paths), batch):
            with self.guard():
                self.fs.rm(paths[i:i + batch])

    @property
    def tag(self) -> str:
        if self._plan is None:
            recorded = self.read_plan()
            self._plan = recorded.digest if recorded else ""
        return f"-{self._plan[:8]}" if self._plan else ""

    def _path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def committed(self) -> set[str]:
        """Names of the committed units of this plan."""
        folder = self._path("_manifest")
        self.fs.invalidate_cache(folder)  # object-store listings are cached: other processes commit here
        if not self.fs.exists(folder):
            return set()
        end = f"{self.tag}.json"
        return {p.rsplit("/", 1)[-1][: -len(end)] for p in self.fs.ls(folder, detail=False) if p.endswith(end)}

    def commit(self, unit: str, table: pa.Table, stats: pa.Table | None, marker: UnitMarker | Mapping) -> None:
        """Write the unit's part (and stats), then its marker; idempotent for a retried unit. The
        marker's rows, statuses and plan are the part's and this store's (a mapping: its fields)."""
        table = conform(table)
        self._put(self._path(f"part-{unit}{self.tag}.parquet"), _parquet(table))
        if stats is not None:
            self._put(self._path("_stats", f"{unit}{self.tag}.parquet"), _parquet(stats))
        if not isinstance(marker, UnitMarker):
            marker = UnitMarker(**{"unit": unit, **marker})
        statuses = dict(Counter(table.column("status").to_pylist()))  # ok, empty, split, ...: summed at the end
        marker = replace(marker, rows=table.num_rows, statuses=statuses, plan=self._plan or "")
        self._put(self._path("_manifest", f"{unit}{self.tag}.json"), marker.to_json())

    def prune(self) -> int:
        """Remove the markers of other plans (a killed job's late commits) and the part and stats each
        names; how many files. A part or stats file no marker names is left: it is never counted."""
        stems = [s for s in self._marker_stems() if not self.tag or not s.endswith(self.tag)]
        if not stems:
            return 0
        names = {"": {f"part-{s}.parquet" for s in stems}, "_stats": {f"{s}.parquet" for s in stems},
                 "_manifest": {f"{s}.json" for s in stems}}
        gone = [p for folder, own in names.items() for p in self._listed(folder) if p.rsplit("/", 1)[-1] in own]
        self._rm_all(sorted(gone, key=lambda p: "/_manifest/" not in p))  # markers first: a unit stops counting
        return len(gone)

    def _listed(self, folder: str) -> list[str]:
        """Paths of the entries of ``folder`` under the output ("": the output itself), fresh."""
        path = self._path(folder) if folder else self.root
        self.fs.invalidate_cache(path)
        return self.fs.ls(path, detail=False) if self.fs.exists(path) else []

    def _marker_stems(self) -> list[str]:
        """Names (less ``.json``) of every marker in ``_manifest/``, of any plan: ``<unit><plan tag>``."""
        return [p.rsplit("/", 1)[-1][:-5] for p in self._listed("_manifest") if p.endswith(".json")]

    def _put(self, path: str, data: bytes) -> None:
        try:
            retrying(lambda: put_whole(self.fs, path, data, self.guard), f"writing {path}")
        except OSError as e:
            if stop := stop_for(e, f"writing {path}"):
                raise stop from None
            raise

    def read_plan(self) -> PlanRecord | None:
        try:
            return PlanRecord.from_json(self.fs.cat_file(self._path(PLAN)))
        except (FileNotFoundError, NotADirectoryError):  # (a file where the output's folder would be: refused later)
            return None

    def write_plan(self, plan: PlanRecord) -> None:
        self._put(self._path(PLAN), plan.to_json())

    def has_output(self) -> bool:
        """Whether anything of a job is here already (a marker, a part, a plan or a success marker); a
        file named like a part counts, so an output nobody recorded is refused, never taken over."""
        if not self.fs.exists(self.root):
            return False
        names = [p.rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        return any(n in (PLAN, "_SUCCESS", "_manifest") or n.startswith("part-") for n in names)

    def clear(self) -> list[str]:
        """Remove the files this output's own records name, nothing else (``--restart``); return the
        paths of the files left (a user's notes, a part no record names), and log them.

        Named are: ``_SUCCESS``; every marker in ``_manifest/`` and the part, stats file and distilled
        part it names; parts and stats files carrying the recorded plan's digest (or this store's), a
        unit's files written before its marker; ``distilled/_SUMMARY.json``; ``_PLAN.json`` (last);
        and the temporary files of interrupted writes of those. The lease files stay."""
        recorded = self.read_plan()
        tags = tuple(f"-{d[:8]}" for d in {recorded.digest if recorded else "", self._plan or ""} if d)
        tagged = tuple(f"{t}.parquet" for t in tags)
        stems = set(self._marker_stems())
        named = {f"{s}.parquet" for s in stems}
        distilled = {f"part-{_unit_of(s, tags)}.parquet" for s in stems} | {"_SUMMARY.json"}
        folders = {"": lambda n: n in (PLAN, "_SUCCESS", ASSEMBLED) or n[5:] in named and n.startswith("part-")
                   or n.startswith("part-") and n.endswith(tagged) or bool(_PROBE.match(n)),
                   "_manifest": lambda n: n.endswith(".json"),
                   "_stats": lambda n: n in named or n.endswith(tagged),
                   "distilled": lambda n: n in distilled}
        ours, left = [], []
        for folder, own in folders.items():
            for p in self._listed(folder):
                name = p.rsplit("/", 1)[-1]
                if own(name) or (tmp := _TMP.match(name)) is not None and own(tmp["name"]):
                    ours.append(p)
                elif not (folder == "" and (name in folders or name.startswith(LOCK) or name == LEASE)):
                    left.append(p)
        self._rm_all(sorted(ours, key=_deletion_order))
        self._rmdir_empty([self._path(f) for f in folders if f])
        if left:
            names = sorted(p[len(self.root.rstrip("/")) + 1:] for p in left)
            logger.warning("kept %d file(s) in %s that no record of this output names (not written by raymt, or by "
                           "a job whose plan is no longer recorded): %s", len(left), self.url,
                           ", ".join(names[:10]) + (" ..." if len(names) > 10 else ""))
        return left

    def _rmdir_empty(self, folders: list[str]) -> None:
        """Remove the folders left empty (local disk; an object store has no folders)."""
        if not on_disk(self.fs):
            return
        for path in folders:
            if self.fs.isdir(path) and not self.fs.ls(path, detail=False):
                with self.guard():
                    self.fs.rmdir(path)

    def markers(self) -> list[UnitMarker]:
        """The committed units' markers, by unit name (markers of earlier versions read too)."""
        return [UnitMarker.from_json(data) for data in self._cat([self._path("_manifest", f"{u}{self.tag}.json")
                                                                  for u in sorted(self.committed())])]

    def _cat(self, paths: list[str], batch: int = 1000) -> Iterator[bytes]:
        """The files' bytes, in order; fetched ``batch`` at a time, concurrently on object stores (one
        GET after another, at ~20 ms each, takes minutes for the markers of 10^4 units)."""
        for i in range(0, len(paths), batch):
            got = self.fs.cat(paths[i:i + batch], on_error="raise")
            yield from (got[p] for p in paths[i:i + batch])  # keyed by the paths given (root-relative)

    def read(self) -> pa.Table:
        """Every committed row, in input order (sorted by ``row``): the whole output in memory."""
        parts = list(self.parts())
        return pa.concat_tables(parts, promote_options="default") if parts else OUTPUT_SCHEMA.empty_table()

    def parts(self, columns: list[str] | None = None) -> Iterator[pa.Table]:
        """The committed parts in input order (units by name, each sorted by ``row``): the output a
        part at a time, never whole."""
        for unit in sorted(self.committed()):
            yield self._read(self._path(f"part-{unit}{self.tag}.parquet"), columns).sort_by("row")

    def schema(self) -> pa.Schema:
        """The output's columns: every committed part's, unified (read from the parts' footers)."""
        schemas = []
        for unit in sorted(self.committed()):
            with self.fs.open(self._path(f"part-{unit}{self.tag}.parquet"), "rb") as f:
                schemas.append(pq.ParquetFile(f).schema_arrow)
        return pa.unify_schemas(schemas) if schemas else OUTPUT_SCHEMA

    def read_part(self, unit: str) -> pa.Table:
        return self._read(self._path(f"part-{unit}{self.tag}.parquet"))

    def write_table(self, name: str, table: pa.Table) -> None:
        """A derived file under the output (e.g. ``distilled/part-<unit>.parquet``)."""
        self._put(self._path(name), _parquet(table))

    def write_bytes(self, name: str, data: bytes) -> None:
        self._put(self._path(name), data)

    def read_stats(self) -> pa.Table | None:
        folder = self._path("_stats")
        names = {f"{u}{self.tag}.parquet" for u in self.committed()}
        if not self.fs.exists(folder):
            return None
        paths = [p for p in sorted(self.fs.ls(folder, detail=False)) if p.rsplit("/", 1)[-1] in names]
        parts = [pq.read_table(pa.BufferReader(data)) for data in self._cat(paths)]
        return pa.concat_tables(parts, promote_options="default") if parts else None

    def _read(self, path: str, columns: list[str] | None = None) -> pa.Table:
        with self.fs.open(path, "rb") as f:
            return pq.read_table(f, columns=columns)

    def write_success(self, summary: JobSummary) -> None:
        self._put(self._path("_SUCCESS"), summary.to_json())

    def read_success(self) -> JobSummary | None:
        """The job's summary once it has completed (``_SUCCESS``), else None."""
        path = self._path("_SUCCESS")
        self.fs.invalidate_cache(path)
        return JobSummary.from_json(self.fs.cat_file(path)) if self.fs.exists(path) else None


_TMP = re.compile(r"^(?P<name>.+)\.[0-9a-f]{32}\.tmp$")  # a temporary name of put_whole / open_whole
_PROBE = re.compile(r"^_WRITABLE-[0-9a-f]{32}\.tmp$")  # the writability probe of pipeline/outputs/guards.py


def _unit_of(stem: str, tags: tuple[str, ...]) -> str:
    """The unit a marker names (its name less ``.json``, less its plan digest: recorded, or any)."""
    for tag in tags:
        if stem.endswith(tag):
            return stem[:-len(tag)]
    return re.sub(r"-[0-9a-f]{8}$", "", stem)


def _deletion_order(path: str) -> int:
    """``_SUCCESS`` first (the output is no longer whole), then the markers (units stop counting),
    then the files they name, the plan record last."""
    name = path.rsplit("/", 1)[-1]
    return 0 if name == "_SUCCESS" else 1 if "/_manifest/" in path else 3 if name == PLAN else 2


def output_table(ids: list[str | None], rows: list[int], sources: list, translations: list[str], scores: list[float],
                 nbest: list[list[dict]] | pa.Array, statuses: list[str], reasons: list[str], signature: str) -> pa.Table:
    """The rows of one part in ``OUTPUT_SCHEMA`` (every part is built here: decoded or unreadable)."""
    n = len(rows)
    if not isinstance(nbest, pa.Array):
        nbest = pa.array(nbest, OUTPUT_SCHEMA.field("nbest").type)
    return pa.table({"id": pa.array(ids, pa.string()),
                     "row": pa.array(rows, pa.int64()), "source": pa.array(sources, pa.string()),
                     "translation": pa.array(translations, pa.string()), "score": pa.array(scores, pa.float32()),
                     "nbest": nbest,
                     "status": pa.array(statuses, pa.string()), "reason": pa.array(reasons, pa.string()),
                     "signature": pa.array([signature] * n, pa.string())}, schema=OUTPUT_SCHEMA)


def conform(table: pa.Table) -> pa.Table:
    """``table`` with the OUTPUT_SCHEMA columns first, each cast to its type (ids as strings), extras after."""
    if pa.schema(list(table.schema)[:len(OUTPUT_SCHEMA)]).equals(OUTPUT_SCHEMA):
        return table  # built by output_table (extra columns appended after): nothing to cast
    missing = [f.name for f in OUTPUT_SCHEMA if f.name not in table.column_names]
    if missing:
        raise ValueError(f"output part lacks columns {missing}")
    columns = [table.column(f.name).cast(f.type) for f in OUTPUT_SCHEMA]
    extra = [n for n in table.column_names if n not in OUTPUT_SCHEMA.names]
    return pa.table(columns + [table.column(n) for n in extra],
                    schema=pa.schema(list(OUTPUT_SCHEMA) + [table.schema.field(n) for n in extra]))


def _parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def assemble(store: OutputStore, url: str, fmt: OutputFormat | None = None) -> None:
    """One file from the committed parts, a part at a time (an output of 10^8 rows never sits in
    memory), written whole or not at all, in ``fmt`` (by default the one ``url``'s name says,
    ``pipeline/formats.py``): ``.parquet`` (every column), else lines in input order -- text (a
    translation a line, or Marian's n-best lines), JSON lines or TSV (``pipeline/writers.py``),
    compressed as the name says. Its rename (or upload) into place passes the store's fence; no
    space left stops the job (``StorageFull``) with nothing partial left, and a rerun assembles."""
    fmt = fmt or output_format(url)
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    try:
        with open_whole(fs, path, store.guard) as f:
            if fmt.kind == "parquet":
                schema = store.schema()
                with pq.ParquetWriter(f, schema) as writer:
                    for part in store.parts():
                        writer.write_table(_widened(part, schema))
            else:
                with compressed_writer(f, fmt.compression) as out:
                    for part in store.parts(part_columns(fmt)):
                        out.write(lines_of(part, fmt).encode())
    except OSError as e:
        if stop := stop_for(e, f"assembling {url}"):
            raise stop from None
        raise
    # what is there now is raymt's: a rerun may replace it (``guards.check_owned``)
    store.write_bytes(ASSEMBLED, json.dumps(assembled_record(url), sort_keys=True).encode())


@contextlib.contextmanager
def compressed_writer(raw: IO[bytes], compression: str | None) -> Iterator[IO[bytes]]:
    """``raw`` itself, or a compressor writing into it (closed at the end, ``raw`` left open)."""
    if compression is None:
        yield raw
        return
    if compression == "zstd":
        import zstandard
        writer = zstandard.ZstdCompressor().stream_writer(raw, closefd=False)
    else:
        import bz2
        import gzip
        import lzma
        writer = {"gzip": lambda: gzip.GzipFile(fileobj=raw, mode="wb", mtime=0),
                  "bz2": lambda: bz2.BZ2File(raw, "wb"), "xz": lambda: lzma.LZMAFile(raw, "wb")}[compression]()
    with writer:
        yield writer


def _widened(part: pa.Table, schema: pa.Schema) -> pa.Table:
    """``part`` in ``schema``'s column order and types; a column it lacks (e.g. an unreadable unit's
    extras) is null."""
    return pa.table([part.column(f.name).cast(f.type) if f.name in part.column_names else pa.nulls(len(part), f.type)
                     for f in schema], schema=schema)
