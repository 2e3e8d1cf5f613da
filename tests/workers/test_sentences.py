"""Sentence splitting: one sentence is never cut (abbreviations, ordinals, decimals, URLs, e-mail
addresses, ellipses, quotes), several are, and the whitespace between them comes back exactly."""
from __future__ import annotations

import pytest

from raymt.workers.text.inputs import split_to_fit
from raymt.workers.text.rows import join_rows, prepare_rows
from raymt.workers.search.selection import Hypothesis
from raymt.workers.text.sentences import split_sentences, splitter_language
from tests.conftest import shared_path

ONE_SENTENCE = {
    "de": ["Das ist z. B. ein Test.", "Dr. Müller kam am 3. Oktober 2023 an.", "Er zahlte ca. 3,50 € bzw. 4 €.",
           "Das 2. Buch, d. h. der Roman, kam am 1. Mai.", "Siehe https://example.com/a.b und max@test.de bitte.",
           "Version 2.0 kostet 1.299,00 Euro.", "Nr. 5 und Abs. 3 gelten, vgl. Art. 7.", "Hr. Meier und Fr. Müller.",
           "Er sagte: „Komm her!“", "Es war spät... sehr spät.", "Die Werte (ca. 5 Std.) sind gut.",
           "Prof. Dr. I. Kant schrieb es."],
    "en": ["Mr. Smith went to Washington on Jan. 5 at 3.30 p.m.", "Dr. Who paid $3.50, i.e. not much.",
           "See https://example.org/x.html or mail bob@example.com now.", "It was e.g. fine... mostly.",
           "He said \"Stop.\" and left.", "Prof. Smith, No. 5, was there."],
    "fr": ["M. Dupont est arrivé à 14 h.", "Mme. Curie et M. Dupont sont là.", "Il a payé 3,50 € p. ex. hier.",
           "Le 1. mai, etc. et cf. p. 5."],
}


@pytest.mark.parametrize("language,text", [(lang, t) for lang, texts in ONE_SENTENCE.items() for t in texts])
def test_one_sentence_is_never_cut(language, text):
    assert split_sentences(text, language).texts == (text,)


@pytest.mark.parametrize("language,text,sentences", [
    ("de", "Ein Hund läuft. Eine Katze schläft! Warum? Darum.", ["Ein Hund läuft.", "Eine Katze schläft!", "Warum?",
                                                                 "Darum."]),
    ("en", "A dog runs. A cat sleeps.", ["A dog runs.", "A cat sleeps."]),
    ("fr", "Un chien court. M. Dupont le regarde.", ["Un chien court.", "M. Dupont le regarde."]),
    ("de", "Er kam 2023. Dann ging er.", ["Er kam 2023.", "Dann ging er."]),
])
def test_several_sentences_are_cut(language, text, sentences):
    assert list(split_sentences(text, language).texts) == sentences


@pytest.mark.parametrize("text", [
    "Erster Satz. Zweiter Satz.",
    "Erster Satz.\nZweiter Satz.",
    "Erster Satz.\n\nZweiter Satz.\n\n\nDritter Satz.",
    "Erster Satz.\n    Eingerückt.\n\tMit Tab.",
    "Erster Satz.   Drei Leerzeichen.",
])
def test_the_whitespace_between_sentences_comes_back_exactly(text):
    s = split_sentences(text, "de")
    assert len(s.texts) > 1
    assert s.join(list(s.texts)) == text
    assert s.join([f"<{t}>" for t in s.texts]).replace("<", "").replace(">", "") == text


def test_a_blank_line_always_ends_a_sentence():
    text = "Einleitung\n\nDer Text beginnt. Er geht weiter.\n \n\tEine Liste ohne Punkt\nmit zwei Zeilen"
    s = split_sentences(text, "de")
    assert s.texts == ("Einleitung", "Der Text beginnt.", "Er geht weiter.", "Eine Liste ohne Punkt\nmit zwei Zeilen")
    assert s.separators == ("\n\n", " ", "\n \n\t", "") and s.join(list(s.texts)) == text


def test_outer_whitespace_is_not_part_of_a_sentence():
    s = split_sentences("  \n Ein Satz. Noch einer. \n", "de")
    assert s.texts == ("Ein Satz.", "Noch einer.") and s.separators == (" ", "")


@pytest.mark.parametrize("code,language", [("de", "de"), ("deu_Latn", "de"), ("__fr__", "fr"), ("fra_Latn", "fr"),
                                           ("zho_Hans", "zh"), (None, "en"), ("pt-BR", "pt")])
def test_model_and_row_codes_map_to_the_splitter_s_languages(code, language):
    assert splitter_language(code) == language


def test_a_200_sentence_row_keeps_every_sentence_and_its_whitespace():
    text = "\n".join(f"Satz Nummer {i} ist hier." + (" Noch einer." if i % 3 else "") for i in range(134))
    s = split_sentences(text, "de")
    assert len(s.texts) == 134 + sum(1 for i in range(134) if i % 3) and s.join(list(s.texts)) == text


def fake_encode(text: str) -> list[int]:
    return [len(w) for w in text.split()] + [0]


def test_prepared_rows_carry_each_sentence_and_the_space_after_it():
    cells = ["Ein Satz.\n\nZwei Sätze hier.", "Nur einer.", None, "Viel zu lang hier. Kurz."]
    p = prepare_rows(cells, fake_encode, limit=4, languages="de")
    assert p.statuses == ["split", "ok", "null", "split"]
    assert p.reasons[0] == "2 sentences" and p.reasons[3].startswith("2 sentences; ")
    assert p.piece_row == [0, 0, 1, 3, 3, 3]
    assert p.piece_space == ["\n\n", "", "", " ", " ", ""]
    off = prepare_rows(cells, fake_encode, limit=4, languages="de", split=False)
    assert off.statuses == ["normalised+split", "ok", "null", "split"]  # (its newlines: spaces; then too long)
    assert off.piece_row == [0, 0, 1, 3, 3, 3] and off.piece_space == [" ", "", "", " ", " ", ""]


def test_joined_rows_put_the_source_whitespace_back_and_sum_the_scores():
    hyps = [[Hypothesis((1,), -1.0, -1.0)], [Hypothesis((2,), -2.0, -2.0)],
            [Hypothesis((3,), -0.5, -0.5), Hypothesis((4,), -0.7, -0.7)]]
    words = {1: "One.", 2: "Two.", 3: "Three.", 4: "Four."}
    j = join_rows(2, [0, 0, 1], hyps, lambda many: [" ".join(words[t] for t in x) for x in many], ["\n\n", "", ""])
    assert j.texts == ["One.\n\nTwo.", "Three."] and j.scores == [-3.0, -0.5]
    assert j.nbest(0) == [("One.\n\nTwo.", -3.0)] and j.nbest(1) == [("Three.", -0.5), ("Four.", -0.7)]


def test_an_overlong_row_is_cut_by_the_same_splitter():
    pieces = split_to_fit("Dr. Müller kam heute. Er sah einen Hund.", lambda s: len(s.split()) + 1, 6, "de")
    assert pieces.texts == ("Dr. Müller kam heute.", "Er sah einen Hund.") and pieces.spaces == (" ", "")


@pytest.mark.parametrize("name,language", [("multi30k/test_2016_flickr.de", "de"), ("multi30k/test_2017_flickr.fr", "fr"),
                                           ("multi30k/test_2016_flickr.en", "en")])
def test_test_set_sentences_are_one_sentence_each(name, language):
    lines = shared_path(*name.split("/")).read_text().splitlines()
    assert [x for x in lines if len(split_sentences(x, language).texts) > 1] == []
