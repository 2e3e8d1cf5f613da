"""Bad input row by row: statuses and reasons, never an exception; long texts cut to fit."""
from __future__ import annotations

import pytest

from raymt.workers.text.inputs import (EMPTY, MAX_ROW_CHARS, NORMALISED, NULL, OK, SPLIT, TOO_LONG, clean_text,
                                  split_to_fit)


@pytest.mark.parametrize("value, text, status", [
    ("Ein Hund läuft.", "Ein Hund läuft.", OK),
    ("  Ein Hund.  ", "Ein Hund.", OK),
    (None, "", NULL),
    ("", "", EMPTY),
    (" \t \n", "", f"{NORMALISED}+{EMPTY}"),
    ("Ein\x00 Hund\x07 läuft.", "Ein Hund läuft.", NORMALISED),
    ("Ein\tHund\nläuft.", "Ein Hund läuft.", NORMALISED),
    ("Ein Hund \ud800läuft.", "Ein Hund ?läuft.", NORMALISED),
    (b"Ein Hund l\xe4uft.", "Ein Hund l\ufffduft.", NORMALISED),
    ("Ein Hund l\ufffduft.".encode(), "Ein Hund l\ufffduft.", OK),  # a real U+FFFD is not an error
    ("\u200bEin\ufeff Hund.", "Ein Hund.", NORMALISED),
])
def test_clean_text(value, text: str, status: str) -> None:
    c = clean_text(value)
    assert (c.text, c.status) == (text, status)
    assert bool(c.reason) == (status != OK)
    assert c.translatable == (EMPTY not in status and NULL not in status)


def test_a_row_over_the_row_limit_is_too_long_before_any_other_work() -> None:
    from raymt.workers.text.rows import prepare_rows

    c = clean_text("Ein\x07 Hund läuft.", max_chars=10)
    assert (c.text, c.status, c.reason, c.translatable) == ("", TOO_LONG, "16 characters, more than --max-row-chars 10",
                                                            False)
    assert clean_text(b"\xff" * 11, max_chars=10).status == TOO_LONG  # characters, as decoded
    assert clean_text(" " * 11, max_chars=10).status == EMPTY and clean_text("x" * 10, max_chars=10).status == OK
    assert clean_text("x" * 10**6).status == OK  # clean_text alone: no limit
    rows = prepare_rows(["Ein Hund.", "x" * (MAX_ROW_CHARS + 1), "y" * MAX_ROW_CHARS], lambda s: [1], limit=512)
    assert rows.statuses == ["ok", TOO_LONG, "ok"] and rows.piece_row == [0, 2]  # the row path's default limit
    assert prepare_rows(["x" * (MAX_ROW_CHARS + 1)], lambda s: [1], 512, max_chars=0).statuses == ["ok"]


def words_plus_eos(text: str) -> int:
    return len(text.split()) + 1


def test_text_that_fits_is_one_piece() -> None:
    assert split_to_fit("a b c", words_plus_eos, 4).texts == ("a b c",)


def test_split_at_sentence_ends_then_spaces_keeps_every_word_in_order() -> None:
    text = "Eins zwei drei. Vier fünf sechs sieben acht neun zehn elf! Zwölf."
    pieces = split_to_fit(text, words_plus_eos, 5)
    assert pieces.statuses == (SPLIT,) and "split into" in pieces.reasons[0]
    assert all(words_plus_eos(p) <= 5 for p in pieces.texts)
    assert " ".join(pieces.texts).split() == text.split()
    assert pieces.texts == ("Eins zwei drei.", "Vier fünf sechs sieben", "acht neun zehn elf!", "Zwölf.")


def test_a_word_longer_than_the_limit_is_cut_by_characters() -> None:
    chars = lambda s: len(s) + 1  # noqa: E731 - one token per character + EOS
    pieces = split_to_fit("abcdefghij kl", chars, 4)
    assert all(chars(p) <= 4 for p in pieces.texts)
    assert "".join(pieces.texts).replace(" ", "") == "abcdefghijkl"
