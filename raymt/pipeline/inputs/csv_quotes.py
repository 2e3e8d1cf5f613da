"""Where a CSV file's quotes leave it: the quote state pyarrow's reader is in at the end of the file,
and a quoted field that ran on past its closing quote, read from the bytes as they stream past the
reader (``QuoteScan.feed``), so planning still reads the file once.

pyarrow (and RFC 4180) read a quote as special only at a field's start (the file's start, after a
delimiter or a line end), where it opens a quoted field, and inside a quoted field, where two quotes
are one quote and a single one closes the field; anywhere else a quote is text (``5'2"``). A run of
``k`` quotes then moves the state (outside / inside a quoted field) in one of three ways:

    k even                              keep    (inside: k/2 quotes; outside: text, or ``""``)
    k odd at a field's start            toggle  (outside: opens, inside: closes)
    k odd elsewhere                     -> outside (outside: text; inside: closes)

Algorithm: per block, every run's move as arrays; the state before a run is the state after the
last "-> outside" before it (or the block's starting state), flipped once per toggle since (a prefix
count); no Python loop over quotes. A run at the block's end waits for the next block (it may go on).

Two findings refuse a file: a quoted field still open at the end of the file (it
swallowed every record after its quote), and a quoted field that spans lines and whose closing quote
is followed by text, not a delimiter, a blank or a line end (a quote left open, closed by the next
quoted field's opening quote: the records between were swallowed), ``QuoteScan.never_closed`` and
``QuoteScan.ran_on``. A stray quote closed by a second
stray quote right before a line end reads as a legitimate multi-line field and cannot be told apart.
"""
from __future__ import annotations

from typing import IO

import numpy as np

QUOTE, COMMA, NEWLINE, RETURN, SPACE, TAB = b'"'[0], b","[0], b"\n"[0], b"\r"[0], b" "[0], b"\t"[0]
_STARTS = (COMMA, NEWLINE, RETURN)  # a byte after which a field starts
_ENDS = (COMMA, NEWLINE, RETURN, SPACE, TAB)  # a byte that may follow a closing quote
_BOM = b"\xef\xbb\xbf"  # skipped by the reader: the field after it starts the file
_SLICE = 1 << 24  # bytes scanned at a time (bounds the scan's arrays)


