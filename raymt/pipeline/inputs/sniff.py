"""What a text input really is, from its first bytes: UTF-8 text (a byte-order mark allowed), or
something the job must refuse by name before any work rather than translate as garbage.

    refusal(path, head)   # None: read it as UTF-8 text lines; else the one-line reason

    compression_refusal(path, raw_head, "gzip")   # a file named .gz: None if it starts as gzip does

Refused: UTF-16 / UTF-32 (by their byte-order marks, or by NULs at every other byte), compressed
or binary formats read as plain text (by their magic bytes), and NUL-heavy data. A file named
``.gz``, ``.bz2``, ``.xz`` or ``.zst`` is decompressed as it is read (``pipeline/formats.py``): its
own first bytes must be that compression's, and its decompressed head is checked as above. A UTF-8
file with a few invalid bytes is text: those rows are reported one by one (``workers/text/inputs.py``).
Pure: no IO.
"""
from __future__ import annotations

HEAD_BYTES = 1 << 16  # bytes of a file looked at
UTF8_BOM = b"\xef\xbb\xbf"

_BOMS = (  # longest first: UTF-32 LE starts with UTF-16 LE's mark
    (b"\xff\xfe\x00\x00", "UTF-32LE"), (b"\x00\x00\xfe\xff", "UTF-32BE"),
    (b"\xff\xfe", "UTF-16LE"), (b"\xfe\xff", "UTF-16BE"),
)
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
_READABLE = {b"\x1f\x8b": ".gz", b"BZh": ".bz2", b"\xfd7zXZ\x00": ".xz", b"\x28\xb5\x2f\xfd": ".zst"}
_MAGIC = (
    (b"\x1f\x8b", "gzip-compressed", "gunzip -k {path}"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "zstd -d {path}"),
    (b"BZh", "bzip2-compressed", "bunzip2 -k {path}"),
    (b"\xfd7zXZ\x00", "xz-compressed", "xz -dk {path}"),
    (b"\x04\x22\x4d\x18", "lz4-compressed", "lz4 -d {path}"),
    (b"PK\x03\x04", "a zip archive", "unzip {path}"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive", "7z x {path}"),
    (b"PAR1", "Parquet data", "name it .parquet"),
    (b"\x7fELF", "an executable (ELF)", None),
    (b"%PDF-", "a PDF document", None),
)


def refusal(path: str, head: bytes) -> str | None:
    """Why the text input ``path``, whose first bytes are ``head``, cannot be read as UTF-8 lines;
    None if it can."""
    for mark, encoding in _BOMS:
        if head.startswith(mark):
            return _convert(path, encoding, "byte-order mark")
    for magic, kind, fix in _MAGIC:
        if head.startswith(magic) and not _mostly_text(head):
            how = f": {fix.format(path=path)} first" if fix else ""
            suffix = _READABLE.get(magic)
            reads = f"name it {suffix} to have it decompressed as it is read" if suffix else \
                "the job reads plain UTF-8 text, a sentence a line"
            return f"{path} is {kind}, not text{how} ({reads})"
    sample = head[:4096]
    if len(sample) >= 4:
        even, odd = sample[0::2], sample[1::2]
        if odd.count(0) > 0.4 * len(odd) and even.count(0) < 0.05 * len(even):
            return _convert(path, "UTF-16LE", "NUL at every other byte")
        if even.count(0) > 0.4 * len(even) and odd.count(0) < 0.05 * len(odd):
            return _convert(path, "UTF-16BE", "NUL at every other byte")
    if head.count(0) > max(1, len(head) // 100):
        return (f"{path} holds binary data ({head.count(0)} NUL bytes in its first {len(head)}), not text; the job "
                f"reads plain UTF-8 text, a sentence a line")
    return None


def compression_refusal(path: str, raw_head: bytes, compression: str) -> str | None:
    """Why ``path``, named as ``compression`` (gzip, bz2, xz, zstd) data, cannot be decompressed as
    such: its first bytes are not that format's (None if they are, or the file is empty)."""
    magic = next(m for m, kind in _COMPRESSED.items() if kind == compression)
    if not raw_head or raw_head.startswith(magic):
        return None
    return (f"{path} is named as {compression}-compressed but is not {compression} data (it starts with "
            f"{raw_head[:6]!r}): recompress it, or name it for what it is")


def _convert(path: str, encoding: str, sign: str) -> str:
    return (f"{path} is {encoding} text ({sign}), not UTF-8: convert it first, e.g. "
            f"iconv -f {encoding} -t UTF-8 {path} > {path}.utf8.txt")


def _mostly_text(head: bytes) -> bool:
    """Whether ``head`` decodes as UTF-8 (a text line that happens to start with, say, "BZh")."""
    try:
        head[:-4].decode("utf-8") if len(head) > 8 else head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return head.count(0) == 0
