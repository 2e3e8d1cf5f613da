"""SentencePiece + ``vocab.json`` tokenization that matches HF ``MarianTokenizer`` exactly.

Encoding: optional leading ``>>lang<<`` code kept as one token, sentencepiece pieces, each piece
mapped through ``vocab.json`` (pieces missing from it become ``<unk>``), then ``</s>`` appended.
Decoding: ids -> pieces (special tokens dropped), pieces joined by sentencepiece.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import sentencepiece as spm

SPIECE_UNDERLINE = "\u2581"


def load_vocab(data: bytes | str) -> dict[str, int]:
    vocab = json.loads(data)
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise ValueError("vocab.json must map piece -> int id")
    return vocab


@dataclass(frozen=True)
class SpecialIds:
    eos: int
    unk: int
    pad: int


class MarianTokenizer:
    """Source/target sentencepiece models with one shared (or two separate) vocab.json maps."""

    def __init__(self, source_spm: bytes, target_spm: bytes, vocab: dict[str, int],
                 target_vocab: dict[str, int] | None = None) -> None:
        self.source_spm = spm.SentencePieceProcessor(model_proto=source_spm)
        self.target_spm = spm.SentencePieceProcessor(model_proto=target_spm)
        self.source_vocab = vocab
        self.target_vocab = target_vocab if target_vocab is not None else vocab
        self.separate_vocabs = target_vocab is not None
        self.source_lang: str | None = None  # the language its directory names (the sentence splitter's rules)
        for name, v in (("vocab", self.source_vocab), ("target vocab", self.target_vocab)):
            missing = [t for t in ("</s>", "<unk>", "<pad>") if t not in v]
            if missing:
                raise ValueError(f"{name} lacks special tokens {missing}")
        self.source_special = SpecialIds(vocab["</s>"], vocab["<unk>"], vocab["<pad>"])
        self.target_special = SpecialIds(self.target_vocab["</s>"], self.target_vocab["<unk>"],
                                         self.target_vocab["<pad>"])
        self.target_pieces = {i: p for p, i in self.target_vocab.items()}
        # HF decodes through the source spm when the vocabulary is shared.
        self.decode_spm = self.target_spm if self.separate_vocabs else self.source_spm
        self.special_tokens = {"</s>", "<unk>", "<pad>"}
        # id -> piece for the ids a decode keeps (special tokens and ids outside the vocab drop out)
        self.kept_pieces = {i: p for i, p in self.target_pieces.items() if p not in self.special_tokens}

    @property
    def source_vocab_size(self) -> int:
        return max(self.source_vocab.values()) + 1

    @property
    def target_vocab_size(self) -> int:
        return max(self.target_vocab.values()) + 1

    def source_pieces(self, text: str) -> list[str]:
        code: list[str] = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2:]
        return code + self.source_spm.encode(text, out_type=str)

    def encode(self, text: str) -> list[int]:
        """Source text -> ids, ``</s>`` appended (as MarianTokenizer's ``input_ids``)."""
        unk = self.source_special.unk
        return [self.source_vocab.get(p, unk) for p in self.source_pieces(text)] + [self.source_special.eos]

    def encode_target(self, text: str) -> list[int]:
        """Target text -> ids with ``</s>`` (MarianTokenizer ``text_target=``), for training."""
        unk = self.target_special.unk
        pieces = self.target_spm.encode(text, out_type=str)
        return [self.target_vocab.get(p, unk) for p in pieces] + [self.target_special.eos]

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids -> text, special tokens skipped (``skip_special_tokens=True``)."""
        pieces = [p for p in map(self.kept_pieces.get, ids) if p is not None]
        return self.decode_spm.decode_pieces(pieces).replace(SPIECE_UNDERLINE, " ").strip()

    def decode_all(self, many: Sequence[Sequence[int]]) -> list[str]:
        """``decode`` of each id sequence, in one sentencepiece call, which decodes on every core
        (125,000 WMT22-length hypotheses, the pieces' decode: 0.49 s one call each, 0.26 s in one
        call on 2 cores; mapping the ids to pieces, 0.34 s, stays in Python)."""
        if not many:
            return []
        kept = self.kept_pieces
        pieces = [[p for p in map(kept.get, ids) if p is not None] for ids in many]
        return [text.replace(SPIECE_UNDERLINE, " ").strip() for text in self.decode_spm.decode_pieces(pieces)]
