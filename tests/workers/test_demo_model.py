"""The shipped demo model: OPUS-MT conventions, quality, and that HF and CTranslate2 load it
and decode exactly as we do (greedy) — the proof that the saved format round-trips."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sacrebleu
import torch
from safetensors.torch import load_file

from tests.conftest import shared_path
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.core_decoder import CoreDecoder
from tests.workers.reference_decoding import translate_ids


def read(path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def translator(demo_model_dir):
    return CoreDecoder.load(str(demo_model_dir))


def test_opus_mt_vocabulary_convention(demo_model_dir):
    vocab = json.loads((demo_model_dir / "vocab.json").read_text())
    config = json.loads((demo_model_dir / "config.json").read_text())
    pad = vocab["<pad>"]
    assert pad == max(vocab.values()) == len(vocab) - 1
    assert config["pad_token_id"] == config["decoder_start_token_id"] == pad
    assert vocab["</s>"] == config["eos_token_id"] == 0
    weights = load_file(str(demo_model_dir / "model.safetensors"))
    assert torch.count_nonzero(weights["model.shared.weight"][pad]) == 0
    assert (demo_model_dir / "model.safetensors").stat().st_size <= 25 * 2**20


def test_quality_smoke_greedy(translator):
    """First 200 lines of test2016, greedy: a floor far below the full-set beam-5 score."""
    src = read(shared_path("multi30k", "test_2016_flickr.de"))[:200]
    ref = read(shared_path("multi30k", "test_2016_flickr.en"))[:200]
    hyps = [t.text for t in translator.translate(src, SearchConfig(beam_size=1))]
    assert sacrebleu.corpus_bleu(hyps, [ref]).score > 30.0


@pytest.mark.slow
def test_quality_full_test2016_beam5(translator):
    src = read(shared_path("multi30k", "test_2016_flickr.de"))
    ref = read(shared_path("multi30k", "test_2016_flickr.en"))
    hyps = [t.text for t in translator.translate(src, SearchConfig(beam_size=5, max_length_a=1.5, max_length_b=10))]
    assert sacrebleu.corpus_bleu(hyps, [ref]).score >= 38.0


def our_greedy_ids(translator, lines: list[str]) -> list[list[int]]:
    cfg = SearchConfig(beam_size=1, max_decoding_length=128, max_length_b=128)
    return [list(h[0].tokens) for h in translate_ids(translator, translator.encode(lines), cfg)]


def strip_eos(ids: list[int], eos: int) -> list[int]:
    return ids[:-1] if ids and ids[-1] == eos else ids


def hf_matches(demo_model_dir, translator, lines):
    transformers = pytest.importorskip("transformers")
    tok = transformers.MarianTokenizer.from_pretrained(str(demo_model_dir))
    model = transformers.MarianMTModel.from_pretrained(str(demo_model_dir), dtype=torch.float32).eval()
    ours = our_greedy_ids(translator, lines)
    theirs = []
    for i in range(0, len(lines), 64):
        batch = tok(lines[i:i + 64], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=128,
                                 bad_words_ids=[[model.config.pad_token_id]])
        theirs += [[t for t in seq[1:] if t != model.config.pad_token_id] for seq in out.tolist()]
    return ours, theirs


def ct2_matches(demo_model_dir, translator, lines, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    out_dir = tmp_path / "ct2"
    subprocess.run([sys.executable, "-m", "ctranslate2.converters.transformers", "--model", str(demo_model_dir),
                    "--output_dir", str(out_dir)], check=True, capture_output=True)
    ct2 = ctranslate2.Translator(str(out_dir), device="cpu", intra_threads=2)
    tok = translator.checkpoint.tokenizer
    pieces = [tok.source_pieces(line) + ["</s>"] for line in lines]
    # Our cap (128) counts the EOS that the checkpoint's forced_eos_token_id puts at the last step; CT2's
    # max_decoding_length counts content tokens only, so a capped output has 127 of them in both.
    results = ct2.translate_batch(pieces, beam_size=1, max_decoding_length=127, max_batch_size=64)
    theirs = [[tok.target_vocab[p] for p in r.hypotheses[0]] for r in results]
    ours = [strip_eos(ids, tok.target_special.eos) for ids in our_greedy_ids(translator, lines)]
    return ours, theirs


def test_hf_loads_demo_model_and_decodes_identically(demo_model_dir, translator):
    lines = read(shared_path("multi30k", "test_2016_flickr.de"))[:200]
    ours, theirs = hf_matches(demo_model_dir, translator, lines)
    assert ours == theirs


def test_ct2_loads_demo_model_and_decodes_identically(demo_model_dir, translator, tmp_path):
    lines = read(shared_path("multi30k", "test_2016_flickr.de"))[:200]
    ours, theirs = ct2_matches(demo_model_dir, translator, lines, tmp_path)
    assert ours == theirs


@pytest.mark.slow
def test_hf_and_ct2_match_on_full_test2016(demo_model_dir, translator, tmp_path):
    lines = read(shared_path("multi30k", "test_2016_flickr.de"))
    ours, theirs = hf_matches(demo_model_dir, translator, lines)
    assert ours == theirs
    ours, theirs = ct2_matches(demo_model_dir, translator, lines, tmp_path)
    assert ours == theirs


def test_ct2_beam_search_equals_ours_with_its_stopping_rule(demo_model_dir, translator, tmp_path):
    """CTranslate2's beam search (length penalty on) ends a sentence once K hypotheses finished:
    HF's ``early_stopping=True``. With that rule our beam-5 outputs equal CT2's, word for word."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    lines = read(shared_path("multi30k", "test_2016_flickr.de"))[:120]
    out_dir = tmp_path / "ct2"
    subprocess.run([sys.executable, "-m", "ctranslate2.converters.transformers", "--model", str(demo_model_dir),
                    "--output_dir", str(out_dir)], check=True, capture_output=True)
    ct2 = ctranslate2.Translator(str(out_dir), device="cpu", intra_threads=2)
    tok = translator.checkpoint.tokenizer
    results = ct2.translate_batch([tok.source_pieces(x) + ["</s>"] for x in lines], beam_size=5, length_penalty=1.0,
                                  max_batch_size=32, max_decoding_length=256)
    theirs = [tok.decode([tok.target_vocab[p] for p in r.hypotheses[0]]) for r in results]
    cfg = SearchConfig(beam_size=5, max_length_a=0.0, max_length_b=256, max_decoding_length=256, early_stopping=True)
    assert [t.text for t in translator.translate(lines, cfg)] == theirs
