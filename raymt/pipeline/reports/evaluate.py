"""sacreBLEU BLEU and chrF from sufficient statistics: shards emit counts, the driver sums them.

The corpus score of summed statistics equals ``corpus_score`` over the concatenated corpus (both
metrics are ratios of corpus-level counts), so actors never ship text to the driver for scoring.
"""
from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

_BLEU, _CHRF = BLEU(), CHRF()
_BLEU.num_refs = _CHRF.num_refs = 1  # one reference a sentence (what get_signature reports)


@dataclass(frozen=True, slots=True)
class EvalStats:
    bleu: tuple[int, ...]
    chrf: tuple[int, ...]
    sentences: int

    def __add__(self, other: "EvalStats") -> "EvalStats":
        return EvalStats(tuple(a + b for a, b in zip(self.bleu, other.bleu)),
                         tuple(a + b for a, b in zip(self.chrf, other.chrf)), self.sentences + other.sentences)


def sufficient_stats(hypotheses: list[str], references: list[str]) -> EvalStats:
    """Summed per-sentence BLEU and chrF statistics of one shard."""
    bleu = [sum(col) for col in zip(*_BLEU._extract_corpus_statistics(hypotheses, [references]))]
    chrf = [sum(col) for col in zip(*_CHRF._extract_corpus_statistics(hypotheses, [references]))]
    return EvalStats(tuple(int(x) for x in bleu), tuple(int(x) for x in chrf), len(hypotheses))


@dataclass(frozen=True, slots=True)
class Scores:
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    sentences: int

    def __str__(self) -> str:
        return (f"BLEU {self.bleu:.2f} [{self.bleu_signature}]  chrF {self.chrf:.2f} [{self.chrf_signature}]"
                f"  ({self.sentences} sentences)")


def score(stats: EvalStats) -> Scores:
    return Scores(_BLEU._compute_score_from_stats(list(stats.bleu)).score,
                  _CHRF._compute_score_from_stats(list(stats.chrf)).score,
                  str(_BLEU.get_signature()), str(_CHRF.get_signature()), stats.sentences)
