"""Output on any fsspec URL, committed per work unit: exactly once, resumable.

Layout under the output directory::

    part-<unit>.parquet        translations of one unit (written first)
    _manifest/<unit>.json      the commit marker, written only after its part is complete
    _stats/<unit>.parquet      the decoder actor's stats row(s) for that unit
    _SUCCESS                   the job summary, once every unit is committed

A unit counts only when its marker exists. Part names are fixed by the unit, so a unit retried
after a crash (actor killed mid-write, driver killed, node lost) overwrites its own part and never
adds a second copy; readers take only parts that have a marker. A marker is a single small PUT on
object stores and a write-then-rename on local disk, so a reader never sees half of one.
"""
from __future__ import annotations

import json
import uuid

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.storage import storage_options

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


class OutputStore:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **storage_options(self.url))

    def _path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def committed(self) -> set[str]:
        """Names of the committed units."""
        folder = self._path("_manifest")
        if not self.fs.exists(folder):
            return set()
        return {p.rsplit("/", 1)[-1][: -len(".json")] for p in self.fs.ls(folder, detail=False) if p.endswith(".json")}

    def commit(self, unit: str, table: pa.Table, stats: pa.Table | None, manifest: dict) -> None:
        """Write the unit's part (and stats), then its marker; idempotent for a retried unit."""
        self.fs.makedirs(self._path("_manifest"), exist_ok=True)
        with self.fs.open(self._path(f"part-{unit}.parquet"), "wb") as f:
            pq.write_table(table, f)
        if stats is not None:
            self.fs.makedirs(self._path("_stats"), exist_ok=True)
            with self.fs.open(self._path("_stats", f"{unit}.parquet"), "wb") as f:
                pq.write_table(stats, f)
        self._put(self._path("_manifest", f"{unit}.json"), json.dumps(manifest).encode())

    def _put(self, path: str, data: bytes) -> None:
        if "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)):
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            with self.fs.open(tmp, "wb") as f:
                f.write(data)
            self.fs.mv(tmp, path)
        else:
            with self.fs.open(path, "wb") as f:
                f.write(data)

    def manifests(self) -> list[dict]:
        return [json.loads(self.fs.cat_file(self._path("_manifest", f"{u}.json"))) for u in sorted(self.committed())]

    def read(self) -> pa.Table:
        """Every committed row, in input order (sorted by ``row``)."""
        parts = [self.read_part(u) for u in sorted(self.committed())]
        table = pa.concat_tables(parts, promote_options="default") if parts else OUTPUT_SCHEMA.empty_table()
        return table.sort_by("row")

    def read_part(self, unit: str) -> pa.Table:
        return self._read(self._path(f"part-{unit}.parquet"))

    def write_table(self, name: str, table: pa.Table) -> None:
        """A derived file under the output (e.g. ``distilled/part-<unit>.parquet``)."""
        path = self._path(name)
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(path, "wb") as f:
            pq.write_table(table, f)

    def write_bytes(self, name: str, data: bytes) -> None:
        self.fs.makedirs(self._path(name).rsplit("/", 1)[0], exist_ok=True)
        self._put(self._path(name), data)

    def read_stats(self) -> pa.Table | None:
        folder = self._path("_stats")
        names = {f"{u}.parquet" for u in self.committed()}
        if not self.fs.exists(folder):
            return None
        parts = [self._read(p) for p in sorted(self.fs.ls(folder, detail=False)) if p.rsplit("/", 1)[-1] in names]
        return pa.concat_tables(parts, promote_options="default") if parts else None

    def _read(self, path: str) -> pa.Table:
        with self.fs.open(path, "rb") as f:
            return pq.read_table(f)

    def write_success(self, summary: dict) -> None:
        self._put(self._path("_SUCCESS"), json.dumps(summary, indent=1).encode())
