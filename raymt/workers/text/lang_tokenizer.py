"""Tokenizers of the many-to-many models (M2M100, NLLB-200), matching HF's ``NllbTokenizer`` /
``NllbTokenizerFast`` and ``M2M100Tokenizer``, with ``MarianTokenizer``'s interface (``encode``,
``decode``, ``decode_all``, ``target_special``, vocabularies) plus language codes.

Source ids are ``[source language] pieces </s>`` (HF's current, non-legacy convention for both);
the target language is not part of the source: the decoder is forced to emit it first
(``forced_bos_token_id``, per row here: ``lang_id``).

Two directory styles, told apart by the files the model directory holds:

* NLLB: ``sentencepiece.bpe.model`` with fairseq's id offset (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2,
  ``<unk>`` 3; sentencepiece id i -> i + 1), language codes (``deu_Latn``) and ``<mask>`` after the
  pieces, their ids read from ``tokenizer.json`` (``added_tokens``) or ``tokenizer_config.json``
  (``added_tokens_decoder``).
* M2M100: ``vocab.json`` (piece -> id) + ``sentencepiece.bpe.model``; language codes ``__de__``
  numbered after the vocabulary in the order of fairseq's list (``language_codes`` of
  ``tokenizer_config.json``: "m2m100", the default, or "wmt21"), as HF numbers them.

Without ``sentencepiece.bpe.model``, ``tokenizer.json`` segments instead (``workers/text/tokenizer_json.py``:
transformers 5 saves NLLB's fast tokenizer only), giving the same ids and text: NLLB's vocabulary is
then the file's model vocabulary (HF's conversion already holds fairseq's offset), M2M100's is
``vocab.json``, or the file's model vocabulary when there is none.
"""
from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Sequence

import sentencepiece as spm

from raymt.workers.text.tokenizer import SPIECE_UNDERLINE, SpecialIds, load_vocab
from raymt.workers.text.tokenizer_json import TOKENIZER_JSON, JsonPieces, load_json_pieces

logger = logging.getLogger(__name__)
Reader = Callable[[str], "bytes | None"]
PieceModel = "spm.SentencePieceProcessor | JsonPieces"  # what segments: encode(text, out_type=str), decode_pieces

SPM_FILE = "sentencepiece.bpe.model"
MISSING_TOKENIZER = (f"checkpoint has no tokenizer: it needs {SPM_FILE} or {TOKENIZER_JSON} (transformers 5 saves "
                     f"only {TOKENIZER_JSON}: both work); copy one from the model it was fine-tuned from")

NLLB_CODE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")  # deu_Latn
M2M100_TOKEN = re.compile(r"^__[a-z]{2,3}__$")  # __de__
FAIRSEQ_OFFSET = 1  # NLLB: sentencepiece id i is model id i + 1
NLLB_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
# HF M2M100Tokenizer's fairseq lists: a code's id is len(vocab.json) + its index here
M2M100_CODES = {
    "m2m100": ("af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he "
               "hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no "
               "ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo "
               "zh zu").split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}
LISTED_CODES = 12  # codes an unknown-code error lists before counting the rest


class LanguageError(ValueError):
    """A language code missing, unknown, or given to a model without languages (one line)."""


