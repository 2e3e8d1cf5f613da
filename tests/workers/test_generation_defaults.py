"""An M2M100 / NLLB directory's own generation settings are the default search: ``CoreDecoder.translate``
without a search, ``raymt.Translator.load`` without one and the Ray Data operator all equal HF
``model.generate(**inputs)`` run with no search arguments on the same directory (the target language
forced as HF users force it, ``forced_bos_token_id``); an explicit search wins; settings the decoder
does not implement are refused in one line; Marian directories keep the product's defaults.

The model is ``test_m2m100.py``'s tiny M2M100 (2+2 layers, peaky random weights, EOS favoured) with
``generation_config.json`` as facebook/m2m100_418M ships it (beam 5, early stopping on), with a
``max_length`` inside the tiny position table.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from raymt.workers.config import ModelConfig, SearchConfig
from raymt.workers.decoder.decode_config import DEFAULTS
from raymt.workers.checkpoints.generation import GenerationDefaults, UnsupportedGeneration, effective_search
from raymt.workers.decoder.core_decoder import CoreDecoder
from tests.conftest import shared_path

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.usefixtures("one_thread")

EOS, PAD = 2, 1
# facebook/m2m100_418M's generation settings, the length cut to the tiny model's 64 positions
GENERATION = {"bos_token_id": 0, "decoder_start_token_id": 2, "early_stopping": True, "eos_token_id": 2,
              "max_length": 24, "num_beams": 5, "pad_token_id": 1}
SOURCE, TARGET = "de", "fr"


def make_early_stopping_dir(directory: Path, generation: dict = GENERATION) -> Path:
    """A tiny random M2M100 directory whose generation_config.json asks for beam 5 with early stopping."""
    from tests.workers.test_m2m100 import randomize, train_spm, write_tokenizer

    tok = write_tokenizer(directory, "m2m100", train_spm())
    torch.manual_seed(0)
    cfg = transformers.M2M100Config(vocab_size=max(tok.lang_code_to_id.values()) + 1 + 8, d_model=32, encoder_layers=2,
                                    decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                                    encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0,
                                    attention_dropout=0.0)
    hf = transformers.M2M100ForConditionalGeneration(cfg).eval()
    randomize(hf, 5.0, seed=1)
    hf.save_pretrained(str(directory))
    (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def held_out_lines() -> list[str]:
    return shared_path("multi30k", "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[40:60]


def hf_reference(directory: Path, lines: list[str], **kwargs) -> list[tuple[int, ...]]:
    """HF ``generate(**inputs)`` on the directory as loaded (its generation_config.json), the decoder's
    start token cut and EOS kept; ``kwargs``: what the caller passes (the target language, ...)."""
    hf = transformers.M2M100ForConditionalGeneration.from_pretrained(str(directory)).eval()
    tok = transformers.M2M100Tokenizer.from_pretrained(str(directory), src_lang=SOURCE)
    with torch.no_grad():
        out = hf.generate(**tok(lines, return_tensors="pt", padding=True), **kwargs)
    seqs = []
    for row in out.tolist():
        row = row[1:]
        seqs.append(tuple(row[: row.index(EOS) + 1] if EOS in row else row))
    return seqs


@pytest.fixture(scope="module")
def early_dir(tmp_path_factory) -> Path:
    return make_early_stopping_dir(tmp_path_factory.mktemp("m2m100-early"))


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return held_out_lines()


@pytest.fixture(scope="module")
def reference(early_dir, lines) -> list[tuple[int, ...]]:
    tok = transformers.M2M100Tokenizer.from_pretrained(str(early_dir))
    return hf_reference(early_dir, lines, forced_bos_token_id=tok.get_lang_id(TARGET))


def test_the_default_search_equals_hf_generate_without_arguments(early_dir, lines, reference):
    """Token for token on 20 held-out lines, as HF users drive the model (its settings, the target
    language forced); the product's defaults, and these without early stopping, do not."""
    tr = CoreDecoder.load(str(early_dir))
    search = tr.model_search_config()
    assert (search.beam_size, search.max_decoding_length, search.max_length_a, search.early_stopping) == \
        (5, 23, 0.0, True)
    got = tr.translate(lines, source_lang=SOURCE, target_lang=TARGET)
    assert [g.tokens for g in got] == reference
    assert any(len(g.tokens) == 23 for g in got) and any(g.tokens[-1] == EOS for g in got)  # both endings
    late = tr.translate(lines, replace(search, early_stopping=False), source_lang=SOURCE, target_lang=TARGET)
    product = tr.translate(lines, DEFAULTS.search, source_lang=SOURCE, target_lang=TARGET)
    assert sum(g.tokens == r for g, r in zip(late, reference)) < len(lines)
    assert sum(g.tokens == r for g, r in zip(product, reference)) < len(lines)


