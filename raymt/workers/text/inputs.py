"""Bad input, row by row: every row gets a translation (possibly empty) and a status, never an exception.

Statuses (joined with ``+`` when several apply, e.g. ``normalised+split``):

* ``ok``          translated as given;
* ``null``        the text was null (or missing): empty translation;
* ``empty``       empty or whitespace only: empty translation, the model is not run;
* ``normalised``  invalid UTF-8 replaced by U+FFFD, control characters removed (tab / newline ->
                  space); the cleaned text is translated and the reason says what changed;
* ``split``       several sentences (``workers/text/sentences.py``), or longer than the model's
                  positions: cut into sentences (an over-long sentence at spaces, a word by
                  characters), each translated, the translations joined with the whitespace that
                  stood between them in the source. The reason gives the count. Nothing is dropped.
* ``too_long``    more characters than the row limit (``--max-row-chars``, ``MAX_ROW_CHARS`` by
                  default; 0: none): empty translation, the model is not run, the reason gives the
                  row's length. A row that long is a document or a data blob, not a sentence or a
                  paragraph: decoding it would hold its decoder for minutes to hours (a line of
                  megabytes: hours); raise the limit to translate it anyway.

Pure functions: no model, no IO. ``token_count`` is the tokenizer's length of a text (EOS included).
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Callable

from raymt.workers.text.sentences import split_sentences

OK, NULL, EMPTY, NORMALISED, SPLIT, TOO_LONG = "ok", "null", "empty", "normalised", "split", "too_long"
# Characters a row may hold and still be translated: a long paragraph (1,000-5,000 characters, a
# few hundred to a thousand tokens) passes with room to spare; 20,000 characters (about 4,400
# tokens of German prose) decode in 8 s with the demo model on one core, a full-size model several
# times that; 200,000 took 51 s with the demo model: past the limit a row holds its decoder minutes.
MAX_ROW_CHARS = 20_000
_SPACE_LIKE = {"\t", "\n", "\r", "\x0b", "\x0c", "\x85", "\u2028", "\u2029"}


@dataclass(frozen=True, slots=True)
class CleanText:
    """A row's text made safe to translate; ``statuses`` empty means ``ok``."""

    text: str
    statuses: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        return "+".join(self.statuses) or OK

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def translatable(self) -> bool:
        return not ({NULL, EMPTY, TOO_LONG} & set(self.statuses))


def too_long(text: str, max_chars: int) -> str | None:
    """Why ``text`` is over the row limit ``max_chars`` (0: no limit), or None."""
    if max_chars and len(text) > max_chars and text.strip():
        return f"{len(text)} characters, more than --max-row-chars {max_chars}"
    return None


def clean_text(value: str | bytes | None, max_chars: int = 0) -> CleanText:
    """One input cell -> CleanText. ``bytes`` are decoded as UTF-8 with replacement. A text over
    ``max_chars`` characters (0: no limit) is ``too_long``, checked before any other work on it."""
    if value is None:
        return CleanText("", (NULL,), ("text is null",))
    statuses, reasons = [], []
    if isinstance(value, bytes):
        text = value.decode("utf-8", errors="replace")
        if reason := too_long(text, max_chars):
            return CleanText("", (TOO_LONG,), (reason,))
        if "\ufffd" in text and b"\xef\xbf\xbd" not in value:
            statuses.append(NORMALISED)
            reasons.append("invalid UTF-8 replaced with U+FFFD")
    elif reason := too_long(value, max_chars):
        return CleanText("", (TOO_LONG,), (reason,))
    else:
        text = value.encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates -> '?'
        if text != value:
            statuses.append(NORMALISED)
            reasons.append("unencodable characters (lone surrogates) replaced")
    removed = sum(1 for ch in text if _is_control(ch))
    if removed:
        text = "".join(" " if ch in _SPACE_LIKE else ch for ch in text if not _is_control(ch) or ch in _SPACE_LIKE)
        text = re.sub(r" {2,}", " ", text)
        if NORMALISED not in statuses:
            statuses.append(NORMALISED)
        reasons.append(f"{removed} control character(s) removed or turned into spaces")
    if not text.strip():
        return CleanText("", (*statuses, EMPTY), (*reasons, "empty or whitespace only"))
    return CleanText(text.strip(), tuple(statuses), tuple(reasons))


def raw_text(value: str | bytes | None) -> str:
    """A cell as text before any cleaning (its whitespace as written): what the sentence splitter reads."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value.encode("utf-8", errors="replace").decode("utf-8")


def _is_control(ch: str) -> bool:
    return ch in _SPACE_LIKE or unicodedata.category(ch) in ("Cc", "Cs", "Co") or ch in "\u200b\ufeff"


@dataclass(frozen=True, slots=True)
class Pieces:
    """A text cut into pieces that each fit the model, the whitespace after each (the last: ""), and
    whether it was split / truncated."""

    texts: tuple[str, ...]
    spaces: tuple[str, ...] = ("",)
    statuses: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


def split_to_fit(text: str, token_count: Callable[[str], int], limit: int, language: str | None = None) -> Pieces:
    """Cut ``text`` into consecutive pieces of at most ``limit`` tokens each.

    Algorithm: a text over the limit is cut into its sentences (``workers/text/sentences.py``, by the
    rules of ``language``), one sentence a piece (what sentence-level models such as OPUS-MT
    translate best); a sentence still over the limit is cut at spaces, its words packed greedily
    into pieces that fit. A single word over the limit is cut by characters (binary search on the
    longest prefix that fits; ``limit`` must fit one character, true of any sentencepiece model
    with limit >= 8).
    """
    if token_count(text) <= limit:
        return Pieces((text,))
    sentences = split_sentences(text, language)
    pieces: list[str] = []  # whole sentences, or chunks of one over-long sentence's words
    spaces: list[str] = []
    for sentence, space in zip(sentences.texts, sentences.separators):
        if token_count(sentence) <= limit:
            chunks = [sentence]
        else:
            words = [w for word in sentence.split() for w in _cut_word(word, token_count, limit)]
            chunks = _pack(words, token_count, limit)
        pieces += chunks
        spaces += [" "] * (len(chunks) - 1) + [space]
    return Pieces(tuple(pieces), tuple(spaces), (SPLIT,),
                  (f"{token_count(text)} tokens > {limit}: split into {len(pieces)} pieces",))


def _pack(parts: list[str], token_count: Callable[[str], int], limit: int) -> list[str]:
    """Join consecutive parts with spaces while the joined text fits."""
    pieces: list[str] = []
    for part in parts:
        joined = f"{pieces[-1]} {part}" if pieces else part
        if pieces and token_count(joined) <= limit:
            pieces[-1] = joined
        else:
            pieces.append(part)
    return pieces


def _cut_word(word: str, token_count: Callable[[str], int], limit: int) -> list[str]:
    out = []
    while word:
        if token_count(word) <= limit:
            out.append(word)
            break
        lo, hi = 1, len(word)  # largest prefix that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if token_count(word[:mid]) <= limit else (lo, mid - 1)
        out.append(word[:lo])
        word = word[lo:]
    return out
