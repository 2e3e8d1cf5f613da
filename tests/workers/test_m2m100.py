"""M2M100 / NLLB-200 in our own decoder, checked against HF ``M2M100ForConditionalGeneration``.

Tiny random-weight models (d_model 32, 2+2 layers) with a SentencePiece model trained here on
Multi30k lines, saved in both directory styles: NLLB (``sentencepiece.bpe.model`` + ``tokenizer.json``,
codes ``deu_Latn``) and M2M100 (``vocab.json`` + ``sentencepiece.bpe.model``, codes ``__de__``).

Random weights give flat, repetitive outputs; here they are drawn large (std 0.3) so the logits are
peaky, and the EOS logit gets a bias through the decoder's final LayerNorm bias (M2M100 has no
``final_logits_bias``): hypotheses end by EOS at several lengths and at the cap. HF's ``forced_bos_token_id``
is global, so HF decodes each target language's rows on their own and is compared row by row with our one
mixed batch. Our search always bans ``<pad>`` (as for Marian checkpoints), so HF is asked to ban it too
(``bad_words_ids``): the same log-softmax, then -inf.
"""
from __future__ import annotations

import io
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.conftest import shared_path
from raymt.workers.checkpoints.checkpoint import UnsupportedCheckpoint, config_from_hf, expected_layout, local_reader
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.engine import Engine, batch_schedule
from raymt.workers.text.lang_tokenizer import load_language_tokenizer
from raymt.workers.kernels.speedups import CpuSpeedups
from raymt.workers.decoder.static_step import StaticStep
from raymt.workers.decoder.core_decoder import CoreDecoder

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.usefixtures("one_thread")

CAP = 14  # generated tokens (target language and EOS included)
EOS, PAD = 2, 1
EOS_BIAS = {"nllb": 7.0, "m2m100": 5.0}  # (per model: both endings, EOS at several lengths)
STYLES = ("nllb", "m2m100")
LANGS = {"nllb": ("deu_Latn", ["fra_Latn", "eng_Latn", "fra_Latn", "ita_Latn"]),
         "m2m100": ("de", ["fr", "en", "fr", "it"])}
PLAIN = CpuSpeedups()


@pytest.fixture(scope="session")
def spm_model() -> bytes:
    return train_spm()


def train_spm() -> bytes:
    """A 600-piece BPE model trained on Multi30k's de / en / fr lines."""
    lines = []
    for lang in ("de", "en", "fr"):
        lines += shared_path("multi30k", f"train.{lang}").read_text(encoding="utf-8").splitlines()[:1500]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=600, model_type="bpe",
                                   character_coverage=1.0, minloglevel=2)
    return out.getvalue()


@pytest.fixture(scope="module")
def source_lines() -> list[str]:
    lines = shared_path("multi30k", "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    return [lines[i] for i in (0, 3, 7, 11, 19, 23, 29, 31)] + ["Hund.", "Ein Mann mit einem roten Hut steht vor "
                                                                 "einem großen Haus, und zwei Kinder spielen."]


