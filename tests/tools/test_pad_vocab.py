"""``tools/pad_vocab.py``: the demo model padded to more words translates exactly as before, in ours,
HF generate and CTranslate2, with every vocabulary-sized tensor and the config at the padded size."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT, SHARED_DATA, shared_path
from tools.pad_vocab import DEFAULT_WORDS, UNREACHABLE, Padding, hf_translations, main, pad, padding_problems

WORDS = 12000
EXTRA_LINES = ["Ein Hund rennt über eine grüne Wiese.", "Das Wetter ist heute sehr schön.",
               "Wir haben gestern lange über die Zukunft der Stadt gesprochen.", "Ich trinke gern Kaffee am Morgen.",
               "Die Kinder lachen.", "Ein älterer Herr liest im Park eine Zeitung, während es regnet.",
               "Wo ist der Bahnhof?", "Zwei Frauen tragen schwere Taschen die Treppe hinauf."]


@pytest.fixture(scope="module")
def lines() -> list[str]:
    sample = (ROOT / "examples" / "sample.de.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in sample if line.strip()] + EXTRA_LINES


@pytest.fixture(scope="module")
def padded_dir(demo_model_dir, tmp_path_factory) -> str:
    return pad(str(demo_model_dir), str(tmp_path_factory.mktemp("padded") / f"demo-{WORDS}"), WORDS)


@pytest.fixture(scope="module")
def translators(demo_model_dir, padded_dir):
    from raymt import Translator

    with Translator.load(str(demo_model_dir), threads=1) as original, Translator.load(padded_dir, threads=1) as padded:
        yield original, padded


def test_every_vocabulary_tensor_and_the_config_have_the_padded_size(demo_model_dir, padded_dir):
    before = load_file(str(demo_model_dir / "model.safetensors"))
    after = load_file(f"{padded_dir}/model.safetensors")
    assert set(after) == set(before)
    old_table, old_bias = before["model.shared.weight"], before["final_logits_bias"]  # (8001, 256), (1, 8001)
    table, bias = after["model.shared.weight"], after["final_logits_bias"]
    assert table.shape == (WORDS, 256) and bias.shape == (1, WORDS) and table.dtype == old_table.dtype
    assert torch.equal(table[:8000], old_table[:8000]) and torch.equal(bias[:, :8000], old_bias[:, :8000])
    assert torch.equal(table[-1], old_table[8000]) and bias[0, -1] == old_bias[0, 8000]  # <pad> stays last
    assert (bias[0, 8000:-1] == UNREACHABLE).all() and 0 < table[8000:-1].float().std() < 0.05
    assert all(torch.equal(after[k], before[k]) for k in before if k not in ("model.shared.weight", "final_logits_bias"))
    config = json.loads(open(f"{padded_dir}/config.json").read())
    generation = json.loads(open(f"{padded_dir}/generation_config.json").read())
    vocab = json.loads(open(f"{padded_dir}/vocab.json", encoding="utf-8").read())
    assert config["vocab_size"] == config["decoder_vocab_size"] == WORDS
    assert config["pad_token_id"] == config["decoder_start_token_id"] == generation["pad_token_id"] == WORDS - 1
    assert config["bad_words_ids"] == generation["bad_words_ids"] == [[WORDS - 1]]
    assert config["eos_token_id"] == generation["eos_token_id"] == 0
    assert sorted(vocab.values()) == list(range(WORDS)) and vocab["<pad>"] == WORDS - 1
    assert (vocab["</s>"], vocab["<unk>"], vocab["<pad_vocab_00001>"], vocab["<pad_vocab_03999>"]) == (0, 1, 8000, 11998)
    assert (demo_model_dir / "source.spm").read_bytes() == open(f"{padded_dir}/source.spm", "rb").read()


@pytest.mark.parametrize("beam_size", [1, 4])
def test_ours_translates_identically_with_the_same_scores(translators, lines, beam_size):
    original, padded = translators
    assert original.core.checkpoint.model.config.decoder_vocab_size == 8001
    assert padded.core.checkpoint.model.config.decoder_vocab_size == WORDS
    before = [n[0] for n in original.translate(lines, nbest=1, beam_size=beam_size)]
    after = [n[0] for n in padded.translate(lines, nbest=1, beam_size=beam_size)]
    assert len(lines) == 20 and [t for t, _ in after] == [t for t, _ in before]
    assert max(abs(a - b) for (_, a), (_, b) in zip(after, before)) < 1e-4


def test_hf_loads_every_key_and_generates_identically(demo_model_dir, padded_dir, lines):
    transformers = pytest.importorskip("transformers")
    _, info = transformers.MarianMTModel.from_pretrained(padded_dir, output_loading_info=True)
    assert not any(info.values())  # no missing, unexpected or misshaped key
    assert hf_translations(padded_dir, lines, 4) == hf_translations(str(demo_model_dir), lines, 4)


@pytest.fixture(scope="module")
def ct2_models(demo_model_dir, padded_dir, tmp_path_factory):
    ctranslate2 = pytest.importorskip("ctranslate2")
    out = tmp_path_factory.mktemp("ct2")
    paths = []
    for name, model in (("original", str(demo_model_dir)), ("padded", padded_dir)):
        paths.append(ctranslate2.converters.TransformersConverter(model).convert(str(out / name), force=True))
    return [ctranslate2.Translator(path, device="cpu", intra_threads=1) for path in paths]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_ctranslate2_translates_identically(ct2_models, translators, lines, beam_size):
    """Converted as ``benchmarks.peers`` converts (the converter drops the last row as ``<pad>``: it must stay last)."""
    tok = translators[0].core.checkpoint.tokenizer
    pieces = [tok.source_pieces(line) + ["</s>"] for line in lines]
    before, after = (model.translate_batch(pieces, beam_size=beam_size, return_scores=True) for model in ct2_models)
    assert [r.hypotheses[0] for r in after] == [r.hypotheses[0] for r in before]
    assert max(abs(a.scores[0] - b.scores[0]) for a, b in zip(after, before)) < 1e-4
    assert not any(p.startswith("<pad") for r in after for p in r.hypotheses[0])


def test_opus_mt_size_padding_translates_identically(demo_model_dir, translators, lines, tmp_path):
    from raymt import Translator

    out = pad(str(demo_model_dir), str(tmp_path / "demo-58k"), DEFAULT_WORDS)
    with Translator.load(out, threads=1) as padded:
        assert padded.core.checkpoint.model.config.decoder_vocab_size == DEFAULT_WORDS == 58101
        assert padded.translate(lines, beam_size=1) == translators[0].translate(lines, beam_size=1)


def test_the_command_checks_the_copy_with_ours_and_hf(demo_model_dir, tmp_path, capsys):
    pytest.importorskip("transformers")
    main(["--model", str(demo_model_dir), "--out", str(tmp_path / "demo-9k"), "--vocab", "9000"])
    printed = capsys.readouterr().out
    assert "padded to 9000 words" in printed and "beam 1 5/5, beam 4 5/5" in printed
    assert "HF generate beam 4 5/5" in printed


@pytest.mark.parametrize("words, size, pad_id, new_ids, moved", [
    (10, 15, 9, range(9, 14), {9: 14, 8: 8, 0: 0}),  # <pad> last: new words before it, it moves to the end
    (10, 15, 3, range(10, 15), {3: 3, 9: 9}),  # elsewhere: new words appended, no id moves
])
def test_where_the_new_words_go(words, size, pad_id, new_ids, moved):
    padding = Padding(words, size, pad_id)
    assert padding.new_ids == new_ids and {old: padding.new_id(old) for old in moved} == moved
    table = torch.arange(words, dtype=torch.float32)[:, None]  # (V, 1): each row its id
    out = padding.insert(table, torch.full((size - words, 1), -1.0))[:, 0]
    assert [out[padding.new_id(i)].item() for i in range(words)] == list(range(words))
    assert (out[list(new_ids)] == -1).all()


def test_every_reason_a_checkpoint_cannot_be_padded_at_once():
    hf = {"share_encoder_decoder_embeddings": False, "pad_token_id": 9}
    reasons = padding_problems(hf, {"<pad>": 8, "a": 12}, words=10, size=10)
    assert len(reasons) == 4 and "separate" in reasons[0] and "already has 10" in reasons[1]
    assert "outside 0..9" in reasons[2] and "not pad_token_id 9" in reasons[3]
    with pytest.raises(ValueError, match="already has 10"):
        Padding(10, 8, 9)


def test_the_peer_benchmark_runs_a_padded_copy(demo_model_dir, tmp_path):
    pytest.importorskip("transformers")
    from benchmarks.bench import main as bench

    shared_path("multi30k", "test_2016_flickr.de")
    out = tmp_path / "peers"
    bench(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--sets", "multi30k", "--lines", "6",
           "--beams", "1", "--repeats", "1", "--systems", "ours-exact,hf", "--profile", "", "--pad-vocab", str(WORDS),
           "--out", str(out)])
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["model"] == f"{demo_model_dir} padded to {WORDS} words"
    assert report["tables"]["multi30k/beam1"]["identical_outputs"] == {"ours-exact = hf": 6}
    assert f"padded to {WORDS} words" in out.with_suffix(".md").read_text()
