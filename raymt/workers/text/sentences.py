"""A row's text cut into sentences, with the whitespace between them kept to rejoin it exactly.

Sentence-level models (OPUS-MT, NLLB-200, M2M100) translate one sentence at a time: given a
paragraph they translate a sentence or two and drop or merge the rest. So every row is cut into
its sentences; each is translated on its own (the sentences of all rows share the decoder's
slots), and the translations are joined with the whitespace that stood between the sources (a
space, a newline, a blank line, indentation), so a row's structure comes back as it was written.

The boundaries come from ``sentencex`` (rule-based, ~250 languages, per-language non-breaking
prefixes, no model download), chosen by the source language, then three repairs that only ever
join (a missed split costs a little quality; a wrong one cuts a sentence in two):

* an abbreviation or an initial before the cut (``Dr.``, ``M.``, ``Nr.``, ``z.``, ``I.``): joined;
* a one- or two-digit number before the cut (an ordinal: ``3. Oktober``, ``das 2. Buch``): joined;
* a piece that starts in lower case (``bzw. nicht``): no sentence starts so; joined.

And one cut the segmenter does not make: after a word's full stop before a number (``... landscape.
2 girls sit ...``), where the word is not an abbreviation (``Abs. 3``) or a number (``am 3. 4 Leute``).

A blank line always ends a sentence, whatever precedes it (a heading, a list item). A text with
no blank line and no sentence end followed by more text (``[.!?…]`` or a CJK full stop, then a space or
a closing quote or bracket, then text) is one sentence without calling the segmenter, so a row of
one sentence is never touched. Pure: no model, no IO.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# A sentence end somewhere before the text's end: the only texts worth segmenting.
_INNER_END = re.compile(r"[.!?…。！？]+[\"'”’»)\]]*\s+\S|[。！？]\S")
_BLANK_LINE = re.compile(r"(\n[^\S\n]*\n\s*)")
_BEFORE_NUMBER = re.compile(r"(?<=[^\W\d_]{2}[.!?])\s+(?=\d)")
_LAST_TOKEN = re.compile(r"(\S+)\s*$")
_ORDINAL = re.compile(r"^\(?\d{1,2}\.$")
_INITIAL = re.compile(r"^\(?\w\.$")
# Abbreviations that sentencex cuts after in one of the languages it is commonly given (titles,
# units of legal texts, Latin and German short forms); compared case-folded, with the full stop.
ABBREVIATIONS = frozenset("""
    dr. prof. mr. mrs. ms. st. jr. sr. no. nos. nr. abs. art. hr. hrn. fr. frl. bzw. vgl. ca. evtl. ggf.
    inkl. incl. zzgl. bspw. sog. geb. gest. str. tel. bd. bde. kap. jh. jhd. mio. mrd. min. max. co. corp. inc. ltd. vs.
    m. mm. mme. mmes. mlle. mlles. mgr. me. pr. cf. p. pp. ex. fig. figs. vol. ed. eds. ch. sec. dept. gen. gov.
    jan. feb. mar. apr. jun. jul. aug. sep. sept. oct. nov. dec. okt. dez. z. b. d. h. u. a. s. o. e. i.
