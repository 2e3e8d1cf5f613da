"""Line files (plain text, TSV, JSON lines), plain or compressed: counted once when planned, then
read a unit at a time.

Plain files are planned by bytes: one streaming pass counts the lines and records the byte offset
where every unit starts, so a unit later reads only its own bytes (``text_layout``,
``read_text_lines``). A compressed stream (``.gz``, ``.bz2``, ``.xz``, ``.zst``, decompressed by
fsspec) cannot be entered in the middle, so it is planned by lines: one decompressing pass counts
them, and a unit reads its lines ``start:stop`` by decompressing from the start and skipping the
lines before it (``read_line_range``). Skipping costs only decompression and a newline count per
4 MiB chunk, and nothing is kept but the unit's own lines, so memory is a unit's: reading the last
1,000 lines of 10^6 (79 MB decompressed) took 0.10 s from gzip and 0.03 s from zstd on one core.
Over a corpus the skipping adds up to about (units / 2) decompressing passes, small beside decoding
the same lines (a CPU decoder spends tens of seconds on a unit of 2,500 rows); an index of the
stream (or recompressing into seekable frames) would remove it, and is not needed at that ratio. A unit still checks its file's size and version before and after it reads.
"""
from __future__ import annotations

import hashlib
import io
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Iterator

import fsspec
import numpy as np

from raymt.pipeline.formats import compression_of
from raymt.pipeline.inputs.sniff import HEAD_BYTES, UTF8_BOM, compression_refusal, refusal
from raymt.pipeline.storage import storage_options

TEXT_CHUNK = 1 << 22  # bytes a text file is scanned in (decompressed bytes for a compressed one)


class UnreadableText(ValueError):
    """A line file that cannot be read as text (refused by ``sniff``, or a broken compressed stream)."""


@contextmanager
def open_lines(url: str) -> Iterator[IO[bytes]]:
    """The file's bytes, decompressed as they are read when its name says it is compressed."""
    compression = compression_of(url)
    if compression and _empty(url):  # no stream at all (bz2 and xz would call it truncated): no lines
        yield io.BytesIO()
        return
    try:
        with fsspec.open(url, "rb", compression=compression, **storage_options(url)) as f:
            yield f
    except (OSError, EOFError, ValueError) as e:
        if compression is None or isinstance(e, FileNotFoundError):
            raise
        raise UnreadableText(f"{url}: cannot be decompressed as {compression}: {type(e).__name__}: {e}") from e


