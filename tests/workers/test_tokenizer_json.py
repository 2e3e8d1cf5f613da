"""M2M100 / NLLB-200 directories with ``tokenizer.json`` and no ``sentencepiece.bpe.model`` (transformers 5
saves NLLB's fast tokenizer only) tokenize and translate exactly as the same directory with both files.

Tiny random models (``tests/workers/test_m2m100.py``'s) with a sentencepiece model trained on Multi30k:

* NLLB: ``tokenizer.json`` written by transformers itself (its tokenizers-backed ``NllbTokenizer``
  converts the sentencepiece model; ``save_pretrained`` writes the fast tokenizer).
* M2M100: transformers has no fast M2M100 tokenizer (``M2M100Tokenizer`` is sentencepiece-only), so its
  ``tokenizer.json`` is assembled as transformers assembles NLLB's (BPE merges from transformers'
  ``SentencePieceExtractor``, the sentencepiece normaliser's charsmap, Metaspace), on ``vocab.json``'s
  ids, with the language codes ``__xx__`` added after the vocabulary. Its ``vocab.json`` is shuffled
  (fairseq's are frequency-ordered, not in sentencepiece's order), so ids come from the right map.

Then ``sentencepiece.bpe.model`` is removed from a copy, and both copies must give the same ids for a few
hundred real sentences and edge cases (added tokens' text, unknown characters, whitespace), the same
text for any ids, and the same translations.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from raymt.pipeline.decoders.model_check import ModelError, check_model
from raymt.workers.checkpoints.checkpoint import load_tokenizer, local_reader
from raymt.workers.config import SearchConfig
from raymt.workers.text.lang_tokenizer import M2M100_CODES, load_language_tokenizer
from raymt.workers.text.tokenizer_json import JsonPieces
from tests.conftest import shared_path
from tests.workers.test_m2m100 import randomize, train_spm, write_tokenizer

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.usefixtures("one_thread")

LANGS = {"nllb": ("deu_Latn", ["fra_Latn", "eng_Latn", "ita_Latn"]), "m2m100": ("de", ["fr", "en", "it"])}
EDGE_CASES = ["", " ", "   ", "\t", "trailing spaces   ", "  leading spaces", "Zwei   Männer,\t3 Kinder\n& ein Ölgemälde",
              "unknown ж ѣѣѣ 😀 中文 characters", "</s> <unk> <pad> <s> <mask> deu_Latn __de__ as text",
              "\u00a0nbsp\u3000ideographic\u2003em space\u200bzero width\ufeffbom", "ﬁ ① Ｆｕｌｌ ㎏ e\u0301",
              "\u2581already \u2581\u2581 escaped", "a" * 300, "#PRS_ORG# 249€ 40% @user https://example.com/a?b=c"]


@pytest.fixture(scope="module")
def spm_model() -> bytes:
    return train_spm()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Edge cases and 300 real lines: WMT22 German (long-tailed lengths) and Multi30k French and English."""
    wmt = shared_path("wmt22", "generaltest2022.de-en.src.de").read_text(encoding="utf-8").splitlines()
    lines = wmt[:200]
    for lang in ("fr", "en"):
        lines += shared_path("multi30k", f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()[:50]
    return EDGE_CASES + lines


def write_m2m100_tokenizer(directory: Path, spm_model: bytes) -> None:
    """An M2M100 directory's tokenizer files: a shuffled ``vocab.json``, and HF's files for it."""
    spm_path = directory / "sentencepiece.bpe.model"
    spm_path.write_bytes(spm_model)
    proc = spm.SentencePieceProcessor(model_proto=spm_model)
    pieces = [proc.id_to_piece(i) for i in range(proc.get_piece_size())
              if not (proc.is_unknown(i) or proc.is_control(i))]
    random.Random(0).shuffle(pieces)
    vocab = {p: i for i, p in enumerate(["<s>", "<pad>", "</s>", "<unk>", *pieces])}
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    transformers.M2M100Tokenizer(str(directory / "vocab.json"), str(spm_path)).save_pretrained(str(directory))
    m2m100_tokenizer_json(spm_path, vocab).save(str(directory / "tokenizer.json"))


def m2m100_tokenizer_json(spm_path: Path, vocab: dict[str, int]):
    """``tokenizer.json`` for an M2M100 directory, built as transformers builds NLLB's fast tokenizer."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    extracted = SentencePieceExtractor(str(spm_path)).extract(BPE)
    tok = Tokenizer(BPE(vocab=vocab, merges=extracted["merges"], unk_token="<unk>", fuse_unk=True, dropout=None))
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(extracted["_spm_precompiled_charsmap"]),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.add_special_tokens([AddedToken(f"__{c}__", normalized=False, special=True) for c in M2M100_CODES["m2m100"]])
    return tok


def make_dir(directory: Path, style: str, spm_model: bytes) -> Path:
    """A tiny random model (1+1 layers) with ``sentencepiece.bpe.model`` and ``tokenizer.json``; EOS is
    not favoured, so translations are text, not empty."""
    if style == "nllb":
        vocab = len(write_tokenizer(directory, "nllb", spm_model))
    else:
        write_m2m100_tokenizer(directory, spm_model)
        vocab = len(json.loads((directory / "vocab.json").read_text())) + len(M2M100_CODES["m2m100"]) + 8
    torch.manual_seed(0)
    cfg = transformers.M2M100Config(vocab_size=vocab, d_model=32, encoder_layers=1, decoder_layers=1,
                                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                    decoder_ffn_dim=64, max_position_embeddings=128)
    hf = transformers.M2M100ForConditionalGeneration(cfg).eval()
    randomize(hf, eos_bias=0.0)
    hf.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module", params=["nllb", "m2m100"])
def pair(request, tmp_path_factory, spm_model) -> tuple[str, Path, Path]:
    """(style, a directory with both files, its copy without ``sentencepiece.bpe.model``)."""
    style = request.param
    both = make_dir(tmp_path_factory.mktemp(f"{style}-both"), style, spm_model)
    assert (both / "tokenizer.json").exists() and (both / "sentencepiece.bpe.model").exists()
    json_only = Path(shutil.copytree(both, tmp_path_factory.mktemp(style) / "json-only"))
    (json_only / "sentencepiece.bpe.model").unlink()
    return style, both, json_only


def assert_same_tokenizer(reference, ours, texts: list[str], src_lang: str, tgt_lang: str) -> None:
    """The same ids for every text (source and target side) and the same text for any ids."""
    assert isinstance(ours.spm, JsonPieces) and not isinstance(reference.spm, JsonPieces)
    assert (ours.style, ours.vocab, ours.languages) == (reference.style, reference.vocab, reference.languages)
    assert ours.source_special == reference.source_special and ours.source_vocab_size == reference.source_vocab_size
    for text in texts:
        assert ours.encode(text, src_lang) == reference.encode(text, src_lang), text
        assert ours.encode_target(text, tgt_lang) == reference.encode_target(text, tgt_lang), text
    ids = [reference.encode(t, src_lang) for t in texts]
    rng = random.Random(1)  # any ids: special tokens, language codes and ids past the vocabulary included
    ids += [[rng.randrange(reference.source_vocab_size + 8) for _ in range(rng.randrange(40))] for _ in range(500)]
    assert ours.decode_all(ids) == reference.decode_all(ids)
    assert [ours.decode(i) for i in ids[:50]] == [reference.decode(i) for i in ids[:50]]


def test_tokenizer_json_only_tokenizes_as_sentencepiece(pair, texts):
    style, both, json_only = pair
    src_lang, targets = LANGS[style]
    reference = load_language_tokenizer(local_reader(str(both)))
    assert_same_tokenizer(reference, load_language_tokenizer(local_reader(str(json_only))), texts, src_lang, targets[0])


@pytest.mark.parametrize("pair", ["nllb"], indirect=True)
def test_nllb_tokenizer_json_in_transformers_4_format(pair, texts, tmp_path):
    """The hub's NLLB files, written by transformers 4: merges as "a b" strings, Metaspace's
    ``add_prefix_space`` (no ``split``)."""
    _, both, json_only = pair
    older = Path(shutil.copytree(json_only, tmp_path / "older"))
    spec = json.loads((older / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["merges"] = [" ".join(merge) for merge in spec["model"]["merges"]]
    spec["pre_tokenizer"] = spec["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True,
                                               "prepend_scheme": "always"}
    (older / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    reference = load_language_tokenizer(local_reader(str(both)))
    assert_same_tokenizer(reference, load_language_tokenizer(local_reader(str(older))), texts, "deu_Latn", "fra_Latn")


@pytest.mark.parametrize("pair", ["m2m100"], indirect=True)
def test_m2m100_without_vocab_json_uses_tokenizer_json_vocabulary(pair, texts, tmp_path):
    """An M2M100 directory with tokenizer.json and tokenizer_config.json alone: the file's own vocabulary
    (and its class, M2M100Tokenizer, telling it from NLLB) gives the same ids."""
    _, both, json_only = pair
    bare = Path(shutil.copytree(json_only, tmp_path / "bare"))
    (bare / "vocab.json").unlink()
    reference = load_language_tokenizer(local_reader(str(both)))
    assert_same_tokenizer(reference, load_language_tokenizer(local_reader(str(bare))), texts, "de", "fr")


def test_tokenizer_json_only_translates_identically(pair, texts):
    """``raymt.Translator`` on both directories: the same translations, scores and n-best lists (the
    scores follow every source id through the encoder), target languages mixed."""
    from raymt import Translator

    style, both, json_only = pair
    src_lang, cycle = LANGS[style]
    lines = texts[:160]
    targets = [cycle[i % len(cycle)] for i in range(len(lines))]
    search = SearchConfig(beam_size=2, num_hypotheses=2, max_decoding_length=10, max_length_a=0.0, max_length_b=10)
    want = Translator.load(str(both), search=search).translate_rows(lines, source_lang=src_lang, target_lang=targets)
    got = Translator.load(str(json_only), search=search).translate_rows(lines, source_lang=src_lang,
                                                                        target_lang=targets)
    assert got == want
    assert sum(bool(r.text.strip()) for r in want) > len(lines) // 2  # (text compared, not empty outputs)
    check_model(str(json_only))  # the driver's check passes it too


def test_neither_tokenizer_file_is_named_before_any_work(nllb_dir, tmp_path):
    model = Path(shutil.copytree(nllb_dir, tmp_path / "nllb"))
    (model / "sentencepiece.bpe.model").unlink()
    (model / "tokenizer.json").unlink()
    with pytest.raises(ModelError) as err:
        check_model(str(model))
    (problem,) = err.value.problems
    assert problem.startswith("tokenizer: ") and "needs sentencepiece.bpe.model or tokenizer.json" in problem
    assert "transformers 5 saves only tokenizer.json: both work" in problem
    with pytest.raises(FileNotFoundError, match="needs sentencepiece.bpe.model or tokenizer.json"):
        load_tokenizer(local_reader(str(model)))


def test_marian_directory_with_tokenizer_json_only_is_refused_saying_why(demo_model_dir, tmp_path):
    """A Marian model segments with two sentencepiece models: a tokenizer.json cannot stand in for them."""
    model = Path(shutil.copytree(demo_model_dir, tmp_path / "marian"))
    for name in ("source.spm", "target.spm"):
        (model / name).unlink()
    (model / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram", "vocab": []}}))
    with pytest.raises(FileNotFoundError) as err:
        load_tokenizer(local_reader(str(model)))
    assert "['source.spm', 'target.spm']" in str(err.value) and "tokenizer.json cannot replace them" in str(err.value)
    with pytest.raises(ModelError) as err:
        check_model(str(model))
    assert any(p.startswith("tokenizer file(s) missing: source.spm, target.spm (a Marian model needs")
               for p in err.value.problems), err.value.problems
