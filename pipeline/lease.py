"""The output's lease and the fence every write of a job passes: one writer per output, ever.

``_LEASE.json`` names the job that writes an output (host, pid, Ray job id, a random token), when its
claim expires, and its *generation*: a number that only grows, one more each time a job takes the
output (the fencing token of trusted storage systems). The file is never deleted: a job that ends
marks it released, so the next job's generation is always higher than every earlier one's.

* **Taking** the lease (``Lease.acquire``) succeeds only when the current lease is absent, released,
  expired, or held by a process of this host that is gone. On local disk the read and the write
  happen under an exclusive lock (``_LEASE.lock``, ``flock``); on object stores the write is
  conditional (S3 ``If-None-Match: *`` when absent, ``If-Match: <ETag read>`` otherwise), then read
  back after a pause, for stores that ignore the conditions.
* **Renewal** (a thread, every ttl/6) is conditional the same way, and gives up instead of
  renewing once the lease has expired: a job paused past its expiry (SIGSTOP, a long GC pause, a
  suspended machine, a partitioned node) has *lost* it, even if nobody took it over yet.
* **Every write** of the job (part, stats, marker, plan, ``_SUCCESS``, the assembled file) and
  every deletion passes ``Fence.guard()``, in the driver and in every decoder actor: the current
  lease must carry this job's token and generation and at least ttl/4 of life. On local disk the
  check and the final rename happen under the same lock a taker holds, so no write lands after
  another job took the output. On object stores the check is a read of the lease just before the
  single PUT; the window is a process paused for more than ttl/4 between that read and its PUT
  reaching the store (the PUT then lands late; a write of another plan is never counted, and a
  write of the same plan carries the same rows).
* A job whose lease is lost stops at once (``LeaseLost``: "lease lost to host:pid at T — this job
  wrote nothing after T"), exits non-zero, and never writes or deletes anything after.

Clocks of the machines writing one output are assumed within a few seconds of each other (NTP).
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import fsspec

from raymt.pipeline.errors import JobStopped
from raymt.pipeline.storage import on_disk, put_whole, storage_options

LEASE = "_LEASE.json"
LOCK = "_LEASE.lock"
logger = logging.getLogger(__name__)


class OutputBusy(RuntimeError):
    """Another live job holds the output's lease."""


class LeaseLost(JobStopped):
    """This job no longer holds its output's lease: it stops, writing nothing more."""


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(t * 10) % 10}"


def _who(lease: dict) -> str:
    job = f" (Ray job {lease['job']})" if lease.get("job") else ""
    return f"{lease.get('host', '?')}:{lease.get('pid', '?')}{job}"


