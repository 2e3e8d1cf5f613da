"""CPU speed-ups: fused QKV keeps the translations; int8 stays close (its BLEU change is benchmarked)."""
from __future__ import annotations

import sacrebleu

from workers.config import SearchConfig
from workers.speedups import CpuSpeedups, apply_speedups
from workers.translator import Translator
from tests.pipeline.ray_helpers import clean_corpus


def test_fused_qkv_keeps_outputs_and_int8_stays_close(demo_model_dir) -> None:
    texts, cfg = clean_corpus(24), SearchConfig(beam_size=3)
    exact = [t.text for t in Translator.load(str(demo_model_dir)).translate(texts, cfg)]
    fused = Translator.load(str(demo_model_dir))
    apply_speedups(fused.checkpoint.model, CpuSpeedups(fused_qkv=True))
    assert fused.checkpoint.model.model.decoder.layers[0].self_attn.qkv_proj is not None
    assert [t.text for t in fused.translate(texts, cfg)] == exact
    int8 = Translator.load(str(demo_model_dir))
    apply_speedups(int8.checkpoint.model, CpuSpeedups(fused_qkv=True, int8=True))
    assert int8.checkpoint.model.int8_head is not None
    got = [t.text for t in int8.translate(texts, cfg)]
    assert sacrebleu.corpus_bleu(got, [exact]).score > 60  # quantisation noise, not a different model
