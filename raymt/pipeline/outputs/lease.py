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
* **Every wait for the lock is bounded** (local disk): ``flock`` with ``LOCK_NB``, tried again with
  back-off (``pipeline/outputs/disklock.py``); the holder records host, pid and since when in the lock
  file, so a waiter names it. A holder paused while it holds the lock (SIGSTOP, a frozen machine, a
  stalled NFS client) never hangs another job:

  - a taker waits ``LOCK_WAIT_S`` (2 s), then reads the lease without the lock. Another job's live
    lease: ``OutputBusy`` at once, naming the lease's holder, its generation and expiry, and the
    lock's holder and how long it has held it. A stale lease (expired, released, a gone process of
    this host): the lock's holder is paused past the lease it guards, so the taker replaces the
    lock file by a fresh one it holds, logs one line naming the stuck holder, and takes the lease.
    A paused or dead holder delays a taker by at most its lease's remaining life and 2 s.
  - renewal waits at most its period (ttl/6) and never past the point where writers refuse (ttl/4
    before expiry); one that did not get the lock tries next period, and an unrenewed lease is lost.
  - a guarded write waits at most ttl/4, then reads the lease: not this job's (or out of time):
    ``LeaseLost``; still its own: ``OutputLocked`` (a ``JobStopped``) naming the lock's holder.
  - release waits 2 s, then leaves the lease to expire by itself.

  A holder whose lock was replaced finds out before it writes: every guarded write and lease write
  checks, after the lease check, that the file it locked is still the one at the lock's path (the
  same inode), else ``LeaseLost``. The window left is that of object stores: a process paused for
  more than ttl/4 between that check and its rename.
* A job refused before it wrote anything (``release(discard=True)``) removes the lease files it
  created on an output that had none: a refused run leaves the directory as it found it.

Clocks of the machines writing one output are assumed within a few seconds of each other (NTP).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Iterator

import fsspec

from raymt.pipeline.outputs import disklock
from raymt.pipeline.outputs.disklock import LOCK, DiskLock, LockBusy
from raymt.pipeline.errors import JobStopped
from raymt.pipeline.storage import on_disk, put_whole, storage_options

LEASE = "_LEASE.json"
LOCK_WAIT_S = 2.0  # how long a taker (and a release) waits for the output's lock
LEASE_TTL_S = 60.0  # how long a paused or cut-off job keeps the output before another may take it
logger = logging.getLogger(__name__)


class OutputBusy(RuntimeError):
    """Another live job holds the output's lease."""


class LeaseLost(JobStopped):
    """This job no longer holds its output's lease: it stops, writing nothing more."""


class OutputLocked(JobStopped):
    """The output's lock stayed held by another process for a write's whole wait: the job stops."""


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(t * 10) % 10}"


def _who(lease: dict) -> str:
    job = f" (Ray job {lease['job']})" if lease.get("job") else ""
    return f"{lease.get('host', '?')}:{lease.get('pid', '?')}{job}"


def _disk_lock(fs, root: str, wait_s: float) -> AbstractContextManager[DiskLock | None]:
    """The output's lock waited for at most ``wait_s`` (else ``LockBusy``); object stores: none (None)."""
    return disklock.locked(root, wait_s) if on_disk(fs) else nullcontext()


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

    def replaced(self) -> str:
        """Why a writer whose lock file was replaced (it was paused past its lease while holding it) stops."""
        return (f"the output lease of {self.url} was lost: this job (generation {self.generation}) was paused "
                f"past its lease while it held the output's lock, and another job replaced the lock — this job "
                f"wrote nothing after {_when(time.time())}")

    @contextmanager
    def guard(self, fs) -> Iterator[None]:
        """Hold for one write: the lease checked, and (local disk) no taker can run until it ends. The
        lock is waited for at most ttl/4: then ``LeaseLost`` if the lease is no longer this job's,
        else ``OutputLocked`` naming the lock's holder."""
        root = fsspec.core.url_to_fs(self.url, **storage_options(self.url))[1].rstrip("/")
        if not on_disk(fs):
            self._check(fs, root)
            yield
            return
        try:
            held = disklock.lock(root, self.ttl_s / 4)
        except LockBusy as busy:
            self._check(fs, root)
            raise OutputLocked(f"the output lock {busy.path} is held by {busy.holder or 'an unrecorded process'}: this "
                               f"job's write waited {busy.waited_s:.0f}s (a quarter of its lease) while the lease is "
                               f"still its own — that process is paused or its storage stalls. This job (generation "
                               f"{self.generation}) stops and wrote nothing after; rerun the same command to resume "
                               f"once that process is gone") from None
        try:
            self._check(fs, root)
            if not held.intact():
                raise LeaseLost(self.replaced())
            yield
        finally:
            held.release()


