"""fsspec access to model directories and corpora: local paths and ``s3://`` (or any fsspec URL).

S3 endpoint, credentials and region come from the usual AWS environment variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``).
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import IO, Callable, Iterator

import fsspec

from raymt.pipeline.digests import bytes_digest
from raymt.pipeline.errors import JobStopped, deterministic
from raymt.pipeline.extras import require_for_url
from raymt.pipeline.hub import ResolvedModel, resolve_model

Guard = Callable[[], AbstractContextManager]  # held around the step that makes a write visible (fencing)


def storage_options(url: str) -> dict:
    """fsspec options for ``url``; for s3 an explicit endpoint from ``AWS_ENDPOINT_URL`` if set.

    Every URL passes here before fsspec opens it: a scheme whose package is not installed stops
    with one line naming the extra that brings it (``pipeline/extras.py``)."""
    require_for_url(url)
    if url.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
    return {}


class ModelChanged(JobStopped):
    """A model file read by a decoder is not the one the job's plan recorded."""


def model_reader(url: str | ResolvedModel, pins: tuple[tuple[str, str], ...] = ()) -> Callable[[str], bytes | None]:
    """A ``reader(name) -> bytes | None`` over the checkpoint at ``url`` (for raymt.workers.checkpoints.checkpoint): an HF
    directory as it is, a Marian .npz directory served as one (``raymt.workers.checkpoints.model_formats.open_model``);
    a Hugging Face hub id is fetched into this machine's hub cache first (``pipeline/hub.py``).
    ``pins`` are (file name, SHA-256) pairs: a file read whose bytes hash otherwise stops the job
    (``ModelChanged``), so no decoder ever loads a model other than the one the plan recorded."""
    from raymt.workers.checkpoints.model_formats import open_model  # (torch: only where a model is read)
    path = (url if isinstance(url, ResolvedModel) else resolve_model(url)).path
    return open_model(_pinned(directory_reader(path), path, dict(pins)), path)


def _pinned(read: Callable[[str], bytes | None], url: str, pins: dict[str, str]) -> Callable[[str], bytes | None]:
    if not pins:
        return read

    def checked(name: str) -> bytes | None:
        data = read(name)
        if name in pins and (data is None or bytes_digest(data) != pins[name]):
            raise ModelChanged(f"model file {url.rstrip('/')}/{name} changed since the job planned it (its content "
                               f"differs from the plan's, though its size and time may not): decoding on would mix two "
                               f"models in one output. Restore the file, or rerun with --restart to translate afresh")
        return data
    return checked


def directory_reader(url: str) -> Callable[[str], bytes | None]:
    """A ``reader(name) -> bytes | None`` over the files of the directory at ``url``, as they are."""
    fs, root = fsspec.core.url_to_fs(url, **storage_options(url))

    def read(name: str) -> bytes | None:
        path = f"{root.rstrip('/')}/{name}"
        if not fs.exists(path):
            return None
        with fs.open(path, "rb") as f:
            return f.read()
    return read


def read_text(url: str) -> str:
    with fsspec.open(url, "rt", encoding="utf-8", **storage_options(url)) as f:
        return f.read()


def write_text(url: str, text: str) -> None:
    with fsspec.open(url, "wt", encoding="utf-8", **storage_options(url)) as f:
        f.write(text)


def on_disk(fs) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


@contextmanager
def open_whole(fs, path: str, guard: Guard = nullcontext) -> Iterator[IO[bytes]]:
    """A file streamed in that a reader sees complete or not at all, even if the writer fails or is
    killed part way: on local disk a temporary name renamed into place at the end, on object stores
    an upload committed only when the block ends without an error (aborted on one). The step that
    makes it visible (the rename, the upload's completion) runs inside ``guard()``."""
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    if on_disk(fs):
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            with fs.open(tmp, "wb") as f:
                yield f
            with guard():
                fs.mv(tmp, path)
        except BaseException:
            if fs.exists(tmp):
                fs.rm(tmp)
            raise
        return
    f = fs.open(path, "wb", autocommit=False)
    try:
        yield f
        f.close()
    except BaseException:
        f.discard()
        raise
    with guard():
        f.commit()


def put_whole(fs, path: str, data: bytes, guard: Guard = nullcontext) -> None:
    """Write one whole file that a reader sees complete or not at all: a single PUT on object stores,
    a temporary name then an atomic rename on local disk (never truncated and rewritten in place);
    the PUT or the rename inside ``guard()``."""
    if on_disk(fs):
        with open_whole(fs, path, guard) as f:
            f.write(data)
        return
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with guard():
        fs.pipe_file(path, data)


def retrying(action: Callable[[], object], what: str, attempts: int = 4, first_wait_s: float = 0.5) -> object:
    """``action()``, tried again after 0.5, 1, 2 s on a transient storage error (a dropped connection,
    a throttled request, a 5xx): the decoded rows are written again, not decoded again. A
    deterministic error (no space, permission) or a stopped job is raised at once."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except JobStopped:
            raise
        except Exception as e:  # noqa: BLE001 - sorted below
            if deterministic(e) or attempt == attempts or not isinstance(e, (OSError, TimeoutError, ConnectionError)) \
                    or isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
                raise
            wait = first_wait_s * 2 ** (attempt - 1)
            logging.getLogger(__name__).warning("%s failed (%s: %s): again in %.1fs", what, type(e).__name__, e, wait)
            time.sleep(wait)
    raise AssertionError("unreachable")

def file_version(url: str) -> dict:
    """Path, size and version (mtime, or the object's ETag) of one file; cheap (metadata only)."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    fs.invalidate_cache(path)  # object-store listings are cached: the version must be read now
    info = fs.info(path)
    version = info.get("ETag") or info.get("mtime") or info.get("LastModified") or info.get("last_modified") or ""
    return {"path": url, "size": int(info.get("size") or 0), "version": str(version)}