def write_tokenizer(directory: Path, style: str, spm_model: bytes):
    """The directory's tokenizer files as HF writes them; returns HF's tokenizer."""
    (directory / "sentencepiece.bpe.model").write_bytes(spm_model)
    if style == "nllb":
        from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES
        tok = transformers.NllbTokenizer.from_pretrained(str(directory), extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES))
    else:
        proc = spm.SentencePieceProcessor(model_proto=spm_model)
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        for i in range(proc.get_piece_size()):
            if not (proc.is_unknown(i) or proc.is_control(i)):
                vocab[proc.id_to_piece(i)] = len(vocab)
        (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
        tok = transformers.M2M100Tokenizer(str(directory / "vocab.json"), str(directory / "sentencepiece.bpe.model"))
    tok.save_pretrained(str(directory))
    return tok


def randomize(model, eos_bias: float, seed: int = 0) -> None:
    """Peaky random weights (std 0.3), layer norms as initialised, EOS favoured by EOS_BIAS through the
    decoder's final LayerNorm bias (EOS's logit + eos_bias; the others move by their correlation with it)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.1 if name.endswith(".bias") else 0.3))
        e = model.model.shared.weight[EOS]
        model.model.decoder.layer_norm.bias.copy_(eos_bias * e / e.dot(e))


@pytest.fixture(scope="module", params=STYLES)
def model_dir(request, tmp_path_factory, spm_model):
    style = request.param
    directory = tmp_path_factory.mktemp(style)
    hf_tok = write_tokenizer(directory, style, spm_model)
    torch.manual_seed(0)
    vocab = len(hf_tok) if style == "nllb" else max(hf_tok.lang_code_to_id.values()) + 1 + 8  # (+ 8 made-up words)
    cfg = transformers.M2M100Config(vocab_size=vocab, d_model=32,
                                    encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                    max_position_embeddings=64, dropout=0.0, attention_dropout=0.0)
    hf = transformers.M2M100ForConditionalGeneration(cfg).eval()
    randomize(hf, EOS_BIAS[style])
    hf.save_pretrained(str(directory))
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "decoder_start_token_id": 2, "eos_token_id": 2, "max_length": 200, "pad_token_id": 1}))
    return style, directory, hf, hf_tok


def make_nllb_dir(directory: Path, spm_model: bytes) -> Path:
    """A tiny random NLLB directory (1+1 layers), for the job, API, operator and shortlist tests
    (``tests/conftest.py``'s ``nllb_dir``)."""
    tok = write_tokenizer(directory, "nllb", spm_model)
    torch.manual_seed(0)
    cfg = transformers.M2M100Config(vocab_size=len(tok), d_model=32, encoder_layers=1, decoder_layers=1,
                                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                    decoder_ffn_dim=64, max_position_embeddings=64)
    hf = transformers.M2M100ForConditionalGeneration(cfg).eval()
    randomize(hf, EOS_BIAS["nllb"])
    hf.save_pretrained(str(directory))
    return directory


def hf_generate(hf, hf_tok, texts, src_lang, tgt_lang, beam):
    """HF's sequences (start token and padding cut) and n-best-1 scores for one target language."""
    hf_tok.src_lang = src_lang
    enc = hf_tok(texts, return_tensors="pt", padding=True)
    m2m = isinstance(hf_tok, transformers.M2M100Tokenizer)
    forced = hf_tok.get_lang_id(tgt_lang) if m2m else hf_tok.convert_tokens_to_ids(tgt_lang)
    out = hf.generate(**enc, num_beams=beam, max_length=CAP + 1, forced_bos_token_id=forced, bad_words_ids=[[PAD]],
                      do_sample=False, length_penalty=1.0, early_stopping=False, num_return_sequences=1,
                      output_scores=True, return_dict_in_generate=True)
    seqs = []
    for row in out.sequences.tolist():
        row = row[1:]
        seqs.append(tuple(row[: row.index(EOS) + 1] if EOS in row else row))
    return seqs, (out.sequences_scores.tolist() if beam > 1 else None)


def hf_decode(hf_tok, ids, ours) -> str:
    """HF's text of ``ids``, special tokens skipped; language codes dropped first (HF's M2M100Tokenizer,
    built here, keeps ``__fr__`` in its text, although its codes are registered as special tokens)."""
    codes = set(ours.languages.values())
    return hf_tok.decode([i for i in ids if i not in codes], skip_special_tokens=True)


def test_encoder_and_teacher_forced_logits_equal_hf(model_dir, source_lines):
    style, directory, hf, hf_tok = model_dir
    ours = CoreDecoder.load(str(directory), speedups=PLAIN)
    src_lang, _ = LANGS[style]
    hf_tok.src_lang = src_lang
    enc = hf_tok(source_lines, return_tensors="pt", padding=True)
    assert [ids for ids in ours.encode(source_lines, src_lang)] == [
        [i for i in row if i != PAD] for row in enc.input_ids.tolist()]
    model, mask = ours.checkpoint.model, enc.attention_mask.bool()
    tgt = torch.randint(4, 500, (len(source_lines), 9))
    tgt[:, 0] = EOS
    with torch.no_grad():
        expected = hf.model.encoder(input_ids=enc.input_ids, attention_mask=enc.attention_mask).last_hidden_state
        torch.testing.assert_close(model.encode(enc.input_ids, mask), expected, atol=1e-5, rtol=0)
        logits = hf(**enc, decoder_input_ids=tgt).logits
        torch.testing.assert_close(model(enc.input_ids, mask, tgt), logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("speedups", [PLAIN, CpuSpeedups(fused_qkv=True, onednn=True, native=True)],
                         ids=["aten", "native"])
def test_mixed_target_languages_match_hf_generate(model_dir, source_lines, beam, speedups):
    """One batch of sources of many lengths (padding) and mixed target languages, token-identical to
    HF generate run per target language; beam scores within 1e-4; both ways of ending occur."""
    style, directory, hf, hf_tok = model_dir
    ours = CoreDecoder.load(str(directory), speedups=speedups)
    src_lang, cycle = LANGS[style]
    targets = [cycle[i % len(cycle)] for i in range(len(source_lines))]
    cfg = SearchConfig(beam_size=beam, max_decoding_length=CAP, max_length_a=0.0, max_length_b=CAP)
    got = ours.translate(source_lines, cfg, source_lang=src_lang, target_lang=targets)
    lengths = []
    for lang in sorted(set(targets)):
        rows = [i for i, t in enumerate(targets) if t == lang]
        seqs, scores = hf_generate(hf, hf_tok, [source_lines[i] for i in rows], src_lang, lang, beam)
        for j, i in enumerate(rows):
            assert got[i].tokens == seqs[j], (lang, i)
            assert got[i].tokens[0] == ours.checkpoint.tokenizer.lang_id(lang)
            assert got[i].text == hf_decode(hf_tok, seqs[j], ours.checkpoint.tokenizer)
            if scores is not None:
                assert got[i].score == pytest.approx(scores[j], abs=1e-4)
            lengths.append(len(seqs[j]))
    ends = [g.tokens[-1] == EOS for g in got]
    assert any(ends) and not all(ends), lengths  # some end by EOS, the others at the cap
    assert all(n == CAP for n, end in zip((len(g.tokens) for g in got), ends) if not end)


def test_static_step_and_shortlist_keep_the_forced_first_token(model_dir, source_lines):
    """The one-shape step forces each row's language as the dynamic step does; a shortlist without the
    language ids still starts every translation with its row's language (forced rows ignore the logits)."""
    style, directory, _, _ = model_dir
    tr = CoreDecoder.load(str(directory), speedups=PLAIN)
    src_lang, cycle = LANGS[style]
    targets = [cycle[i % len(cycle)] for i in range(len(source_lines))]
    sources = tr.encode(source_lines, src_lang)
    forced = tr.forced_first(targets, len(targets))
    cfg = SearchConfig(beam_size=3, max_decoding_length=CAP, max_length_a=0.0, max_length_b=CAP)
    dynamic = tr.decode_ids(sources, DecodeRequest(cfg), forced_first=forced).hypotheses
    static = tr.decode_ids(sources, DecodeRequest(cfg, static=StaticStep(readback_every=2)),
                           forced_first=forced).hypotheses
    assert [h[0].tokens for h in static] == [h[0].tokens for h in dynamic]
    langs = set(tr.checkpoint.tokenizer.languages.values())
    candidates = torch.tensor(sorted({EOS, PAD, 3} | set(range(4, 300)) - langs))
    engine = Engine(tr.checkpoint.model, cfg, batch_schedule(len(sources)), forced_eos=False, candidates=candidates)
    short = engine.decode(sources, forced)
    assert [h[0].tokens[0] for h in short] == forced
    assert all(t in set(candidates.tolist()) for h in short for t in h[0].tokens[1:])


@pytest.mark.parametrize("lower", [CpuSpeedups(int8=True), CpuSpeedups(fp16=True)], ids=["int8", "fp16"])
def test_lower_precision_agrees_with_float(model_dir, source_lines, lower):
    """int8 (workers/kernels/speedups.py rewrites the Linear layers, pre-norm or not) and float16 (HF's residual
    clamp included): most translations equal float32's."""
    style, directory, _, _ = model_dir
    src_lang, cycle = LANGS[style]
    cfg = SearchConfig(beam_size=4, max_decoding_length=CAP, max_length_a=0.0, max_length_b=CAP)
    ref = CoreDecoder.load(str(directory), speedups=PLAIN).translate(source_lines, cfg, source_lang=src_lang,
                                                                     target_lang=cycle[0])
    got = CoreDecoder.load(str(directory), speedups=lower).translate(
        source_lines, cfg, source_lang=src_lang, target_lang=cycle[0])
    same = sum(a.tokens == b.tokens for a, b in zip(ref, got))
    assert same >= 0.6 * len(ref), [(a.tokens, b.tokens) for a, b in zip(ref, got)]


def test_languages_are_required_and_checked(model_dir):
    style, directory, _, _ = model_dir
    tr = CoreDecoder.load(str(directory), speedups=PLAIN)
    src_lang, cycle = LANGS[style]
    with pytest.raises(ValueError, match="needs target_lang.*--target-lang"):
        tr.translate(["Ein Hund."], source_lang=src_lang)
    with pytest.raises(ValueError, match="needs source_lang"):
        tr.translate(["Ein Hund."], target_lang=cycle[0])
    with pytest.raises(ValueError) as error:
        tr.translate(["Ein Hund."], source_lang=src_lang, target_lang="xx_Yyyy")
    message = str(error.value)
    assert "\n" not in message and "'xx_Yyyy'" in message and ("202 codes" if style == "nllb" else "100 codes") in message
    assert tr.translate(["", "  "], source_lang=src_lang, target_lang=cycle[0])[0].text == ""
    if style == "m2m100":  # HF's codes are "de"; the token form is accepted too
        assert tr.checkpoint.tokenizer.lang_id("__de__") == tr.checkpoint.tokenizer.lang_id("de")
    search = tr.model_search_config()  # generation_config.json: max_length 200, HF's default 1 beam
    assert (search.beam_size, search.max_decoding_length, search.max_length_a) == (1, 199, 0.0)


def test_tokenizer_matches_hf_on_text(model_dir, source_lines):
    style, directory, _, hf_tok = model_dir
    ours = load_language_tokenizer(local_reader(str(directory)))
    src_lang, cycle = LANGS[style]
    hf_tok.src_lang = src_lang
    texts = source_lines + ["Zwei   Männer, 3 Kinder & ein Ölgemälde ж!", "  führende Leerzeichen"]
    for text in texts:
        ids = hf_tok(text).input_ids
        assert ours.encode(text, src_lang) == ids
        assert ours.decode(ids) == hf_decode(hf_tok, ids, ours)


def test_config_mapping_and_refusals():
    nllb_3b = {"model_type": "m2m_100", "vocab_size": 256206, "d_model": 2048, "encoder_layers": 24,
               "decoder_layers": 24, "encoder_attention_heads": 16, "decoder_attention_heads": 16,
               "encoder_ffn_dim": 8192, "decoder_ffn_dim": 8192, "max_position_embeddings": 1024,
               "scale_embedding": True, "activation_function": "relu", "pad_token_id": 1, "eos_token_id": 2,
               "decoder_start_token_id": 2}
    cfg = config_from_hf(nllb_3b)  # within SIZE_LIMITS
    assert (cfg.normalize_before, cfg.final_layer_norms, cfg.position_style) == (True, True, "fairseq")
    layout = expected_layout(replace(cfg, encoder_layers=1, decoder_layers=1))
    for key in ("model.encoder.layer_norm.weight", "model.decoder.layer_norm.bias", "model.shared.weight",
                "lm_head.weight"):
        assert key in layout.shapes
    with pytest.raises(UnsupportedCheckpoint) as error:
        config_from_hf({**nllb_3b, "model_type": "nllb-moe"})
    assert len(error.value.reasons) == 1 and "nllb-moe" in error.value.reasons[0]
    with pytest.raises(UnsupportedCheckpoint) as error:
        config_from_hf({**nllb_3b, "d_model": 2050, "activation_function": "tanh", "pad_token_id": 300000})
    reasons = " | ".join(error.value.reasons)  # every reason at once
    assert "d_model 2050 not divisible" in reasons and "tanh" in reasons and "pad_token_id=300000" in reasons


def test_public_api_takes_languages(model_dir, source_lines):
    """``raymt.Translator`` (the job's row path) translates as ``workers.core_decoder.CoreDecoder`` does."""
    from raymt import Translator as Api

    style, directory, _, _ = model_dir
    src_lang, cycle = LANGS[style]
    targets = [cycle[i % len(cycle)] for i in range(len(source_lines))]
    api = Api.load(str(directory), search=SearchConfig(beam_size=2))
    core = CoreDecoder.load(str(directory))
    want = [t.text for t in core.translate(source_lines, SearchConfig(beam_size=2), source_lang=src_lang,
                                           target_lang=targets)]
    assert api.translate(source_lines, source_lang=src_lang, target_lang=targets) == want
    with pytest.raises(ValueError, match="needs source_lang"):
        api.translate(source_lines)


def test_position_table_keys_some_files_carry_are_skipped(model_dir, tmp_path):
    """``embed_positions.weights`` / ``._float_tensor`` (tables HF recomputes too) load; any other stray key is refused."""
    from safetensors.torch import load_file, save_file

    style, directory, _, _ = model_dir
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    weights = load_file(str(copy / "model.safetensors"))
    weights["model.encoder.embed_positions.weights"] = torch.zeros(66, 32)
    weights["model.decoder.embed_positions._float_tensor"] = torch.zeros(1)
    save_file(weights, str(copy / "model.safetensors"))
    assert CoreDecoder.load(str(copy), speedups=PLAIN).checkpoint.multilingual
    weights["model.encoder.stray"] = torch.zeros(1)
    save_file(weights, str(copy / "model.safetensors"))
    with pytest.raises(UnsupportedCheckpoint, match="model.encoder.stray"):
        CoreDecoder.load(str(copy), speedups=PLAIN)


def test_nbest_scores_match_hf_with_a_length_penalty(model_dir, source_lines):
    """All 4 hypotheses of beam 4 (the forced language counted in the length, as HF counts it), lp 0.6."""
    style, directory, hf, hf_tok = model_dir
    src_lang, cycle = LANGS[style]
    ours = CoreDecoder.load(str(directory), speedups=PLAIN)
    cfg = SearchConfig(beam_size=4, num_hypotheses=4, length_penalty=0.6, max_decoding_length=CAP, max_length_a=0.0,
                       max_length_b=CAP)
    got = ours.translate(source_lines, cfg, source_lang=src_lang, target_lang=cycle[0])
    hf_tok.src_lang = src_lang
    m2m = isinstance(hf_tok, transformers.M2M100Tokenizer)
    forced = hf_tok.get_lang_id(cycle[0]) if m2m else hf_tok.convert_tokens_to_ids(cycle[0])
    out = hf.generate(**hf_tok(source_lines, return_tensors="pt", padding=True), num_beams=4, num_return_sequences=4,
                      max_length=CAP + 1, forced_bos_token_id=forced, bad_words_ids=[[PAD]], length_penalty=0.6,
                      early_stopping=False, output_scores=True, return_dict_in_generate=True)
    scores = out.sequences_scores.view(len(source_lines), 4).tolist()
    for translation, want in zip(got, scores):
        assert [s for _, s in translation.nbest] == pytest.approx(want, abs=1e-4)