def test_api_and_operator_default_to_the_model_and_an_explicit_search_wins(early_dir, lines, reference):
    import raymt
    from raymt.ray_data import Translate

    core = CoreDecoder.load(str(early_dir))
    want = [core.checkpoint.tokenizer.decode(list(r)) for r in reference]
    api = raymt.Translator.load(str(early_dir), threads=1)
    assert api.decode.search == core.model_search_config()
    assert api.translate(lines, source_lang=SOURCE, target_lang=TARGET) == want
    op = Translate(model=str(early_dir), threads=1, source_lang=SOURCE, target_lang=TARGET)
    assert op.search == core.model_search_config() and op.translate_texts(lines)[0] == want
    two = hf_reference(early_dir, lines, forced_bos_token_id=core.checkpoint.tokenizer.lang_id(TARGET), num_beams=2)
    assert [t.tokens for t in core.translate(lines, replace(core.model_search_config(), beam_size=2),
                                             source_lang=SOURCE, target_lang=TARGET)] == two
    per_call = api.translate(lines, source_lang=SOURCE, target_lang=TARGET, beam_size=2)  # this call's field wins
    assert per_call == [core.checkpoint.tokenizer.decode(list(r)) for r in two] != want
    given = raymt.Translator.load(str(early_dir), threads=1, search=SearchConfig(beam_size=2))
    assert given.decode.search == SearchConfig(beam_size=2)  # a whole search given: it is the search


def test_a_forced_target_language_in_the_settings_is_the_default_target(early_dir, lines, tmp_path):
    """``forced_bos_token_id`` in generation_config.json: HF forces it with no arguments at all, and it is
    the target language where none is given (one given wins)."""
    directory = tmp_path / "forced"
    shutil.copytree(early_dir, directory)
    tok = transformers.M2M100Tokenizer.from_pretrained(str(directory))
    (directory / "generation_config.json").write_text(json.dumps({**GENERATION,
                                                                  "forced_bos_token_id": tok.get_lang_id(TARGET)}))
    tr = CoreDecoder.load(str(directory))
    assert tr.default_target_lang is not None and tr.checkpoint.tokenizer.lang_id(tr.default_target_lang) == \
        tok.get_lang_id(TARGET)
    assert [t.tokens for t in tr.translate(lines, source_lang=SOURCE)] == hf_reference(directory, lines)
    english = tr.translate(lines[:3], source_lang=SOURCE, target_lang="en")
    assert all(t.tokens[0] == tok.get_lang_id("en") for t in english)


M2M = ModelConfig(vocab_size=128, decoder_vocab_size=128, d_model=32, encoder_attention_heads=4,
                  decoder_attention_heads=4, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)


@pytest.mark.parametrize("settings, beam, cap, early", [
    ({}, 1, None, False),  # HF's defaults: greedy; no length given, so the product's length rule stays
    ({"max_length": 200}, 1, 199, False),  # NLLB-200: HF counts the start token
    ({"max_length": 200, "num_beams": 5, "early_stopping": True}, 5, 199, True),  # M2M100 418M
    ({"max_length": 200, "max_new_tokens": 50, "num_beams": None}, 1, 50, False),  # max_new_tokens wins; null: HF's
    ({"bad_words_ids": [[1]], "forced_eos_token_id": 2, "no_repeat_ngram_size": 0, "do_sample": False}, 1, None, False),
])
def test_settings_map_to_the_search_hf_runs(settings: dict, beam: int, cap: int | None, early: bool) -> None:
    search = GenerationDefaults.parse(settings, M2M).search(DEFAULTS.search)
    assert (search.beam_size, search.early_stopping, search.num_hypotheses) == (beam, early, 1)
    if cap is None:
        assert (search.max_length_a, search.max_length_b, search.max_decoding_length) == (
            DEFAULTS.search.max_length_a, DEFAULTS.search.max_length_b, DEFAULTS.search.max_decoding_length)
    else:
        assert (search.max_length_a, search.max_length_for(7), search.max_length_for(300)) == (0.0, cap, cap)


@pytest.mark.parametrize("settings, named", [
    ({"no_repeat_ngram_size": 3}, "no_repeat_ngram_size=3"),
    ({"do_sample": True, "repetition_penalty": 1.2}, "repetition_penalty=1.2, do_sample=True"),
    ({"bad_words_ids": [[7]]}, "bad_words_ids=[[7]]"),
    ({"decoder_start_token_id": 0}, "decoder_start_token_id=0"),
    ({"early_stopping": "never"}, "early_stopping='never'"),
    ({"num_beams": 100_000}, "num_beams=100000 (must be in [1, 1024])"),  # (workers/config.MAX_BEAM_SIZE)
])
def test_settings_the_decoder_does_not_implement_are_refused_in_one_line(settings: dict, named: str) -> None:
    with pytest.raises(UnsupportedGeneration) as error:
        GenerationDefaults.parse({"max_length": 200, **settings}, M2M)
    assert named in str(error.value) and "\n" not in str(error.value)


def test_a_refused_setting_stops_the_default_search_not_the_loading(early_dir, tmp_path):
    directory = tmp_path / "ngram"
    shutil.copytree(early_dir, directory)
    (directory / "generation_config.json").write_text(json.dumps({**GENERATION, "no_repeat_ngram_size": 3}))
    tr = CoreDecoder.load(str(directory))
    with pytest.raises(UnsupportedGeneration, match="no_repeat_ngram_size=3.*generation_config.json"):
        tr.translate(["Ein Hund."], source_lang=SOURCE, target_lang=TARGET)


def test_marian_directories_keep_the_product_defaults(demo_model_dir):
    """The demo model's generation_config.json (the converter's num_beams 4 / max_length 512) is not the
    default: Marian directories decode as before."""
    tr = CoreDecoder.load(str(demo_model_dir))
    assert json.loads((demo_model_dir / "generation_config.json").read_text())["num_beams"] == 4
    assert tr.generation_defaults() is None and tr.model_search_config() == DEFAULTS.search
    assert tr.forced_eos and tr.default_target_lang is None


def test_the_merge_starts_from_the_product_defaults():
    assert DEFAULTS.search == SearchConfig() == effective_search(None)
