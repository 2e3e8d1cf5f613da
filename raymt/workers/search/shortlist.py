"""Shortlist vocabulary (Shi & Knight 2017): a small per-batch set of target candidates.

A ``LexicalTable`` holds P(target | source) over token ids and a target frequency list. For a batch,
the candidate set is the union over its source tokens of their top-``M`` targets, the top-``N``
most frequent targets, and the special tokens (EOS, UNK, PAD; PAD stays banned in search but
keeps the normaliser equal to full decoding's, so a shortlist holding the whole vocabulary decodes
exactly as without one). The output layer then gathers only the candidate rows
(``MarianModel.project(hidden, candidates)``) and the search maps positions back to vocabulary ids.

Tables move between tools: Marian's ``lex.s2t`` text format (``target source prob`` a line) and
CTranslate2's vocabulary map (``source<TAB>target target ...``, the line with an empty source lists
tokens that are always candidates).
"""
from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

MAX_PER_SOURCE = 500  # translations a table built here keeps per source piece, most likely first


@dataclass(frozen=True)
class LexicalTable:
    """translations: source id -> [(target id, P(target | source))], most probable first;
    frequent: target ids, most frequent first."""

    translations: dict[int, list[tuple[int, float]]]
    frequent: list[int] = field(default_factory=list)

    @classmethod
    def from_counts(cls, pair_counts: dict[tuple[int, int], float], target_counts: dict[int, float],
                    *, max_per_source: int = MAX_PER_SOURCE) -> "LexicalTable":
        """Maximum-likelihood P(t | s) from aligned (source, target) counts."""
        per_source: dict[int, dict[int, float]] = {}
        for (s, t), c in pair_counts.items():
            per_source.setdefault(s, {})[t] = per_source.get(s, {}).get(t, 0.0) + c
        translations = {}
        for s, targets in per_source.items():
            total = sum(targets.values())
            best = heapq.nlargest(max_per_source, targets.items(), key=lambda kv: (kv[1], -kv[0]))
            translations[s] = [(t, c / total) for t, c in best]
        frequent = [t for t, _ in sorted(target_counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        return cls(translations, frequent)


@dataclass(frozen=True)
class Shortlist:
    """Per-batch candidate ids from a table: top ``top_m`` per source token + top ``top_n`` frequent."""

    table: LexicalTable
    top_m: int
    top_n: int
    special_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.top_m < 0 or self.top_n < 0:
            raise ValueError("top_m and top_n must be >= 0")

    def candidates(self, sources: Sequence[Sequence[int]]) -> Tensor:
        """Source id lists of one batch -> sorted unique target ids (C,) long."""
        ids = set(self.special_ids)
        ids.update(self.table.frequent[: self.top_n])
        for source_id in {t for src in sources for t in src}:
            ids.update(t for t, _ in self.table.translations.get(source_id, ())[: self.top_m])
        return torch.tensor(sorted(ids), dtype=torch.long, device="cpu")  # the decoder moves it to the model


@dataclass(frozen=True)
class LanguageShortlists:
    """A many-to-many model's shortlists, one per target language: ``by_language`` maps a language's
    token id (the token each translation is forced to start with) to its ``Shortlist``.

    A batch's candidates are the union, over the target languages of its rows, of each language's
    candidates for the sources of that language's rows, plus those languages' own ids. A batch with
    a row whose language has no table, or without languages, decodes on the whole vocabulary (None)."""

    by_language: dict[int, Shortlist]

    def candidates(self, sources: Sequence[Sequence[int]], langs: Sequence[int] | None) -> Tensor | None:
        """Source id lists of one batch and each row's target-language id -> sorted unique target ids (C,)."""
        if langs is None or any(lang not in self.by_language for lang in langs):
            return None
        rows: dict[int, list[Sequence[int]]] = {}
        for src, lang in zip(sources, langs):
            rows.setdefault(lang, []).append(src)
        ids = set(rows)
        for lang, lang_sources in rows.items():
            ids.update(self.by_language[lang].candidates(lang_sources).tolist())
        return torch.tensor(sorted(ids), dtype=torch.long, device="cpu")


AnyShortlist = Shortlist | LanguageShortlists  # what the decoder takes


def batch_candidates(shortlist: AnyShortlist | None, sources: Sequence[Sequence[int]],
                     langs: Sequence[int] | None = None) -> Tensor | None:
    """A batch's candidate ids under either kind of shortlist (None: the whole vocabulary)."""
    if shortlist is None:
        return None
    if isinstance(shortlist, LanguageShortlists):
        return shortlist.candidates(sources, langs)
    return shortlist.candidates(sources)


def coverage(candidates: Tensor, references: Iterable[Sequence[int]]) -> float:
    """Share of reference target tokens inside the candidate set (the paper's TC)."""
    allowed = set(candidates.tolist())
    tokens = [t for ref in references for t in ref]
    return sum(t in allowed for t in tokens) / max(len(tokens), 1)


# --------------------------------------------------------------------------- file formats

def write_lex_s2t(table: LexicalTable, source_pieces: dict[int, str], target_pieces: dict[int, str]) -> str:
    """Marian ``lex.s2t``: ``target source P(target|source)`` a line."""
    lines = [f"{target_pieces[t]} {source_pieces[s]} {p:.6g}"
             for s, targets in sorted(table.translations.items()) for t, p in targets]
    return "\n".join(lines) + "\n"


def read_lex_s2t(text: str, source_vocab: dict[str, int], target_vocab: dict[str, int],
                 frequent: list[int] | None = None) -> LexicalTable:
    """Parse ``lex.s2t``; pieces outside the vocabularies are skipped (as Marian does)."""
    translations: dict[int, list[tuple[int, float]]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 3:
            raise ValueError(f"lex.s2t line {number}: expected 'target source prob', got {line!r}")
        target, source, prob = parts[0], parts[1], float(parts[2])
        if source in source_vocab and target in target_vocab:
            translations.setdefault(source_vocab[source], []).append((target_vocab[target], prob))
    for targets in translations.values():
        targets.sort(key=lambda tp: (-tp[1], tp[0]))
    return LexicalTable(translations, list(frequent or []))


def write_vocab_map(table: LexicalTable, source_pieces: dict[int, str], target_pieces: dict[int, str],
                    *, top_m: int, top_n: int) -> str:
    """CTranslate2 vocabulary map: ``\\t`` + always-candidates, then ``source\\ttargets`` a line."""
    lines = ["\t" + " ".join(target_pieces[t] for t in table.frequent[:top_n])]
    for s, targets in sorted(table.translations.items()):
        lines.append(source_pieces[s] + "\t" + " ".join(target_pieces[t] for t, _ in targets[:top_m]))
    return "\n".join(lines) + "\n"


def read_vocab_map(text: str, source_vocab: dict[str, int], target_vocab: dict[str, int]) -> LexicalTable:
    """Parse a CTranslate2 vocabulary map (unigram keys); order within a line is kept as rank."""
    translations: dict[int, list[tuple[int, float]]] = {}
    frequent: list[int] = []
    for line in text.splitlines():
        if "\t" not in line:
            continue
        key, _, values = line.partition("\t")
        targets = [target_vocab[p] for p in values.split() if p in target_vocab]
        if key == "":
            frequent = targets
        elif key in source_vocab:
            n = len(targets)
            translations[source_vocab[key]] = [(t, (n - i) / n) for i, t in enumerate(targets)]
    return LexicalTable(translations, frequent)