class Lease:
    """This job's claim on an output directory: taken before any write, renewed, released at the end."""

    def __init__(self, fs, root: str, ttl_s: float = LEASE_TTL_S, settle_s: float = 0.3, url: str | None = None) -> None:
        self.fs, self.root, self.ttl_s, self.settle_s = fs, root.rstrip("/"), ttl_s, settle_s
        self.path = f"{self.root}/{LEASE}"
        self.url = (url or root).rstrip("/")
        self.token = uuid.uuid4().hex
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "job": os.environ.get("RAY_JOB_ID", ""),
                      "token": self.token}
        self.generation = 0
        self.expires = 0.0
        self.taken = 0.0
        self.created = False  # the output had no lease before this job's
        self.etag: str | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def fence(self) -> Fence:
        return Fence(self.url, self.token, self.generation, self.ttl_s)

    def acquire(self) -> None:
        """Take the lease or raise ``OutputBusy`` naming the live owner; then renew it every ttl/6 seconds."""
        held = self._take_lock() if on_disk(self.fs) else None
        try:
            self._take(held)
        finally:
            if held is not None:
                held.release()
        if not on_disk(self.fs):  # a store that ignores write conditions: the later write wins, both read it
            time.sleep(self.settle_s)
            current, self.etag = read_lease(self.fs, self.path)
            if not current or current.get("token") != self.token:
                raise OutputBusy(_busy(self.path, current or {}))
        logger.info("output lease of %s taken: generation %d", self.url, self.generation)
        self._thread = threading.Thread(target=self._renew, name="raymt-lease", daemon=True)
        self._thread.start()

    def _take_lock(self) -> DiskLock:
        """The output's lock, for taking the lease: waited for ``LOCK_WAIT_S``; held longer while the lease
        is another job's and live: ``OutputBusy`` at once; while it is stale: the stuck lock replaced."""
        for _ in range(3):
            try:
                return disklock.lock(self.root, LOCK_WAIT_S)
            except LockBusy as busy:
                current = read_lease(self.fs, self.path, etag=False)[0]
                if current and current.get("token") != self.token and not _stale_why(current):
                    raise OutputBusy(_busy(self.path, current, busy)) from None
                if (held := disklock.break_lock(self.root, busy)) is not None:
                    logger.warning("the output lock %s was held by %s past the output's lease (which %s): replaced "
                                   "the lock, so that process writes nothing more here", busy.path,
                                   busy.holder or "an unrecorded process", _stale_why(current))
                    return held
        raise OutputBusy(f"the output lock {disklock.lock_path(self.root)} could not be taken in "
                         f"{3 * LOCK_WAIT_S:.0f}s: other jobs are taking this output at the same time; rerun")

    def _take(self, held: DiskLock | None) -> None:
        """Read the lease and write this job's (under ``held``, the lock, on local disk)."""
        current, etag = read_lease(self.fs, self.path)
        if current and current.get("token") != self.token and not _stale_why(current):
            raise OutputBusy(_busy(self.path, current))
        self.generation = int((current or {}).get("generation", 0)) + 1
        self.taken = time.time()
        self.created = current is None
        if held is not None and not held.intact():  # this taker was paused, and its lock replaced as stuck
            raise OutputBusy(f"the output lock {held.path} was replaced while this job was taking the lease (it was "
                             f"paused): another job is taking this output; rerun once it is done")
        try:
            self._write(etag=etag, create=current is None)
        except (FileExistsError, OSError) as e:
            if not _precondition_failed(e):
                raise
            raise OutputBusy(_busy(self.path, read_lease(self.fs, self.path)[0] or {})) from None

    def check(self) -> None:
        """Raise ``LeaseLost`` if the renewal thread found the lease lost."""
        if self.lost:
            raise LeaseLost(self.lost)

    def release(self, discard: bool = False) -> None:
        """Mark the lease released (never deleted: the next job's generation follows this one's).
        ``discard``, for a job refused before it wrote anything: the lease files it created on an
        output that had none (``_LEASE.json``, ``_LEASE.lock``) are removed instead."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.lost or not self.generation:
            return
        remove = discard and self.created
        try:
            with _disk_lock(self.fs, self.root, LOCK_WAIT_S) as held:
                current, etag = read_lease(self.fs, self.path)
                if not current or current.get("token") != self.token or (held is not None and not held.intact()):
                    return
                if not remove:
                    self._write(etag=etag, released=True)
                    return
                self.fs.rm(self.path)
                if held is not None:
                    disklock.remove(held)
        except (LockBusy, OSError) as e:  # the output's end is already recorded; a stale lease expires by itself
            logger.warning("could not mark the output lease released (%s): it expires by itself at %s", e,
                           _when(self.expires))

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
            if self._renew_once():
                return

    def _renew_once(self) -> bool:
        """Renew the lease once; True when it was found lost (``lost`` says why). The lock is waited for
        at most a period, and never past the point where writers refuse (ttl/4 before expiry)."""
        wait = min(self.ttl_s / 6, max(self.expires - self.ttl_s / 4 - time.time(), 0.0))
        try:
            with _disk_lock(self.fs, self.root, wait) as held:
                current, _ = read_lease(self.fs, self.path)
                if (problem := self.fence.problem(current, time.time())) is not None:
                    self.lost = self.fence.problem_of(lambda: read_lease(self.fs, self.path, etag=False)[0]) or problem
                    return True
                if held is not None and not held.intact():
                    self.lost = self.fence.replaced()
                    return True
                self._write(etag=self.etag if not on_disk(self.fs) else None)
        except LockBusy as busy:
            logger.warning("output lease of %s not renewed this period: %s", self.url, busy)
        except OSError as e:
            if _precondition_failed(e):  # another job wrote it since our last write
                self.lost = self.fence.problem(read_lease(self.fs, self.path)[0], time.time())
                return True
            # a storage hiccup: try again next period; expiry is ttl away
        except Exception:  # noqa: BLE001 - likewise
            pass
        return False

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


def _stale_why(lease: dict | None) -> str:
    """Why ``lease`` lets another job take the output ("": it does not: live)."""
    if not lease:
        return "is absent"
    if lease.get("released"):
        return "was released"
    if time.time() > float(lease.get("expires", 0)):
        return f"expired at {_when(float(lease.get('expires', 0)))}"
    if lease.get("host") == socket.gethostname() and not _alive(int(lease.get("pid", 0))):
        return f"belongs to process {lease.get('pid')}, which is gone"
    return ""


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


def _busy(path: str, lease: dict, busy: LockBusy | None = None) -> str:
    expires = float(lease.get("expires", 0))
    lock = (f"; its lock {LOCK} has been held by {busy.holder or 'an unrecorded process'} — if that "
            f"process is paused, this output can be taken once the lease expires at {_when(expires)}") if busy else ""
    return (f"another job is writing this output: {path} is held by {_who(lease)}, generation "
            f"{lease.get('generation', '?')} (lease expires in {max(expires - time.time(), 0):.0f}s unless renewed)"
            f"{lock}. Wait for that job to finish, or write to another --output; the lease of a job that was killed "
            f"expires by itself")
