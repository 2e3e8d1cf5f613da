"""A sentencepiece segmentation read from HF's ``tokenizer.json`` (the ``tokenizers`` library), for the
M2M100 / NLLB directories that hold no ``sentencepiece.bpe.model`` (transformers 5 saves NLLB's fast
tokenizer only).

``JsonPieces`` offers the part of ``sentencepiece.SentencePieceProcessor`` the project calls
(``encode(text, out_type=str)``, ``decode_pieces``), so ``LanguageTokenizer`` maps its pieces through
the same vocabulary either way. It segments as the sentencepiece model the file was converted from:

* special added tokens are not matched in the text (``</s>``, ``deu_Latn`` or ``<mask>`` typed in a
  source are plain text, as sentencepiece reads them); language and special ids are the caller's. The
  others (HF's conversion of sentencepiece's user-defined pieces, which it emits whole) stay;
* no template (``post_processor``), truncation or padding: the caller adds ``[lang] ... </s>``;
* sentencepiece's ``remove_extra_whitespaces`` drops leading and trailing spaces; HF's conversion
  collapses runs of spaces but leaves the ends, where the pre-tokenizer then emits a lone ``▁``. A
  normaliser that collapses runs of spaces gets the ends' stripping added after it.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence

logger = logging.getLogger(__name__)

TOKENIZER_JSON = "tokenizer.json"
SPACE_RUNS = " {2,}"  # HF's conversion of sentencepiece's remove_extra_whitespaces (interior runs only)
STRIP_ENDS = {"type": "Replace", "pattern": {"Regex": r"\A +| +\z"}, "content": ""}
# A Marian directory segments source and target with two sentencepiece models (transformers saves
# both): one tokenizer.json cannot stand in for them, so such a directory is refused saying so.
MARIAN_JSON_NOTE = (" (a Marian model needs source.spm, target.spm and vocab.json; its tokenizer.json cannot "
                    "replace them: copy them from the model it was fine-tuned from)")


class TokenizerJsonError(ValueError):
    """A ``tokenizer.json`` the ``tokenizers`` library cannot use (one line)."""


class JsonPieces:
    """Pieces of a ``tokenizer.json``'s normaliser, pre-tokeniser and model; text from its decoder."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer without added tokens (``load_json_pieces``)

    def vocab(self) -> dict[str, int]:
        """The pieces' ids: the model's vocabulary and the non-special added tokens."""
        return self.tokenizer.get_vocab(with_added_tokens=True)

    def encode(self, text: str, out_type: type = str) -> list[str]:
        """The pieces of ``text`` (sentencepiece's ``encode(text, out_type=str)``); unknown characters
        come out as the model's unknown token."""
        if out_type is not str:
            raise TypeError("JsonPieces.encode gives pieces only (out_type=str)")
        return self.tokenizer.encode(text, add_special_tokens=False).tokens

    def decode_pieces(self, pieces: Sequence[str] | Sequence[Sequence[str]]) -> str | list[str]:
        """Pieces -> text, or a list of piece lists -> texts (as sentencepiece's ``decode_pieces``)."""
        if pieces and not isinstance(pieces[0], str):
            return [self._decode(row) for row in pieces]
        return self._decode(pieces)

    def _decode(self, pieces: Sequence[str]) -> str:
        decoder = self.tokenizer.decoder
        return decoder.decode(list(pieces)) if decoder is not None else "".join(pieces)


def _strips_like_sentencepiece(normalizer: dict | None) -> dict | None:
    """``normalizer`` with the ends' stripping after a collapse of space runs (module docstring)."""
    if not normalizer:
        return normalizer
    steps = normalizer["normalizers"] if normalizer.get("type") == "Sequence" else [normalizer]
    collapses = any(s.get("type") == "Replace" and s.get("pattern") == {"Regex": SPACE_RUNS} for s in steps)
    if not collapses:
        return normalizer
    return {"type": "Sequence", "normalizers": [*steps, STRIP_ENDS]}


def load_json_pieces(data: bytes) -> JsonPieces:
    """The segmentation of a ``tokenizer.json`` (module docstring); TokenizerJsonError when unusable."""
    try:
        from tokenizers import Tokenizer  # (a core dependency, imported where a directory needs it)
    except ImportError:
        raise TokenizerJsonError(f"reading {TOKENIZER_JSON} needs the tokenizers package, one of raymt's "
                                 "dependencies: pip install tokenizers") from None
    try:
        spec = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerJsonError(f"{TOKENIZER_JSON} is not valid JSON ({e})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
        raise TokenizerJsonError(f"{TOKENIZER_JSON} is not a tokenizers file (no model)")
    kind = spec["model"].get("type")
    if kind not in ("BPE", "Unigram"):
        raise TokenizerJsonError(f"{TOKENIZER_JSON} holds a {kind} model (a sentencepiece conversion is "
                                 "BPE or Unigram)")
    kept = [t for t in spec.get("added_tokens") or [] if isinstance(t, dict) and t.get("special") is False]
    spec.update(added_tokens=kept, post_processor=None, truncation=None, padding=None,
                normalizer=_strips_like_sentencepiece(spec.get("normalizer")))
    try:
        tokenizer = Tokenizer.from_str(json.dumps(spec))
    except Exception as e:  # noqa: BLE001 - the library raises plain Exception with its parser's message
        raise TokenizerJsonError(f"{TOKENIZER_JSON} does not load in the tokenizers library "
                                 f"({str(e).splitlines()[0][:200]})") from None
    logger.debug("tokenizer.json: %s model, %d pieces", kind, tokenizer.get_vocab_size(with_added_tokens=False))
    return JsonPieces(tokenizer)
