"""Rows in, rows out: the one path from a list of input cells to the pieces the decoder translates,
and from the pieces' hypotheses back to one translation per row. The job's encoder actors, the
Python API (``raymt.Translator``) and the Ray Data operator all go through it, so the same cell gives
the same translation and the same status whichever way it comes in.

Pure functions: the tokenizer comes in as ``encode(text) -> ids`` and ``decode_all(many) -> texts``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from raymt.workers.inputs import MAX_ROW_CHARS, CleanText, clean_text, split_to_fit
from raymt.workers.search import Hypothesis


@dataclass(frozen=True, slots=True)
class PreparedRows:
    """Rows made ready to decode: per row a status and reason (``workers/inputs.py``), and the token
    ids of every piece to translate (a row longer than the model's positions: several pieces, in
    order; a row not translatable: none)."""

    statuses: list[str]
    reasons: list[str]
    pieces: list[list[int]]
    piece_row: list[int]  # the row (index into the input) each piece belongs to


def prepare_rows(cells: Sequence[str | bytes | None], encode: Callable[[str], list[int]] | Sequence[Callable],
                 limit: int, max_chars: int = MAX_ROW_CHARS) -> PreparedRows:
    """Cells -> statuses and pieces. ``limit``: the model's positions (source ids, EOS included).
    ``encode``: one tokenizer call for every cell, or one per cell (per-row source languages).
    ``max_chars``: the row limit (0: none); a longer cell is ``too_long``, not encoded or decoded."""
    statuses, reasons, pieces, piece_row = [], [], [], []
    for i, cell in enumerate(cells):
        encode_cell = encode if callable(encode) else encode[i]
        c = clean_text(cell, max_chars)
        status, reason = c.statuses, c.reasons
        ids = encode_cell(c.text) if c.translatable else []
        if len(ids) > limit:  # longer than the model's positions: cut into pieces that fit
            cut = split_to_fit(c.text, lambda s: len(encode_cell(s)), limit)
            status, reason = (*status, *cut.statuses), (*reason, *cut.reasons)
            pieces += [encode_cell(text) for text in cut.texts]
            piece_row += [i] * len(cut.texts)
        elif ids:
            pieces.append(ids)
            piece_row.append(i)
        statuses.append(CleanText("", status).status)
        reasons.append("; ".join(reason))
    return PreparedRows(statuses, reasons, pieces, piece_row)


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
              decode_all: Callable[[list], list[str]]) -> JoinedRows:
    """Each piece's hypotheses (best first) -> each row's translation. A row of one piece: its best
    hypothesis and its n-best; a row cut into pieces: their best joined with a space (score: the
    sum), and that one as its n-best; a row with no piece (not translatable): "" and no n-best.
    Every hypothesis is detokenised in one ``decode_all`` call."""
    flat = [x for h in hyps for x in h]  # every piece's n-best, in piece order
    texts = decode_all([x.tokens for x in flat])
    parts: list[list[tuple[int, int]]] = [[] for _ in range(rows)]  # per row: its pieces' (first, count) in flat
    first = 0
    for i, h in zip(piece_row, hyps):
        parts[i].append((first, len(h)))
        first += len(h)
    joined, scores, nbest_text, nbest_score, offsets = [], [], [], [], [0]
    for row in parts:
        if len(row) == 1:
            (a, c), = row
            joined.append(texts[a])
            scores.append(flat[a].score)
            nbest_text += texts[a: a + c]
            nbest_score += [x.score for x in flat[a: a + c]]
        elif row:
            joined.append(" ".join(texts[a] for a, _ in row))
            scores.append(sum(flat[a].score for a, _ in row))
            nbest_text.append(joined[-1])
            nbest_score.append(scores[-1])
        else:
            joined.append("")
            scores.append(0.0)
        offsets.append(len(nbest_text))
    return JoinedRows(joined, scores, nbest_text, nbest_score, offsets)
