"""Bad input row by row: statuses and reasons, never an exception; long texts cut to fit."""
from __future__ import annotations

import pytest

from raymt.workers.inputs import EMPTY, NORMALISED, NULL, OK, SPLIT, clean_text, split_to_fit


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
