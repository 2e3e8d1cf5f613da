"""Summed sufficient statistics of shards score exactly like sacreBLEU over the whole corpus."""
from __future__ import annotations

import sacrebleu

from raymt.pipeline.reports.evaluate import score, sufficient_stats

HYP = ["A man rides a bike.", "Two kids play in sand.", "A woman sits.", "The dog runs on grass."]
REF = ["A man is riding a bike.", "Two children play in the sand.", "A woman is sitting.", "A dog runs on the grass."]


def test_shard_statistics_sum_to_the_corpus_score() -> None:
    total = sufficient_stats(HYP[:1], REF[:1]) + sufficient_stats(HYP[1:3], REF[1:3]) + sufficient_stats(HYP[3:], REF[3:])
    s = score(total)
    assert s.sentences == 4
    assert abs(s.bleu - sacrebleu.corpus_bleu(HYP, [REF]).score) < 1e-9
    assert abs(s.chrf - sacrebleu.corpus_chrf(HYP, [REF]).score) < 1e-9
    assert s.bleu_signature.startswith("nrefs:1") and "chrF" not in s.bleu_signature