""".split())


@dataclass(frozen=True, slots=True)
class Sentences:
    """A text as its sentences (outer whitespace stripped) and the whitespace after each as written
    (the last one's: ""); ``"".join(s + w for s, w in zip(texts, separators))`` is the text stripped."""

    texts: tuple[str, ...]
    separators: tuple[str, ...]

    def join(self, translations: list[str]) -> str:
        """The translations of ``texts``, in order, with the source's whitespace between them."""
        return "".join(t + w for t, w in zip(translations, self.separators))


def splitter_language(code: str | None) -> str:
    """The segmenter's language for a model's or row's code: ISO 639-1 as given (``de``), NLLB's
    ``deu_Latn`` and M2M100's ``__de__`` mapped, anything unknown (``mul``, None) to English rules."""
    if not code:
        return "en"
    code = code.strip("_").split("_")[0].split("-")[0].lower()
    return _ISO3.get(code, code) if len(code) == 3 else code or "en"


def split_sentences(text: str, language: str | None = None) -> Sentences:
    """``text`` (stripped) cut into sentences by the rules of ``language`` (``splitter_language``)."""
    text = text.strip()
    blocks = _BLANK_LINE.split(text)  # a blank line always ends a sentence (a paragraph, a heading, a list)
    if len(blocks) == 1 and not _INNER_END.search(text):
        return Sentences((text,), ("",))
    language = splitter_language(language)
    pieces = [p for k, block in enumerate(blocks) for p in
              ((block,) if k % 2 else _segment(language, block) if _INNER_END.search(block) else (block,))]
    texts: list[str] = []
    separators: list[str] = []
    for piece in pieces:
        body = piece.rstrip()
        space = piece[len(body):]
        if not body:  # whitespace alone (a blank line): it belongs between the sentences around it
            if separators:
                separators[-1] += space
            continue
        if texts and _joins(texts[-1], body):
            texts[-1] += separators[-1] + body
            separators[-1] = space
            continue
        texts.append(body)
        separators.append(space)
    if not texts:
        return Sentences((text,), ("",))
    separators[-1] = ""
    texts, separators = _cut_before_numbers(texts, separators)
    return Sentences(tuple(texts), tuple(separators))


def _cut_before_numbers(texts: list[str], separators: list[str]) -> tuple[list[str], list[str]]:
    """Sentences the segmenter left joined where the next one opens with a number (``... landscape. 2
    girls sit ...``): cut after a word's full stop (not an abbreviation's or a number's)."""
    out_texts: list[str] = []
    out_spaces: list[str] = []
    for text, space in zip(texts, separators):
        start = 0
        for m in _BEFORE_NUMBER.finditer(text):
            token = _LAST_TOKEN.search(text[start:m.start()])
            if token is None or token.group(1).lower().lstrip("(") in ABBREVIATIONS or _ORDINAL.match(token.group(1)):
                continue
            out_texts.append(text[start:m.start()])
            out_spaces.append(m.group(0))
            start = m.end()
        out_texts.append(text[start:])
        out_spaces.append(space)
    return out_texts, out_spaces


def _joins(before: str, after: str) -> bool:
    """Whether a cut between ``before`` and ``after`` splits one sentence (the repairs above)."""
    if after[0].islower():
        return True
    last = _LAST_TOKEN.search(before)
    token = last.group(1) if last else ""
    return token.lower().lstrip("(") in ABBREVIATIONS or bool(_ORDINAL.match(token) or _INITIAL.match(token))


def _segment(language: str, text: str) -> tuple[str, ...]:
    from sentencex import segment
    return tuple(segment(language, text))


_ISO3 = {"deu": "de", "ger": "de", "eng": "en", "fra": "fr", "fre": "fr", "spa": "es", "ita": "it", "por": "pt",
         "nld": "nl", "dut": "nl", "pol": "pl", "ces": "cs", "cze": "cs", "rus": "ru", "ukr": "uk", "swe": "sv",
         "dan": "da", "nob": "nb", "nno": "nn", "fin": "fi", "est": "et", "lvs": "lv", "lit": "lt", "hun": "hu",
         "ron": "ro", "rum": "ro", "bul": "bg", "ell": "el", "gre": "el", "tur": "tr", "ara": "ar", "arb": "ar",
         "heb": "he", "pes": "fa", "fas": "fa", "hin": "hi", "ben": "bn", "urd": "ur", "zho": "zh", "chi": "zh",
         "jpn": "ja", "kor": "ko", "vie": "vi", "tha": "th", "ind": "id", "zsm": "ms", "msa": "ms", "cat": "ca",
         "eus": "eu", "glg": "gl", "slk": "sk", "slv": "sl", "hrv": "hr", "srp": "sr", "bos": "bs", "mkd": "mk",
         "isl": "is", "gle": "ga", "cym": "cy", "swh": "sw", "amh": "am", "tam": "ta", "tel": "te", "mar": "mr"}