@contextmanager
def _disk_lock(fs, root: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``<root>/_LEASE.lock`` (local disk only; object stores: no lock)."""
    if not on_disk(fs):
        yield
        return
    os.makedirs(root, exist_ok=True)
    fd = os.open(os.path.join(root, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def read_lease(fs, path: str, etag: bool = True) -> tuple[dict | None, str | None]:
    """The lease at ``path`` and its version (the object's ETag, read first; None on local disk or
    when not asked for), or (None, None)."""
    try:
        if etag and not on_disk(fs):
            fs.invalidate_cache(path)
            etag = fs.info(path).get("ETag")
        else:
            etag = None
        return json.loads(fs.cat_file(path)), etag
    except FileNotFoundError:
        return None, None
    except ValueError:  # not raymt's (its writes are whole): held by nobody, free to take
        return {"token": "?", "generation": 0, "expires": 0, "host": "?", "pid": 0}, None


@dataclass(frozen=True, slots=True)
class Fence:
    """What a writer of this job (driver or decoder actor) checks before each write; picklable."""

    url: str  # the output root
    token: str
    generation: int
    ttl_s: float

    def check(self) -> None:
        """Raise ``LeaseLost`` unless the output's lease is this job's, at its generation, with life left."""
        fs, root = fsspec.core.url_to_fs(self.url, **storage_options(self.url))
        self._check(fs, root.rstrip("/"))

    def _check(self, fs, root: str) -> None:
        if problem := self.problem_of(lambda: read_lease(fs, f"{root}/{LEASE}", etag=False)[0]):
            raise LeaseLost(problem)

    def problem_of(self, read) -> str | None:
        """``problem`` of the lease as ``read()`` returns it. A lease still this job's but out of time is
        read again: the first read may predate a pause of this process, and a taker may have come since."""
        current = read()
        problem = self.problem(current, time.time())
        if problem and current and current.get("token") == self.token:
            problem = self.problem(read(), time.time()) or problem
        return problem

    def problem(self, current: dict | None, now: float) -> str | None:
        """Why ``current`` (the lease as read at ``now``) does not let this job write; None if it does."""
        where = f"the output lease of {self.url}"
        if current is None:
            return f"{where} was removed — this job (generation {self.generation}) stopped and wrote nothing after"
        if current.get("token") != self.token:
            taken = float(current.get("taken", current.get("expires", now)))
            return (f"{where} lost to {_who(current)} (generation {current.get('generation', '?')}) at "
                    f"{_when(taken)} — this job (generation {self.generation}) wrote nothing after {_when(taken)}")
        if current.get("released"):
            return f"{where} was released by this job's driver — a straggling writer wrote nothing after"
        expires = float(current.get("expires", 0))
        if expires - now < self.ttl_s / 4:
            return (f"{where} expired at {_when(expires)} (this job was paused or cut off for longer than the "
                    f"lease, {self.ttl_s:.0f}s) — this job wrote nothing after {_when(expires - self.ttl_s / 4)}")
        return None

    @contextmanager
    def guard(self, fs) -> Iterator[None]:
        """Hold for one write: the lease checked, and (local disk) no taker can run until it ends."""
        root = fsspec.core.url_to_fs(self.url, **storage_options(self.url))[1].rstrip("/")
        with _disk_lock(fs, root):
            self._check(fs, root)
            yield


class Lease:
    """This job's claim on an output directory: taken before any write, renewed, released at the end."""

    def __init__(self, fs, root: str, ttl_s: float = 60.0, settle_s: float = 0.3, url: str | None = None) -> None:
        self.fs, self.root, self.ttl_s, self.settle_s = fs, root.rstrip("/"), ttl_s, settle_s
        self.path = f"{self.root}/{LEASE}"
        self.url = (url or root).rstrip("/")
        self.token = uuid.uuid4().hex
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "job": os.environ.get("RAY_JOB_ID", ""),
                      "token": self.token}
        self.generation = 0
        self.expires = 0.0
        self.taken = 0.0
        self.etag: str | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def fence(self) -> Fence:
        return Fence(self.url, self.token, self.generation, self.ttl_s)

    def acquire(self) -> None:
        """Take the lease or raise ``OutputBusy`` naming the live owner; then renew it every ttl/6 seconds."""
        with _disk_lock(self.fs, self.root):
            current, etag = read_lease(self.fs, self.path)
            if current and current.get("token") != self.token and not _stale(current):
                raise OutputBusy(_busy(self.path, current))
            self.generation = int((current or {}).get("generation", 0)) + 1
            self.taken = time.time()
            try:
                self._write(etag=etag, create=current is None)
            except (FileExistsError, OSError) as e:
                if not _precondition_failed(e):
                    raise
                raise OutputBusy(_busy(self.path, read_lease(self.fs, self.path)[0] or {})) from None
        if not on_disk(self.fs):  # a store that ignores write conditions: the later write wins, both read it
            time.sleep(self.settle_s)
            current, self.etag = read_lease(self.fs, self.path)
            if not current or current.get("token") != self.token:
                raise OutputBusy(_busy(self.path, current or {}))
        logger.info("output lease of %s taken: generation %d", self.url, self.generation)
        self._thread = threading.Thread(target=self._renew, name="raymt-lease", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise ``LeaseLost`` if the renewal thread found the lease lost."""
        if self.lost:
            raise LeaseLost(self.lost)

    def release(self) -> None:
        """Mark the lease released (never deleted: the next job's generation follows this one's)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.lost or not self.generation:
            return
        with _disk_lock(self.fs, self.root):
            current, etag = read_lease(self.fs, self.path)
            if current and current.get("token") == self.token:
                try:
                    self._write(etag=etag, released=True)
                except OSError as e:  # the output's end is already recorded; a stale lease expires by itself
                    logger.warning("could not mark the output lease released: %s", e)

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 6):
            if time.time() > self.expires - self.ttl_s / 4:  # writers refuse from here on: so does the owner
                ours = {**self.owner, "generation": self.generation, "expires": self.expires}
                try:  # taken over meanwhile: name the taker
                    current = read_lease(self.fs, self.path, etag=False)[0] or ours
                except Exception:  # noqa: BLE001 - unreadable now: the expiry is reason enough
                    current = ours
                self.lost = self.fence.problem(current if current.get("token") != self.token else ours, time.time())
                return
            try:
                with _disk_lock(self.fs, self.root):
                    current, etag = read_lease(self.fs, self.path)
                    if (problem := self.fence.problem(current, time.time())) is not None:
                        self.lost = self.fence.problem_of(lambda: read_lease(self.fs, self.path, etag=False)[0]) or problem
                        return
                    self._write(etag=self.etag if not on_disk(self.fs) else None)
            except OSError as e:
                if _precondition_failed(e):  # another job wrote it since our last write
                    self.lost = self.fence.problem(read_lease(self.fs, self.path)[0], time.time())
                    return
                continue  # a storage hiccup: try again next period; expiry is ttl away
            except Exception:  # noqa: BLE001 - likewise
                continue

    def _write(self, etag: str | None = None, create: bool = False, released: bool = False) -> None:
        expires = 0.0 if released else time.time() + self.ttl_s
        data = json.dumps({**self.owner, "generation": self.generation, "taken": self.taken, "expires": expires,
                           "released": released}).encode()
        if on_disk(self.fs):
            put_whole(self.fs, self.path, data)
        else:
            self.fs.makedirs(self.root, exist_ok=True)
            out = self.fs.pipe_file(self.path, data, mode="create") if create else \
                self.fs.pipe_file(self.path, data, **({"IfMatch": etag} if etag else {}))
            self.etag = (out or {}).get("ETag") if isinstance(out, dict) else None
        self.expires = expires


def _precondition_failed(e: BaseException) -> bool:
    """A conditional write refused (S3 412: someone else wrote the object since it was read)."""
    return isinstance(e, FileExistsError) or (isinstance(e, OSError) and e.errno == errno.EINVAL and
                                              "pre-condition" in str(e).lower())


def _stale(lease: dict) -> bool:
    if lease.get("released") or time.time() > float(lease.get("expires", 0)):
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
    return (f"another job is writing this output: {path} is held by {_who(lease)}, generation "
            f"{lease.get('generation', '?')} (lease expires in {max(left, 0):.0f}s unless renewed). Wait for that "
            f"job to finish, or write to another --output; the lease of a job that was killed expires by itself")
