"""Who may write an output, and what it holds: the job's plan record and the output's lease.

``_PLAN.json`` records, once, what the committed units of an output were cut from and how they
were decoded: every input file (path, size, version: mtime or ETag), the columns, the unit size
and the unit count, the search signature and the model's files. A unit's name
(``<file index>-<first row>``) means the same rows only under the same plan, so a rerun whose plan
differs is refused with what differs (``PlanMismatch``), never mixed; ``--restart`` discards the
output's own files and starts afresh.

``_LEASE.json`` names the job that writes the output (host, pid, Ray job id) and when its claim
expires. The owner renews it from a background thread; a second job finds a live lease and is
refused (``OutputBusy``). A lease is stale once it expires, or at once when its owner ran on this
host and that process is gone (a killed driver's rerun resumes without waiting). Taking a lease is
write-then-verify (a single object PUT on S3, a rename on local disk; read back after a pause),
and every renewal checks the lease is still this job's: a job that lost it stops
(``lease.lost``). It works the same on local disk and on object stores.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import fsspec

from pipeline.storage import put_whole, storage_options

PLAN = "_PLAN.json"
LEASE = "_LEASE.json"
MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "source.spm", "target.spm", "vocab.json",
               "target_vocab.json")


class PlanMismatch(RuntimeError):
    """The output was started by another plan (input, unit size, model or search): resuming would mix them."""


class OutputBusy(RuntimeError):
    """Another live job holds the output's lease."""


def file_version(url: str) -> dict:
    """Path, size and version (mtime, or the object's ETag) of one file; cheap (metadata only)."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    info = fs.info(path)
    version = info.get("ETag") or info.get("mtime") or info.get("LastModified") or info.get("last_modified") or ""
    return {"path": url, "size": int(info.get("size") or 0), "version": str(version)}


def model_files(url: str) -> list[dict]:
    """The versions of a model directory's files (and of a shortlist file when given)."""
    fs, root = fsspec.core.url_to_fs(url, **storage_options(url))
    if not fs.isdir(root):
        return [file_version(url)]
    return [file_version(f"{url.rstrip('/')}/{name}") for name in MODEL_FILES if fs.exists(f"{root.rstrip('/')}/{name}")]


@dataclass(frozen=True, slots=True)
class PlanRecord:
    inputs: tuple[dict, ...]  # file_version of every input file, in plan order
    columns: dict
    unit_rows: int
    units: int
    rows: int
    signature: str
    model: tuple[dict, ...]  # file_version of every model (and shortlist) file

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "digest": self.digest}, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> PlanRecord:
        d = json.loads(data)
        d.pop("digest", None)
        return cls(**{**d, "inputs": tuple(d["inputs"]), "model": tuple(d["model"])})

    def differences(self, earlier: PlanRecord) -> list[str]:
        """What changed since ``earlier``, one line each, in words an operator can act on."""
        out = []
        if self.unit_rows != earlier.unit_rows:
            out.append(f"--unit-rows {earlier.unit_rows} then, {self.unit_rows} now")
        if self.signature != earlier.signature:
            out.append(f"search signature {earlier.signature!r} then, {self.signature!r} now")
        if self.columns != earlier.columns:
            out.append(f"columns {earlier.columns} then, {self.columns} now")
        out += _file_changes("input", earlier.inputs, self.inputs)
        before, after = _folders(earlier.model), _folders(self.model)
        out += [f"model files in {', '.join(before)} then, in {', '.join(after)} now"] if before != after \
            else _file_changes("model file", earlier.model, self.model)
        if not out and (self.units, self.rows) != (earlier.units, earlier.rows):
            out.append(f"{earlier.units} units / {earlier.rows} rows then, {self.units} / {self.rows} now")
        return out


def _folders(files: tuple[dict, ...]) -> list[str]:
    return sorted({f["path"].rsplit("/", 1)[0] for f in files})


def _file_changes(kind: str, old: tuple[dict, ...], new: tuple[dict, ...]) -> list[str]:
    before, after = {f["path"]: f for f in old}, {f["path"]: f for f in new}
    out = [f"{kind} {p} is new" for p in after if p not in before]
    out += [f"{kind} {p} is gone" for p in before if p not in after]
    out += [f"{kind} {p} changed (size {before[p]['size']} -> {after[p]['size']}, version {before[p]['version']} -> "
            f"{after[p]['version']})" for p in after if p in before and before[p] != after[p]]
    if not out and [f["path"] for f in old] != [f["path"] for f in new]:
        out.append(f"{kind} order changed")
    return out


class Lease:
    """This job's claim on an output directory: taken before any write, renewed, released at the end."""

    def __init__(self, fs, root: str, ttl_s: float = 60.0, settle_s: float = 0.3) -> None:
        self.fs, self.path, self.ttl_s, self.settle_s = fs, f"{root.rstrip('/')}/{LEASE}", ttl_s, settle_s
        self.token = uuid.uuid4().hex
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "job": os.environ.get("RAY_JOB_ID", ""),
                      "token": self.token}
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lease or raise ``OutputBusy`` naming the live owner; then renew it every ttl/4 seconds."""
        current = self._read()
        if current and current.get("token") != self.token and not _stale(current):
            raise OutputBusy(_busy(self.path, current))
        self._write()
        time.sleep(self.settle_s)  # a second job that wrote at the same time: the later write wins, both read it
        current = self._read()
        if not current or current.get("token") != self.token:
            raise OutputBusy(_busy(self.path, current or {}))
        self._thread = threading.Thread(target=self._renew, name="raymt-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        current = self._read()
        if current and current.get("token") == self.token:
            self.fs.rm(self.path)

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                current = self._read()
                if current and current.get("token") != self.token:
                    self.lost = _busy(self.path, current)
                    return
                self._write()
            except Exception:  # noqa: BLE001 - a storage hiccup: try again next period, expiry is ttl away
                continue

    def _read(self) -> dict | None:
        try:
            return json.loads(self.fs.cat_file(self.path))
        except FileNotFoundError:
            return None
        except ValueError:  # a torn write of another job: treat as taken, it will be rewritten
            return {"token": "?", "expires": time.time() + self.ttl_s, "host": "?", "pid": 0}

    def _write(self) -> None:
        put_whole(self.fs, self.path, json.dumps({**self.owner, "expires": time.time() + self.ttl_s}).encode())


def _stale(lease: dict) -> bool:
    if time.time() > float(lease.get("expires", 0)):
        return True
    return lease.get("host") == socket.gethostname() and not _alive(int(lease.get("pid", 0)))


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _busy(path: str, lease: dict) -> str:
    left = float(lease.get("expires", 0)) - time.time()
    job = f", Ray job {lease['job']}" if lease.get("job") else ""
    return (f"another job is writing this output: {path} is held by {lease.get('host')}:{lease.get('pid')}{job} "
            f"(lease expires in {max(left, 0):.0f}s unless renewed). Wait for that job to finish, or write to "
            f"another --output; the lease of a job that was killed expires by itself")
