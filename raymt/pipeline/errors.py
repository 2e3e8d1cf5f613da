"""Which errors stop a job at once, and which are worth another attempt.

A unit's failure is retried (with back-off) when another attempt can succeed: a storage hiccup, a
decoder actor lost with its node. Some failures no retry can mend, and going on would waste the
cluster or lose, mix or overwrite data: the output's lease lost to another job, an input changed
since the plan, no space left or no permission on the output. Those are ``JobStopped``: raised where
they happen (in a decoder actor, an encoder or the driver), they end the whole job with their
one-line message, and nothing is written after them.
"""
from __future__ import annotations

import errno

# OSError numbers that the same write on the same storage meets again on every attempt.
DETERMINISTIC_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EFBIG})


class JobStopped(RuntimeError):
    """The job must stop now, with this one-line message (a subclass says why)."""


class InputError(ValueError):
    """The input cannot be translated as asked (missing / mistyped column, a special file); raised before any work."""


class StorageFull(JobStopped):
    """A deterministic local error writing the output (no space, no permission, read-only)."""


def deterministic(e: BaseException) -> bool:
    """Whether ``e`` is an error that the same write would meet again (no space, permission, ...)."""
    return isinstance(e, OSError) and e.errno in DETERMINISTIC_ERRNOS or isinstance(e, PermissionError)


def stop_for(e: BaseException, what: str) -> JobStopped | None:
    """``e`` as the ``JobStopped`` it means while doing ``what`` (e.g. "writing /out/part-1.parquet"),
    or None when another attempt may succeed."""
    if isinstance(e, JobStopped):
        return e
    if deterministic(e):
        reason = e.strerror or type(e).__name__ if isinstance(e, OSError) else str(e)
        return StorageFull(f"{reason} {what} (errno {getattr(e, 'errno', '?')}): no retry can help; every unit "
                           f"committed so far is kept — free space or fix the permissions, then rerun the same "
                           f"command to resume")
    return None


def stopping_cause(e: BaseException) -> JobStopped | None:
    """The ``JobStopped`` behind ``e``: itself, or the cause a Ray task error carries from an actor."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, JobStopped):  # a Ray task error is an instance of its cause's class too: say the cause,
            cause = getattr(e, "cause", None)  # not the remote stack the wrapper's message carries
            return cause if isinstance(cause, JobStopped) else e
        e = getattr(e, "cause", None) or e.__cause__
        seen += 1
    return None


def os_error_line(e: OSError) -> str:
    """An OS error in one line: the path(s), the system's words and the errno's name (``ENOTDIR``)."""
    code = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    return f"{where + ': ' if where else ''}{e.strerror or e} ({code})"


def last_line(e: BaseException) -> str:
    """An error's last non-empty line, cut to 300 characters (a Ray task error's own message, after its stack)."""
    lines = [x for x in str(e).splitlines() if x.strip()]
    return lines[-1][:300] if lines else type(e).__name__
