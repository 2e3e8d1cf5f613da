"""fsspec access to model directories and corpora: local paths and ``s3://`` (or any fsspec URL).

S3 endpoint, credentials and region come from the usual AWS environment variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``).
"""
from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from typing import IO, Callable, Iterator

import fsspec


def storage_options(url: str) -> dict:
    """fsspec options for ``url``; for s3 an explicit endpoint from ``AWS_ENDPOINT_URL`` if set."""
    if url.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
    return {}


def model_reader(url: str) -> Callable[[str], bytes | None]:
    """A ``reader(name) -> bytes | None`` over the checkpoint directory at ``url`` (for workers.checkpoint)."""
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


def _on_disk(fs) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


@contextmanager
def open_whole(fs, path: str) -> Iterator[IO[bytes]]:
    """A file streamed in that a reader sees complete or not at all, even if the writer fails or is
    killed part way: on local disk a temporary name renamed into place at the end, on object stores
    an upload committed only when the block ends without an error (aborted on one)."""
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    if _on_disk(fs):
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            with fs.open(tmp, "wb") as f:
                yield f
        except BaseException:
            if fs.exists(tmp):
                fs.rm(tmp)
            raise
        fs.mv(tmp, path)
        return
    f = fs.open(path, "wb", autocommit=False)
    try:
        yield f
    except BaseException:
        f.discard()
        raise
    f.close()
    f.commit()


def put_whole(fs, path: str, data: bytes) -> None:
    """Write one whole file that a reader sees complete or not at all: a single PUT on object stores,
    a temporary name then an atomic rename on local disk (never truncated and rewritten in place)."""
    if _on_disk(fs):
        with open_whole(fs, path) as f:
            f.write(data)
        return
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as f:
        f.write(data)
