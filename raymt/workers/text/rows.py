"""Rows in, rows out: the one path from a list of input cells to the pieces the decoder translates,
and from the pieces' hypotheses back to one translation per row. The job's encoder actors, the
Python API (``raymt.Translator``) and the Ray Data operator all go through it, so the same cell gives
the same translation and the same status whichever way it comes in.

Pure functions: the tokenizer comes in as ``encode(text) -> ids`` and ``decode_all(many) -> texts``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from raymt.workers.text.inputs import EMPTY, MAX_ROW_CHARS, SPLIT, CleanText, clean_text, raw_text, split_to_fit
from raymt.workers.search.selection import Hypothesis
from raymt.workers.text.sentences import Sentences, split_sentences


@dataclass(frozen=True, slots=True)
class PreparedRows:
    """Rows made ready to decode: per row a status and reason (``workers/text/inputs.py``), and the token
    ids of every piece to translate, in order (a row of several sentences, or one longer than the
    model's positions: several pieces; a row not translatable: none), with the whitespace that
    follows each piece in its row (its last piece: "")."""

    statuses: list[str]
    reasons: list[str]
    pieces: list[list[int]]
    piece_row: list[int]  # the row (index into the input) each piece belongs to
    piece_space: list[str]  # the source's whitespace after each piece, put back between its translations


def prepare_rows(cells: Sequence[str | bytes | None], encode: Callable[[str], list[int]] | Sequence[Callable],
                 limit: int, max_chars: int = MAX_ROW_CHARS, languages: str | Sequence[str | None] | None = None,
                 split: bool = True) -> PreparedRows:
    """Cells -> statuses and pieces. ``limit``: the model's positions (source ids, EOS included).
    ``encode``: one tokenizer call for every cell, or one per cell (per-row source languages).
    ``max_chars``: the row limit (0: none); a longer cell is ``too_long``, not encoded or decoded.
    ``split``: a row of several sentences is cut into them (``workers/text/sentences.py``, by the rules of
    ``languages``: one code, or one per cell), each a piece, status ``split``; a sentence (or, with
    ``split`` off, a row) longer than ``limit`` is cut to fit as well (``split_to_fit``)."""
    out = PreparedRows([], [], [], [], [])
    for i, cell in enumerate(cells):
        encode_cell = encode if callable(encode) else encode[i]
        language = languages if languages is None or isinstance(languages, str) else languages[i]
        c = clean_text(cell, max_chars)
        sentences = split_sentences(raw_text(cell), language) if split and c.translatable else None
        if sentences is not None and len(sentences.texts) > 1:
            status, reason = _add_sentences(out, i, sentences, encode_cell, limit)
        else:
            status, reason = _add_text(out, i, c, encode_cell, limit, language)
        out.statuses.append(CleanText("", status).status)
        out.reasons.append("; ".join(dict.fromkeys(reason)))
    return out


def _add_text(out: PreparedRows, row: int, c: CleanText, encode: Callable[[str], list[int]], limit: int,
              language: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """One cleaned text's pieces (none where it is not translatable; several where it does not fit)."""
    ids = encode(c.text) if c.translatable else []
    if len(ids) > limit:  # longer than the model's positions: cut into pieces that fit
        cut = split_to_fit(c.text, lambda s: len(encode(s)), limit, language)
        out.pieces.extend(encode(text) for text in cut.texts)
        out.piece_row.extend([row] * len(cut.texts))
        out.piece_space.extend(cut.spaces)
        return (*c.statuses, *cut.statuses), (*c.reasons, *cut.reasons)
    if ids:
        out.pieces.append(ids)
        out.piece_row.append(row)
        out.piece_space.append("")
    return c.statuses, c.reasons


def _add_sentences(out: PreparedRows, row: int, sentences: Sentences, encode: Callable[[str], list[int]],
                   limit: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A row's sentences, each cleaned and cut to fit on its own; the source's whitespace after each."""
    statuses, reasons = [SPLIT], [f"{len(sentences.texts)} sentences"]
    for text, space in zip(sentences.texts, sentences.separators):
        st, why = _add_text(out, row, clean_text(text), encode, limit, None)
        statuses += [x for x in st if x != EMPTY]  # (a sentence of control characters only: nothing to say)
        reasons += [x for x in why if x != "empty or whitespace only"]
        if out.piece_row and out.piece_row[-1] == row:
            out.piece_space[-1] = space
    return tuple(dict.fromkeys(statuses)), tuple(reasons)


@dataclass(frozen=True, slots=True)
class JoinedRows:
    """One translation per row, and the rows' n-best as flat lists (row r's entries are
    ``nbest_text[offsets[r]:offsets[r + 1]]``: flat, so an Arrow list column is built without a
    Python object per hypothesis)."""

    texts: list[str]
    scores: list[float]
    nbest_text: list[str]
    nbest_score: list[float]
    offsets: list[int]  # len(texts) + 1

    def nbest(self, row: int) -> list[tuple[str, float]]:
        a, b = self.offsets[row], self.offsets[row + 1]
        return list(zip(self.nbest_text[a:b], self.nbest_score[a:b]))


def join_rows(rows: int, piece_row: Sequence[int], hyps: Sequence[Sequence[Hypothesis]],
              decode_all: Callable[[list], list[str]], piece_space: Sequence[str] | None = None) -> JoinedRows:
    """Each piece's hypotheses (best first) -> each row's translation. A row of one piece: its best
    hypothesis and its n-best; a row of several pieces (its sentences, or cuts of a row too long):
    their best joined with the whitespace that followed each in the source (``piece_space``; None: a
    space), its score the sum of theirs (the log-probability of the joined translation under
    length-normalised scoring per sentence), and that one as its n-best; a row with no piece (not
    translatable): "" and no n-best. Every hypothesis is detokenised in one ``decode_all`` call."""
    flat = [x for h in hyps for x in h]  # every piece's n-best, in piece order
    texts = decode_all([x.tokens for x in flat])
    parts: list[list[tuple[int, int, str]]] = [[] for _ in range(rows)]  # per row: (first in flat, count, space)
    first = 0
    for k, (i, h) in enumerate(zip(piece_row, hyps)):
        parts[i].append((first, len(h), " " if piece_space is None else piece_space[k]))
        first += len(h)
    joined, scores, nbest_text, nbest_score, offsets = [], [], [], [], [0]
    for row in parts:
        if len(row) == 1:
            (a, c, _), = row
            joined.append(texts[a])
            scores.append(flat[a].score)
            nbest_text += texts[a: a + c]
            nbest_score += [x.score for x in flat[a: a + c]]
        elif row:
            joined.append("".join(texts[a] + space for a, _, space in row).strip())
            scores.append(sum(flat[a].score for a, _, _ in row))
            nbest_text.append(joined[-1])
            nbest_score.append(scores[-1])
        else:
            joined.append("")
            scores.append(0.0)
        offsets.append(len(nbest_text))
    return JoinedRows(joined, scores, nbest_text, nbest_score, offsets)
