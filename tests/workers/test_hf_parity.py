"""Token-for-token parity with HF ``MarianMTModel`` on small random-weight checkpoints.

Two checkpoint shapes, each with its real OPUS-MT tokenizer files: ``en-mg`` (swish, shared vocab,
pad = last id, ``forced_eos_token_id: null``) and ``tc-big-fr-en`` (relu, EOS 43311, pad 53016,
forced EOS).
HF writes them with ``save_pretrained``; we load them with ``CoreDecoder.load`` and compare
teacher-forced logits, greedy outputs and beam n-best lists (tokens and ``sequences_scores``)
against ``MarianMTModel.generate`` on WMT22 source lines.

The weights are random: weight matrices and embeddings N(0, 0.3), biases N(0, 0.1), LayerNorms left
at (1, 0) so that outputs depend on the source (with random LayerNorms every sentence decodes to
nearly the same string), and ``final_logits_bias`` +8 on EOS so that hypotheses come out as a mix
of EOS-terminated and length-capped ones (both paths are asserted to occur). Beam runs cover
every beam size and length penalty on each shape; the full cross product runs with ``-m slow``.
HF's ``bad_words_ids=[[pad]]`` is passed explicitly (HF 5 drops it from saved configs; we always
ban ``<pad>``).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.conftest import shared_path
from raymt.workers.checkpoints.checkpoint import save_checkpoint
from raymt.workers.config import ModelConfig, SearchConfig
from raymt.workers.model.model import MarianModel
from raymt.workers.decoder.core_decoder import CoreDecoder
from tests.workers.reference_decoding import translate_ids

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
              pytest.mark.usefixtures("one_thread")]

NUM_LINES = 50
MAX_NEW_TOKENS = 20
EOS_BIAS = 8.0
TIE_EPS = 1e-5  # n-best entries this close in score may come in either order
SCORE_TOL = 1e-4
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")


@dataclass(frozen=True)
class Shape:
    name: str  # folder under opus-mt-spm/
    activation: str
    forced_eos: bool


SHAPES = (Shape("en-mg", "swish", False), Shape("tc-big-fr-en", "relu", True))


@dataclass
class Pair:
    """One checkpoint seen by HF and by us."""

    shape: Shape
    hf: "transformers.MarianMTModel"
    ours: CoreDecoder
    eos: int
    pad: int
    directory: Path | None = None


def randomize(model: torch.nn.Module, eos: int, seed: int = 0, eos_bias: float = EOS_BIAS) -> None:
    """Random weights with source-dependent outputs and a strong EOS bias (see module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad or "layer_norm" in name:
                continue
            std = 0.1 if name.endswith(".bias") else 0.3
            p.copy_(torch.randn(p.shape, generator=gen) * std)
        model.final_logits_bias.zero_()
        model.final_logits_bias[0, eos] = eos_bias


def build_pair(shape: Shape, directory: Path) -> Pair:
    spm_dir = shared_path("opus-mt-spm", shape.name)
    vocab = json.loads((spm_dir / "vocab.json").read_bytes())
    eos, pad, v = vocab["</s>"], vocab["<pad>"], max(vocab.values()) + 1
    # MarianConfig defaults forced_eos_token_id to 0, so "no forced EOS" must be an explicit None.
    forced = eos if shape.forced_eos else None
    cfg = transformers.MarianConfig(
        vocab_size=v, decoder_vocab_size=v, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        activation_function=shape.activation, max_position_embeddings=256, scale_embedding=True,
        share_encoder_decoder_embeddings=True, pad_token_id=pad, eos_token_id=eos,
        decoder_start_token_id=pad, forced_eos_token_id=forced)
    hf = transformers.MarianMTModel(cfg).eval()
    randomize(hf, eos)
    hf.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(spm_dir / name, directory / name)
    ours = CoreDecoder.load(str(directory), max_batch_size=16)  # several length-sorted batches
    assert ours.forced_eos == shape.forced_eos
    assert hf.generation_config.forced_eos_token_id == forced
    return Pair(shape, hf, ours, eos, pad, directory)


@pytest.fixture(scope="module")
def get_pair(tmp_path_factory):
    """``get_pair(shape)``: the checkpoint pair of ``shape``, built once per module."""
    built: dict[str, Pair] = {}

    def get(shape: Shape) -> Pair:
        if shape.name not in built:
            built[shape.name] = build_pair(shape, tmp_path_factory.mktemp(shape.name))
        return built[shape.name]
    return get


@pytest.fixture(params=SHAPES, ids=lambda s: s.name)
def pair(request, get_pair) -> Pair:
    return get_pair(request.param)


@pytest.fixture(scope="module")
def source_lines() -> list[str]:
    path = shared_path("wmt22", "generaltest2022.de-en.src.de")
    return path.read_text(encoding="utf-8").splitlines()[:NUM_LINES]


def padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids padded with ``pad`` and the (B, T) bool mask of real tokens."""
    t = max(len(r) for r in rows)
    ids = torch.full((len(rows), t), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), t), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    return ids, mask


def hf_generate(p: Pair, sources: list[list[int]], beam: int, length_penalty: float,
                max_new_tokens: int = MAX_NEW_TOKENS):
    ids, mask = padded(sources, p.pad)
    with torch.no_grad():
        out = p.hf.generate(input_ids=ids, attention_mask=mask.long(), num_beams=beam, num_return_sequences=beam,
                            length_penalty=length_penalty, max_new_tokens=max_new_tokens, do_sample=False,
                            early_stopping=False, bad_words_ids=[[p.pad]], output_scores=beam > 1,
                            return_dict_in_generate=True)
    seqs = []
    for row in out.sequences.tolist():
        row = row[1:]  # drop decoder_start
        while row and row[-1] == p.pad:  # HF pads finished rows; pad itself is banned
            row.pop()
        seqs.append(tuple(row))
    scores = out.sequences_scores.tolist() if beam > 1 else None
    return seqs, scores


def assert_nbest_equal(ours: list[tuple[tuple[int, ...], float]], theirs: list[tuple[tuple[int, ...], float]]):
    """n-best lists (tokens, score), best first: scores within SCORE_TOL position by position; tokens
    equal position by position, except that runs of entries tied within TIE_EPS compare as sets."""
    assert len(ours) == len(theirs)
    for (_, a), (_, b) in zip(ours, theirs):
        assert abs(a - b) < SCORE_TOL, (ours, theirs)
    start = 0
    while start < len(theirs):
        end = start + 1
        while end < len(theirs) and abs(theirs[end][1] - theirs[end - 1][1]) < TIE_EPS:
            end += 1
        assert sorted(t for t, _ in ours[start:end]) == sorted(t for t, _ in theirs[start:end]), (ours, theirs)
        start = end


def assert_both_endings(seqs: list[tuple[int, ...]], eos: int) -> None:
    """The EOS path and the length cap must both be exercised."""
    natural = sum(1 for s in seqs if s and s[-1] == eos and len(s) < MAX_NEW_TOKENS)
    capped = sum(1 for s in seqs if len(s) == MAX_NEW_TOKENS)
    assert natural > 0 and capped > 0, (natural, capped)


def test_teacher_forced_logits_match_hf(pair, source_lines):
    tok = pair.ours.checkpoint.tokenizer
    model = pair.ours.checkpoint.model
    src, src_mask = padded(pair.ours.encode(source_lines[:8]), pair.pad)
    ref = shared_path("wmt22", "generaltest2022.de-en.ref.A.en").read_text(encoding="utf-8").splitlines()[:8]
    targets = [[model.config.decoder_start_token_id] + tok.encode_target(t)[:19] for t in ref]
    tgt, _ = padded(targets, pair.pad)
    with torch.no_grad():
        expected = pair.hf(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt).logits
        got = model(src, src_mask, tgt)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_greedy_matches_hf(pair, source_lines):
    sources = pair.ours.encode(source_lines)
    cfg = SearchConfig(beam_size=1, num_hypotheses=1, max_decoding_length=MAX_NEW_TOKENS,
                       max_length_b=MAX_NEW_TOKENS)
    ours = [h[0] for h in translate_ids(pair.ours, sources, cfg)]
    seqs, _ = hf_generate(pair, sources, beam=1, length_penalty=1.0)
    assert [h.tokens for h in ours] == seqs
    assert_both_endings(seqs, pair.eos)
    # End to end: our translated strings are HF's tokenizer decode of HF's ids.
    hf_tok = transformers.MarianTokenizer.from_pretrained(str(pair.directory))
    texts = [t.text for t in pair.ours.translate(source_lines, cfg)]
    assert texts == hf_tok.batch_decode([list(s) for s in seqs], skip_special_tokens=True)
    # Scores: sum of HF's log-probs of the chosen tokens (forced EOS at the cap scores 0), / length.
    with torch.no_grad():
        for start in range(0, len(seqs), 10):
            chunk = list(range(start, min(start + 10, len(seqs))))
            src, mask = padded([sources[i] for i in chunk], pair.pad)
            tgt, _ = padded([[pair.pad] + list(seqs[i][:-1]) for i in chunk], pair.pad)
            lp = torch.log_softmax(pair.hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits, -1)
            for row, i in enumerate(chunk):
                n = len(seqs[i])
                token_lp = lp[row, torch.arange(n), torch.tensor(seqs[i])]
                if pair.shape.forced_eos and n == MAX_NEW_TOKENS:
                    token_lp[-1] = 0.0
                assert ours[i].log_prob == pytest.approx(float(token_lp.sum()), abs=SCORE_TOL)
                assert ours[i].score == pytest.approx(ours[i].log_prob / n, abs=SCORE_TOL)


BEAM_CASES = [  # each shape runs every beam size and length penalty once; the rest are `slow`
    ("en-mg", 4, 1.0), ("en-mg", 5, 0.6), ("tc-big-fr-en", 4, 0.6), ("tc-big-fr-en", 5, 1.0),
]


def beam_params():
    for shape in SHAPES:
        for beam in (4, 5):
            for lp in (1.0, 0.6):
                marks = () if (shape.name, beam, lp) in BEAM_CASES else (pytest.mark.slow,)
                yield pytest.param(shape, beam, lp, marks=marks, id=f"{shape.name}-beam{beam}-lp{lp}")


@pytest.mark.parametrize(("shape", "beam", "length_penalty"), beam_params())
def test_beam_nbest_matches_hf(shape, beam, length_penalty, get_pair, source_lines):
    p = get_pair(shape)
    sources = p.ours.encode(source_lines)
    cfg = SearchConfig(beam_size=beam, num_hypotheses=beam, length_penalty=length_penalty,
                       max_decoding_length=MAX_NEW_TOKENS, max_length_b=MAX_NEW_TOKENS)
    ours = translate_ids(p.ours, sources, cfg)
    seqs, scores = hf_generate(p, sources, beam, length_penalty)
    assert_both_endings(seqs, p.eos)
    for i, hyps in enumerate(ours):
        theirs = list(zip(seqs[i * beam: (i + 1) * beam], scores[i * beam: (i + 1) * beam]))
        assert_nbest_equal([(h.tokens, h.score) for h in hyps], theirs)


def tiny_model(seed: int = 1, eos_bias: float = EOS_BIAS) -> MarianModel:
    """A 101-token model of ours (eos 0, pad 100): fast round trips through HF."""
    cfg = ModelConfig(vocab_size=101, decoder_vocab_size=101, d_model=32, encoder_layers=2, decoder_layers=2,
                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                      max_position_embeddings=64, pad_token_id=100, eos_token_id=0, decoder_start_token_id=100)
    model = MarianModel(cfg).eval()
    randomize(model, cfg.eos_token_id, seed=seed, eos_bias=eos_bias)
    return model


def test_our_checkpoint_loads_in_hf_with_identical_logits(tmp_path):
    ours = tiny_model()
    cfg = ours.config
    save_checkpoint(str(tmp_path), ours, {})
    hf, info = transformers.MarianMTModel.from_pretrained(str(tmp_path), output_loading_info=True)
    hf.eval()
    assert not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert set(info["missing_keys"]) <= {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight",
                                         "lm_head.weight"}, info
    gen = torch.Generator().manual_seed(2)
    src = torch.randint(1, 100, (3, 9), generator=gen)
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[1, 6:], src_mask[2, 3:] = False, False
    src = src.masked_fill(~src_mask, cfg.pad_token_id)
    tgt = torch.cat([torch.full((3, 1), cfg.decoder_start_token_id), torch.randint(0, 100, (3, 7), generator=gen)], 1)
    with torch.no_grad():
        expected = hf(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt).logits
        got = ours(src, src_mask, tgt)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("forced_key", ["absent", "eos", "null"])
def test_forced_eos_follows_config_json_like_hf_from_pretrained(tmp_path, forced_key):
    """Real OPUS-MT configs (en-mg) lack ``forced_eos_token_id``. HF 5.x ``from_pretrained`` then builds
    its generation config from the keys present, so nothing is forced (even though ``MarianConfig``
    itself defaults the attribute to 0); an explicit id forces it. We follow config.json the same way."""
    spm_dir = shared_path("opus-mt-spm", "en-mg")
    model = tiny_model(eos_bias=0.0)
    vocab = {"</s>": 0, "<unk>": 1, **{f"\u2581w{i}": i for i in range(2, 100)}, "<pad>": 100}
    save_checkpoint(str(tmp_path), model, {"source.spm": (spm_dir / "source.spm").read_bytes(),
                                           "target.spm": (spm_dir / "target.spm").read_bytes(),
                                           "vocab.json": json.dumps(vocab).encode()})
    config = json.loads((tmp_path / "config.json").read_text())
    if forced_key == "absent":
        del config["forced_eos_token_id"]
    else:
        config["forced_eos_token_id"] = 0 if forced_key == "eos" else None
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").unlink()
    forced = forced_key == "eos"
    hf = transformers.MarianMTModel.from_pretrained(str(tmp_path)).eval()
    assert hf.generation_config.forced_eos_token_id == (0 if forced else None)
    p = Pair(Shape("tiny", "swish", forced), hf, CoreDecoder.load(str(tmp_path)), eos=0, pad=100)
    assert p.ours.forced_eos == forced
    gen = torch.Generator().manual_seed(3)
    sources = [torch.randint(2, 100, (int(n),), generator=gen).tolist() + [0] for n in torch.randint(1, 12, (12,))]
    for beam in (1, 3):
        cfg = SearchConfig(beam_size=beam, num_hypotheses=beam, max_decoding_length=6, max_length_b=6)
        ours = [(h.tokens, h.score) for hyps in translate_ids(p.ours, sources, cfg) for h in hyps]
        seqs, scores = hf_generate(p, sources, beam, 1.0, max_new_tokens=6)
        assert any(len(s) == 6 and (s[-1] == 0) == forced for s in seqs)  # the cap is reached
        if beam == 1:
            assert [t for t, _ in ours] == seqs
            continue
        for i in range(len(sources)):
            assert_nbest_equal(ours[i * beam: (i + 1) * beam], list(zip(seqs, scores))[i * beam: (i + 1) * beam])