class QuoteScan:
    """The quote state of a CSV stream fed in order, and its first finding."""

    def __init__(self) -> None:
        self.offset = 0  # file offset of ``pending``'s first byte
        self.lines = 0  # line ends before ``offset``
        self.pending = b""  # bytes not scanned yet (a run of quotes that may go on)
        self.previous: int | None = None  # the byte before ``pending`` (None: the file's start)
        self.inside = False
        self.opened_line = 0  # the line (1-based) where the open quoted field's quote is
        self.ran_on: str | None = None  # a quoted field that ran on past its closing quote, in words
        self.ended = False

    @property
    def never_closed(self) -> bool:
        """Whether the stream ended (``feed(b"")``) inside a quoted field."""
        return self.ended and self.inside and self.ran_on is None

    def feed(self, data: bytes) -> None:
        """Scan the next bytes of the stream; ``b""`` ends it."""
        if self.ran_on is not None or self.ended:
            return
        if not data:
            self.ended = True
            self._scan(self.pending, final=True)
            return
        for at in range(0, len(data), _SLICE):
            self._scan(self.pending + data[at:at + _SLICE], final=False)

    def _scan(self, block: bytes, final: bool) -> None:
        if self.offset == 0 and self.previous is None:  # the file's start: a BOM, perhaps cut across reads
            if not final and len(block) < len(_BOM) and _BOM.startswith(block):
                self.pending = block
                return
            if block.startswith(_BOM):
                block, self.offset = block[len(_BOM):], len(_BOM)
        data = np.frombuffer(block, np.uint8)
        quotes = np.flatnonzero(data == QUOTE)
        keep = len(block)
        if not final and len(quotes) and quotes[-1] == len(block) - 1:  # a run at the end may go on
            first = np.flatnonzero(np.diff(quotes) != 1)
            keep = int(quotes[first[-1] + 1] if len(first) else quotes[0])
            quotes = quotes[quotes < keep]
        newlines = np.flatnonzero(data[:keep] == NEWLINE)
        if len(quotes):
            self._runs(data, quotes, newlines)
        self.lines += len(newlines)
        self.previous = int(data[keep - 1]) if keep else self.previous
        self.offset += keep
        self.pending = block[keep:]

    def _runs(self, data: np.ndarray, quotes: np.ndarray, newlines: np.ndarray) -> None:
        """Move the state through the block's runs of quotes (``quotes``: their positions in ``data``)."""
        heads = np.ones(len(quotes), bool)
        heads[1:] = quotes[1:] != quotes[:-1] + 1
        starts = quotes[heads]  # (R,) each run's first position
        lengths = np.diff(np.append(np.flatnonzero(heads), len(quotes)))  # (R,)
        before = np.where(starts > 0, data[np.maximum(starts - 1, 0)].astype(np.int16),
                          -1 if self.previous is None else self.previous)  # (R,) the byte before each run
        at_start = np.isin(before, _STARTS) | (before == -1)
        odd = lengths % 2 == 1
        toggle, reset = odd & at_start, odd & ~at_start
        index = np.arange(len(starts))
        last_reset = np.maximum.accumulate(np.where(reset, index, -1))  # (R,) inclusive
        since = np.concatenate(([-1], last_reset[:-1]))  # the last reset before each run
        toggles = np.cumsum(toggle)  # (R,) inclusive
        flips = toggles - toggle - np.where(since >= 0, toggles[np.maximum(since, 0)], 0)
        inside_before = np.where(since >= 0, False, self.inside) ^ (flips % 2 == 1)
        inside_after = np.where(reset, False, inside_before ^ toggle)
        opens = ~inside_before & inside_after
        opened_at = np.maximum.accumulate(np.where(opens, index, -1))  # (R,) the last opening run so far

        def line_of(at: np.ndarray) -> np.ndarray:  # the 1-based lines of positions in ``data``
            return self.lines + 1 + np.searchsorted(newlines, at)

        ends = starts + lengths
        follows = data[np.minimum(ends, len(data) - 1)]
        suspects = np.flatnonzero(inside_before & ~inside_after & (ends < len(data)) & ~np.isin(follows, _ENDS))
        if len(suspects):  # closing quotes followed by text: those of fields that span lines ran on
            opened = opened_at[suspects]
            open_lines = np.where(opened >= 0, line_of(starts[np.maximum(opened, 0)]), self.opened_line)
            close_lines = line_of(starts[suspects])
            if (ran_on := np.flatnonzero(close_lines > open_lines)).size:
                run, first = int(suspects[ran_on[0]]), int(ran_on[0])
                text = (bytes(data[ends[run]:ends[run] + 12]).decode("utf-8", "replace").splitlines() or [""])[0]
                self.ran_on = (f"a quote opened on line {int(open_lines[first])} closes on line "
                               f"{int(close_lines[first])} with text after it ({text!r}), not a delimiter or a "
                               f"line end: a quote left open swallowed the lines between")
                return
        self.inside = bool(inside_after[-1])
        if opened_at[-1] >= 0:
            self.opened_line = int(line_of(starts[opened_at[-1]]))


class Tap:
    """A binary file whose bytes, as they are read, are fed to ``scan`` (``QuoteScan.feed``)."""

    def __init__(self, f: IO[bytes], scan: QuoteScan) -> None:
        self._f, self._scan = f, scan

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self._scan.feed(data)
        return data

    def drain(self) -> None:
        """Read (and scan) the rest of the file."""
        while self.read(_SLICE):
            pass

    @property
    def closed(self) -> bool:
        return self._f.closed

    def __getattr__(self, name: str):
        return getattr(self._f, name)
