"""Content digests of model files: what a plan records as a model's version, beside size and time.

A file's size and mtime say nothing about a rewrite that keeps both (``cp -p``, ``rsync -t``,
``touch -r``), so a local model file is pinned by the SHA-256 of its bytes. Hashing runs at about
1.4 GB/s on one core, so a 300 MB checkpoint costs ~0.2 s; a resume need not pay it again: a digest
is cached under ``$RAYMT_CACHE_DIR`` (default ``~/.cache/raymt``) ``/digests/``, keyed by the file's
path, device, inode, size, mtime and ctime. The ctime cannot be set back by any user tool, so a
rewrite, a rename over the file or a restored mtime misses the cache and is hashed afresh; a file
changed in the last ``RACY_S`` seconds is hashed but not cached, since a second rewrite within the
same ctime tick (filesystems keep it at a few milliseconds) would not change the key. On object
stores the version is the object's ETag, which the store derives from the content: no digest there.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from pathlib import Path

logger = logging.getLogger(__name__)

CHUNK = 1 << 22  # bytes hashed at a time
RACY_S = 2.0  # a file whose ctime is this recent is not cached: a rewrite within one ctime tick could follow


def cache_dir() -> Path:
    root = os.environ.get("RAYMT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "raymt")
    return Path(root) / "digests"


def _key(path: str, st: os.stat_result) -> str:
    fields = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return hashlib.sha256(repr(fields).encode()).hexdigest()[:32]


def file_digest(path: str, cache: bool = True) -> str:
    """The SHA-256 of a local file's bytes (hex), from the cache when the file's identity is unchanged."""
    before = os.stat(path)
    entry = cache_dir() / _key(path, before)
    if cache:
        try:
            return entry.read_text().strip()
        except OSError:
            pass
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    value = digest.hexdigest()
    after = os.stat(path)
    if cache and _key(path, after) == entry.name and time.time() - after.st_ctime > RACY_S:  # settled: keep
        _store(entry, value)
    return value


def bytes_digest(data: bytes) -> str:
    """The digest ``file_digest`` gives a file holding ``data``."""
    return hashlib.sha256(data).hexdigest()


def _store(entry: Path, value: str) -> None:
    """Write one cache entry atomically; a cache that cannot be written is only slower."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(value)
        os.replace(tmp, entry)
    except OSError as e:
        logger.debug("digest cache %s not written: %s", entry, e)
