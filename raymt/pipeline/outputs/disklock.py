"""The output's lock on local disk (``<output>/_LEASE.lock``): an exclusive ``flock`` that is never
waited for without a bound, records who holds it, and can be replaced when its holder is stuck.

* **Taking** it (``lock``) tries ``flock(LOCK_EX | LOCK_NB)`` with back-off (2 ms doubling to 50 ms)
  for at most ``wait_s`` seconds, then raises ``LockBusy`` naming the holder. A lock taken is checked
  to be the file now at the path (the same inode): a descriptor opened on a file that was replaced
  meanwhile holds nothing, and the attempt starts again.
* The holder writes who it is into the file once it holds it (one ``ftruncate`` and ``pwrite`` of
  its descriptor: host, pid, since when), and empties it on release, so a waiter can name it.
* **Replacing** a stuck lock (``break_lock``) is for a holder that is paused (SIGSTOP, a frozen
  machine, a stalled NFS client) past the lease it guards; the caller decides that
  (``pipeline/outputs/lease.py``). A fresh file is created under a unique name and locked, the path is checked to be still the stuck
  file (a breaker that comes second finds it replaced and takes the ordinary way), the fresh file is
  renamed over the path (atomic), and the path is checked to be the fresh file once more. The stuck
  holder keeps a lock on a file no longer at the path: ``DiskLock.intact`` tells it so before it
  writes. Two breakers that pass the first check at the same instant both rename, and at most one
  of them finds its file at the path afterwards and keeps holding; the other one checks ``intact``
  again before each write and stops.

Which file is at the path is asked by opening it afresh (on NFS, ``open`` revalidates a name that
``stat`` may answer from its attribute cache).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

LOCK = "_LEASE.lock"
_FIRST_PAUSE_S, _LAST_PAUSE_S = 0.002, 0.05


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds the lock, as it recorded itself."""

    host: str
    pid: int
    since: float  # time.time() when it took the lock

    def __str__(self) -> str:
        held_s = max(time.time() - self.since, 0)
        return f"{self.host}:{self.pid} (holding it for {held_s:.0f}s, since {_when(self.since)})"


class LockBusy(Exception):
    """The lock was not free within the wait; ``ino``/``dev``: the file that was locked, ``holder``: who, if known."""

    def __init__(self, path: str, ino: int, dev: int, holder: Holder | None, waited_s: float) -> None:
        self.path, self.ino, self.dev, self.holder, self.waited_s = path, ino, dev, holder, waited_s
        super().__init__(f"{path} is held by {holder or 'another process (not recorded)'}; waited {waited_s:.1f}s")


class DiskLock:
    """A held lock: the descriptor carrying the ``flock`` and the file it is on."""

    def __init__(self, path: str, fd: int) -> None:
        st = os.fstat(fd)
        self.path, self.fd, self.ino, self.dev = path, fd, st.st_ino, st.st_dev

    def intact(self) -> bool:
        """Whether the locked file is still the one at the path (False: it was replaced as stuck)."""
        return _at_path(self.fd, self.path)

    def release(self) -> None:
        """Empty the holder record and close the descriptor (which releases the lock)."""
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass
        finally:
            os.close(self.fd)
            self.fd = -1


def lock_path(root: str) -> str:
    return os.path.join(root, LOCK)


def lock(root: str, wait_s: float) -> DiskLock:
    """The exclusive lock on ``<root>/_LEASE.lock``, taken within ``wait_s`` seconds, else ``LockBusy``."""
    os.makedirs(root, exist_ok=True)
    path = lock_path(root)
    start = time.monotonic()
    pause = _FIRST_PAUSE_S
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            st = os.fstat(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            waited = time.monotonic() - start
            if waited >= wait_s:
                raise LockBusy(path, st.st_ino, st.st_dev, holder_of(path), waited) from None
            time.sleep(min(pause, wait_s - waited))
            pause = min(pause * 2, _LAST_PAUSE_S)
            continue
        except BaseException:
            os.close(fd)
            raise
        if _at_path(fd, path):
            return _recorded(path, fd)
        os.close(fd)  # locked a file that is no longer at the path (replaced or removed): again


@contextmanager
def locked(root: str, wait_s: float) -> Iterator[DiskLock]:
    """``lock``, released at the end of the block."""
    held = lock(root, wait_s)
    try:
        yield held
    finally:
        held.release()


def break_lock(root: str, stuck: LockBusy) -> DiskLock | None:
    """Replace the stuck lock file ``stuck`` names with a fresh one held by this process; None when the
    path is no longer the stuck file (another process replaced it first: take the ordinary way)."""
    path = lock_path(root)
    fresh = f"{path}.{uuid.uuid4().hex}.new"
    fd = os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a name nobody else knows: never contended
        held = _recorded(path, fd)
        if _file_at(path) != (stuck.ino, stuck.dev):
            os.unlink(fresh)
            held.release()
            return None
        os.rename(fresh, path)
    except BaseException:
        if os.path.exists(fresh):
            os.unlink(fresh)
        os.close(fd)
        raise
    if not held.intact():  # a second breaker renamed its own file over this one at the same instant
        held.release()
        return None
    return held


def holder_of(path: str) -> Holder | None:
    """Who holds the lock at ``path`` as it recorded itself (None: nobody recorded, or unreadable)."""
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read(4096) or b"null")
        return Holder(str(record["host"]), int(record["pid"]), float(record["since"])) if record else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove(held: DiskLock) -> None:
    """Remove the lock file while holding it (an output the job leaves as it found it); a waiter that
    opened it finds it gone once it gets the lock, and starts again on a fresh file."""
    if held.intact():
        try:
            os.unlink(held.path)
        except FileNotFoundError:
            pass
    held.release()


def _recorded(path: str, fd: int) -> DiskLock:
    """The lock on ``fd``, with this process recorded as its holder."""
    record = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}).encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
    except OSError:  # naming the holder is a courtesy to waiters: the lock is held all the same
        pass
    return DiskLock(path, fd)


def _file_at(path: str) -> tuple[int, int] | None:
    """(inode, device) of the file now at ``path``, None if none. The path is opened afresh: ``open``
    revalidates a cached name on NFS, where ``stat`` may answer from its cache. (A flock belongs to
    its own descriptor: closing this one leaves a lock held on another.)"""
    try:
        probe = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(probe)
    finally:
        os.close(probe)
    return st.st_ino, st.st_dev


def _at_path(fd: int, path: str) -> bool:
    """Whether ``fd`` is the file now at ``path``."""
    st = os.fstat(fd)
    return _file_at(path) == (st.st_ino, st.st_dev)