class LanguageTokenizer:
    """SentencePiece + a piece -> id map + language codes (one vocabulary for source and target).

    ``piece_id``: a sentencepiece piece -> model id; ``id_piece``: the reverse for the ids a decode
    keeps (special tokens and language codes drop out); ``languages``: code -> id (codes as the
    user writes them: ``deu_Latn`` for NLLB, ``de`` for M2M100, which also accepts ``__de__``)."""

    def __init__(self, pieces: PieceModel, vocab: dict[str, int], languages: dict[str, int], special: SpecialIds,
                 *, style: str, dropped: Sequence[int] = ()) -> None:
        self.spm = pieces  # sentencepiece, or tokenizer.json's segmentation (``JsonPieces``)
        self.source_spm = self.target_spm = self.decode_spm = self.spm
        self.style = style  # "nllb" or "m2m100"
        self.vocab = vocab
        self.source_vocab = self.target_vocab = vocab
        self.languages = languages
        self.source_special = self.target_special = special
        self.separate_vocabs = False
        skip = {special.eos, special.unk, special.pad, *languages.values(), *dropped}
        self.kept_pieces = {i: p for p, i in vocab.items() if i not in skip}

    @property
    def source_vocab_size(self) -> int:
        return max(max(self.vocab.values()), max(self.languages.values(), default=0)) + 1

    target_vocab_size = source_vocab_size

    def lang_id(self, code: str) -> int:
        """A language code's id; ValueError with one line naming the valid codes."""
        key = code[2:-2] if self.style == "m2m100" and code.startswith("__") and code.endswith("__") else code
        if key in self.languages:
            return self.languages[key]
        raise LanguageError(f"unknown language code {code!r} for this {self.style} model; valid: {self.listed_codes()}")

    def knows(self, code: str) -> bool:
        """Whether ``lang_id`` takes ``code``."""
        key = code[2:-2] if self.style == "m2m100" and code.startswith("__") and code.endswith("__") else code
        return key in self.languages

    def listed_codes(self) -> str:
        """The first valid codes and their count, for one-line messages."""
        codes = sorted(self.languages)
        return ", ".join(codes[:LISTED_CODES]) + (f", ... ({len(codes)} codes)" if len(codes) > LISTED_CODES else "")

    def source_pieces(self, text: str) -> list[str]:
        return self.spm.encode(text, out_type=str)

    def _ids(self, text: str) -> list[int]:
        unk = self.source_special.unk
        return [self.vocab.get(p, unk) for p in self.spm.encode(text, out_type=str)]

    def encode(self, text: str, src_lang: str | None = None) -> list[int]:
        """Source text -> ``[src_lang] ids </s>`` (HF's ``input_ids``). Without a language: LanguageError
        (a caller that does not know about languages fails here, instead of translating wrongly)."""
        if src_lang is None:
            per_row_languages(self, None, 1, "source_lang")  # (raises, saying how to give it)
        return [self.lang_id(src_lang)] + self._ids(text) + [self.source_special.eos]

    def encode_target(self, text: str, tgt_lang: str | None = None) -> list[int]:
        """Target text -> ``[tgt_lang] ids </s>`` (HF ``text_target=``): the labels of a teacher-forced score."""
        return self.encode(text, tgt_lang)

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids -> text, special tokens and language codes skipped (``skip_special_tokens=True``)."""
        return self.decode_all([ids])[0]

    def decode_all(self, many: Sequence[Sequence[int]]) -> list[str]:
        """``decode`` of each id sequence, in one sentencepiece call."""
        if not many:
            return []
        kept = self.kept_pieces
        pieces = [[p for p in map(kept.get, ids) if p is not None] for ids in many]
        return [text.replace(SPIECE_UNDERLINE, " ").strip() for text in self.spm.decode_pieces(pieces)]


def per_row_languages(tokenizer, codes: str | Sequence[str] | None, n: int, name: str) -> list[str | None]:
    """One language code per text (``codes``: one for all, or one per text). A ``LanguageTokenizer``
    needs them (ValueError, one line, saying how to give them); a Marian tokenizer takes none (a
    multilingual Marian model reads ``>>xx<<`` in the text). Codes are checked by ``lang_id``."""
    if not isinstance(tokenizer, LanguageTokenizer):
        if codes is not None:
            raise LanguageError(f"{name} applies to M2M100 / NLLB models; this Marian model takes none "
                             "(a multilingual Marian model reads a >>xx<< prefix in the text)")
        return [None] * n
    if codes is None:
        example = "'fra_Latn'" if tokenizer.style == "nllb" else "'fr'"
        flag = "--" + name.replace("_lang", "-lang")
        raise LanguageError(f"this {tokenizer.style} model needs {name}: a code such as {example} or one per text "
                         f"(Translator.translate(..., source_lang=, target_lang=); on the command line {flag})")
    langs = [codes] * n if isinstance(codes, str) else list(codes)
    if len(langs) != n:
        raise LanguageError(f"{name}: {len(langs)} codes for {n} texts")
    if None in langs:
        flag = "--" + name.replace("_lang", "-lang")
        raise LanguageError(f"{name}: a text without a code (a per-row column's empty cell needs a default: {flag})")
    if len(set(langs)) == 1:
        tokenizer.lang_id(langs[0])  # (one code: the one-line unknown-code message)
        return langs
    bad = [(i, code) for i, code in enumerate(langs) if not tokenizer.knows(code)]
    if bad:
        shown = ", ".join(f"{i} ({code!r})" for i, code in bad[:LISTED_CODES]) + (" ..." if len(bad) > LISTED_CODES else "")
        raise LanguageError(f"{name}: unknown codes in {len(bad)} of {n} rows: {shown}; valid: {tokenizer.listed_codes()}")
    return langs


def row_language_problems(tokenizer, source_langs: Sequence[str | None] | None,
                          target_langs: Sequence[str | None] | None, default_source: str | None,
                          default_target: str | None) -> list[str | None] | None:
    """Per row, why its languages (a per-row column's cells, an empty one taking the default) cannot be
    used, or None: an unknown code, or no code at all. None when no row has per-row languages or the
    model is not an M2M100 / NLLB one (the job's own languages are checked once, at its start)."""
    if not isinstance(tokenizer, LanguageTokenizer) or (source_langs is None and target_langs is None):
        return None
    n = len(source_langs if source_langs is not None else target_langs)
    problems: list[str | None] = [None] * n
    for name, cells, default in (("target", target_langs, default_target), ("source", source_langs, default_source)):
        if cells is None:
            continue
        for i, cell in enumerate(cells):
            code = cell or default
            if problems[i] is not None:
                continue
            if code is None:
                problems[i] = f"no {name} language: an empty cell and no --{name}-lang default"
            elif not tokenizer.knows(code):
                problems[i] = f"unknown {name} language {code!r} ({len(tokenizer.languages)} codes: " \
                              f"{', '.join(sorted(tokenizer.languages)[:LISTED_CODES])}, ...)"
    return problems


def source_encoder(tokenizer, source_lang: str | None) -> Callable[[str], list[int]]:
    """``tokenizer.encode`` with the job's source language bound (M2M100 / NLLB; checked here, once)."""
    (lang,) = per_row_languages(tokenizer, source_lang, 1, "source_lang")
    return tokenizer.encode if lang is None else functools.partial(tokenizer.encode, src_lang=lang)


def _json(read: Reader, name: str) -> dict:
    raw = read(name)
    return json.loads(raw) if raw is not None else {}


def _added_tokens(read: Reader) -> dict[str, int]:
    """Added tokens (content -> id) of ``tokenizer.json``, else of ``tokenizer_config.json``."""
    added = {t["content"]: t["id"] for t in _json(read, "tokenizer.json").get("added_tokens", [])}
    if not added:
        decoder = _json(read, "tokenizer_config.json").get("added_tokens_decoder", {})
        added = {t["content"]: int(i) for i, t in decoder.items()}
    return added


def nllb_tokenizer(pieces: PieceModel, read: Reader) -> LanguageTokenizer:
    """NLLB's fairseq-offset vocabulary, its language codes' ids from the directory's tokenizer files."""
    vocab = pieces.vocab() if isinstance(pieces, JsonPieces) else _fairseq_vocab(pieces)
    vocab.update(NLLB_SPECIALS)
    added = _added_tokens(read)
    languages = {c: i for c, i in added.items() if NLLB_CODE.match(c)}
    if not languages:
        raise FileNotFoundError("NLLB tokenizer: no language codes (deu_Latn, ...) in tokenizer.json or "
                                "tokenizer_config.json")
    dropped = [NLLB_SPECIALS["<s>"]] + [i for c, i in added.items() if c == "<mask>"]
    special = SpecialIds(NLLB_SPECIALS["</s>"], NLLB_SPECIALS["<unk>"], NLLB_SPECIALS["<pad>"])
    return LanguageTokenizer(pieces, vocab, languages, special, style="nllb", dropped=dropped)


def _fairseq_vocab(proc: spm.SentencePieceProcessor) -> dict[str, int]:
    """Sentencepiece's pieces at fairseq's ids (id i -> i + 1; unknown and control pieces left out)."""
    return {proc.id_to_piece(i): i + FAIRSEQ_OFFSET for i in range(proc.get_piece_size())
            if not (proc.is_unknown(i) or proc.is_control(i))}


def m2m100_tokenizer(pieces: PieceModel, vocab_json: bytes | None, read: Reader) -> LanguageTokenizer:
    """M2M100's ``vocab.json`` (else, segmenting with tokenizer.json, that file's model vocabulary); codes
    ``__xx__`` numbered after it as HF's ``M2M100Tokenizer`` numbers them."""
    vocab = load_vocab(vocab_json) if vocab_json is not None else pieces.vocab()
    source = "vocab.json" if vocab_json is not None else f"{TOKENIZER_JSON}'s vocabulary"
    missing = [t for t in ("</s>", "<unk>", "<pad>") if t not in vocab]
    if missing:
        raise ValueError(f"{source} lacks special tokens {missing}")
    which = _json(read, "tokenizer_config.json").get("language_codes", "m2m100")
    if which not in M2M100_CODES:
        raise ValueError(f"tokenizer_config.json language_codes={which!r} (supported: {sorted(M2M100_CODES)})")
    languages = {c: len(vocab) + i for i, c in enumerate(M2M100_CODES[which])}
    special = SpecialIds(vocab["</s>"], vocab["<unk>"], vocab["<pad>"])
    dropped = [vocab[t] for t in ("<s>",) if t in vocab]
    return LanguageTokenizer(pieces, vocab, languages, special, style="m2m100", dropped=dropped)


def segmentation(read: Reader) -> PieceModel:
    """``sentencepiece.bpe.model`` when the directory has it, else ``tokenizer.json``'s segmentation;
    FileNotFoundError naming both when it has neither."""
    spm_model = read(SPM_FILE)
    if spm_model is not None:
        return spm.SentencePieceProcessor(model_proto=spm_model)
    raw = read(TOKENIZER_JSON)
    if raw is None:
        raise FileNotFoundError(MISSING_TOKENIZER)
    logger.info("no %s: segmenting with %s (the tokenizers library)", SPM_FILE, TOKENIZER_JSON)
    return load_json_pieces(raw)


def _m2m100_style(read: Reader, pieces: PieceModel, has_vocab_json: bool) -> bool:
    """M2M100 (else NLLB): a ``vocab.json`` unless ``tokenizer_config.json`` names NLLB's class; without
    one (tokenizer.json only), the class ``M2M100Tokenizer`` or added tokens ``__xx__``."""
    named = str(_json(read, "tokenizer_config.json").get("tokenizer_class", "")).lower()
    if "nllb" in named:
        return False
    if has_vocab_json:
        return True
    if not isinstance(pieces, JsonPieces):
        return False  # (sentencepiece without vocab.json: NLLB's fairseq ids)
    return "m2m100" in named or any(M2M100_TOKEN.match(c) for c in _added_tokens(read))


def load_language_tokenizer(read: Reader) -> LanguageTokenizer:
    """The tokenizer an M2M100 / NLLB directory's own files give (module docstring)."""
    read = functools.cache(read)  # (tokenizer.json and tokenizer_config.json are read by several steps)
    pieces = segmentation(read)
    vocab_json = read("vocab.json")
    if _m2m100_style(read, pieces, vocab_json is not None):
        return m2m100_tokenizer(pieces, vocab_json, read)
    return nllb_tokenizer(pieces, read)