def _empty(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    return fs.size(path) == 0


def check_text(url: str) -> None:
    """Raise ``UnreadableText`` in one line unless ``url`` reads as UTF-8 lines: a compressed file's
    own first bytes must be its compression's, and the (decompressed) head must be text."""
    compression = compression_of(url)
    if compression:
        with fsspec.open(url, "rb", **storage_options(url)) as f:
            raw = f.read(8)
        if reason := compression_refusal(url, raw, compression):
            raise UnreadableText(reason)
        if not raw:
            return  # an empty file: no rows
    with open_lines(url) as f:
        head = f.read(HEAD_BYTES)
    if reason := refusal(url, head):
        raise UnreadableText(reason)


def split_lines(data: bytes, first: bool) -> list[bytes]:
    if first and data.startswith(UTF8_BOM):  # a UTF-8 byte-order mark is not text of the first line
        data = data[len(UTF8_BOM):]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def read_text_lines(url: str, byte_start: int | None = None, byte_stop: int | None = None) -> list[bytes]:
    """A text file's lines as bytes (decoded later, row by row, so one bad line cannot stop the job);
    only the lines in ``byte_start:byte_stop`` when given (a unit's range from ``text_layout``)."""
    return split_lines(read_text_bytes(url, byte_start, byte_stop), not byte_start)


def read_text_bytes(url: str, byte_start: int | None = None, byte_stop: int | None = None) -> bytes:
    """A plain text file's bytes, or only ``byte_start:byte_stop`` (a unit's own range)."""
    with open_lines(url) as f:
        if byte_start is None:
            return f.read()
        f.seek(byte_start)
        return f.read(byte_stop - byte_start)


def read_line_range(url: str, start: int, stop: int) -> list[bytes]:
    """Lines ``start:stop`` of a (compressed) file, by decompressing from its start and skipping the
    lines before ``start``: only the unit's own lines are kept."""
    return split_lines(read_line_bytes(url, start, stop), start == 0)[:stop - start]


def read_line_bytes(url: str, start: int, stop: int) -> bytes:
    """The (decompressed) bytes of lines ``start:stop``, exactly: from the first byte of line
    ``start`` to the newline ending line ``stop - 1`` (or the end of the stream)."""
    want, skipped, kept, data = stop - start, 0, 0, bytearray()
    with open_lines(url) as f:
        while kept < want and (chunk := f.read(TEXT_CHUNK)):
            if skipped < start:
                count = chunk.count(b"\n")
                if skipped + count < start:
                    skipped += count
                    continue
                ends = np.flatnonzero(np.frombuffer(chunk, np.uint8) == ord("\n"))  # (N,) newline positions
                chunk = chunk[ends[start - skipped - 1] + 1:]
                skipped = start
            data += chunk
            kept += chunk.count(b"\n")
    if kept > want:  # cut after the unit's last newline
        ends = np.flatnonzero(np.frombuffer(bytes(data), np.uint8) == ord("\n"))  # (N,) newline positions
        del data[ends[want - 1] + 1:]
    return bytes(data)


def unit_checksum(data: bytes) -> str:
    """The checksum a unit's bytes are pinned by (SHA-256, 128 bits as hex)."""
    return hashlib.sha256(data).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class TextLayout:
    """A line file as planned: its rows and, cut into units of ``unit_rows``, where each unit's bytes
    start (plain files; plus the file's end) and each unit's checksum (of its decompressed bytes)."""

    rows: int
    starts: list[int] | None = None
    checksums: list[str] | None = None


def text_layout(url: str, unit_rows: int | None) -> TextLayout:
    """A text file's rows (lines; a last line without its newline counts) read in one streaming pass,
    and with ``unit_rows`` the byte offset where every unit of that many rows starts, plus the file's
    end: unit k is ``bytes[starts[k]:starts[k + 1]]``, and its checksum is that range's. A corpus of
    10^8 lines is planned in constant memory and each unit later reads only its own bytes, not the
    whole file. A compressed file's units are line ranges (``read_line_range``): its checksums are
    of the decompressed ranges, and no byte offsets are kept."""
    rows, size, last = 0, 0, b"\n"
    starts, sums, digest = ([0], [], hashlib.sha256()) if unit_rows else (None, None, None)
    with open_lines(url) as f:
        while chunk := f.read(TEXT_CHUNK):
            if unit_rows:
                ends = np.flatnonzero(np.frombuffer(chunk, np.uint8) == ord("\n"))  # (N,) newline positions
                lines_done = rows + 1 + np.arange(len(ends))  # lines complete after each newline
                cuts = (1 + ends[lines_done % unit_rows == 0]).tolist()  # unit starts inside this chunk
                at = 0
                for cut in cuts:  # each closes the unit before it
                    digest.update(chunk[at:cut])
                    sums.append(digest.hexdigest()[:32])
                    digest, at = hashlib.sha256(), cut
                digest.update(chunk[at:])
                starts.extend(size + c for c in cuts)
                rows += len(ends)
            else:
                rows += chunk.count(b"\n")
            size, last = size + len(chunk), chunk[-1:]
    if last != b"\n":
        rows += 1  # a last line without a newline
    if not unit_rows:
        return TextLayout(rows)
    units = -(-rows // unit_rows)
    sums = (sums + [digest.hexdigest()[:32]])[:units]  # a start at the very end (a final newline) holds no row
    starts = None if compression_of(url) else starts[:units] + [size]
    return TextLayout(rows, starts, sums)
