"""Checkpoint directory <-> model: config checks, weight-key checks, file formats and readers.

Tiny models (d_model 16) with a sentencepiece model trained in the test, so nothing here needs
the shared data folder except the real-config test.
"""
from __future__ import annotations

import io
import json
import pickle
import uuid

import fsspec
import pytest
import sentencepiece as spm
import torch

from raymt.pipeline.storage import model_reader
from tests.conftest import shared_path
from raymt.workers.checkpoints.checkpoint import (
    SIZE_LIMITS,
    UnsupportedCheckpoint,
    config_from_hf,
    expected_layout,
    load_checkpoint,
    load_state,
    local_reader,
    save_checkpoint,
    shape_problems,
    state_layout,
    unique_state,
)
from raymt.workers.config import ModelConfig
from raymt.workers.model.model import MarianModel, sinusoidal_table

pytestmark = [pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
              pytest.mark.usefixtures("one_thread")]


TINY = dict(d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32)
SOURCE_TEXT = ["the cat sat on the mat", "a dog ran in the park", "hello world again", "we test the loader",
               "quick brown foxes jump over lazy dogs", "vexing wizards box jolly quiz"]
TARGET_TEXT = ["die katze sass auf der matte", "ein hund lief im park", "hallo welt", "wir testen den lader"]


def train_spm(lines: list[str], vocab_size: int) -> bytes:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines * 10), model_writer=buf, vocab_size=vocab_size,
                                   model_type="unigram", hard_vocab_limit=False, minloglevel=2)
    return buf.getvalue()


def marian_vocab(spm_bytes: bytes) -> dict[str, int]:
    """OPUS-MT layout: ``</s>`` 0, ``<unk>`` 1, the pieces, ``<pad>`` last."""
    proc = spm.SentencePieceProcessor(model_proto=spm_bytes)
    pieces = [proc.id_to_piece(i) for i in range(proc.get_piece_size())]
    pieces = [p for p in pieces if p not in ("<unk>", "<s>", "</s>")]
    vocab = {"</s>": 0, "<unk>": 1}
    for p in pieces:
        vocab[p] = len(vocab)
    vocab["<pad>"] = len(vocab)
    return vocab


@pytest.fixture(scope="module")
def tok_files() -> dict:
    src, tgt = train_spm(SOURCE_TEXT, 60), train_spm(TARGET_TEXT, 30)
    return {"source.spm": src, "target.spm": tgt, "source_vocab": marian_vocab(src), "target_vocab": marian_vocab(tgt)}


def tiny_model(vocab_size: int, seed: int = 0, **overrides) -> MarianModel:
    kw = dict(vocab_size=vocab_size, decoder_vocab_size=vocab_size, pad_token_id=vocab_size - 1, eos_token_id=0,
              decoder_start_token_id=vocab_size - 1, **TINY)
    kw.update(overrides)
    torch.manual_seed(seed)
    model = MarianModel(ModelConfig(**kw)).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()
    return model


def shared_checkpoint(directory, tok_files, dtype=torch.float32) -> MarianModel:
    """A shared-vocabulary checkpoint written by ``save_checkpoint``; returns the model."""
    vocab = tok_files["source_vocab"]
    model = tiny_model(len(vocab))
    save_checkpoint(str(directory), model, {"source.spm": tok_files["source.spm"], "target.spm": tok_files["source.spm"],
                                            "vocab.json": json.dumps(vocab).encode()}, dtype=dtype)
    return model


def logits(model: MarianModel, seed: int = 1) -> torch.Tensor:
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, cfg.vocab_size - 1, (2, 6), generator=gen)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    tgt = torch.randint(0, cfg.decoder_vocab_size - 1, (2, 5), generator=gen)
    with torch.no_grad():
        return model(src, mask, tgt)


def assert_same_state(a: MarianModel, b: MarianModel) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], atol=0, rtol=0, msg=k)


# --- config.json -----------------------------------------------------------------------------------

BASE_HF = {"model_type": "marian", "vocab_size": 50, "d_model": 16, "encoder_attention_heads": 2,
           "decoder_attention_heads": 2, "activation_function": "swish", "pad_token_id": 49, "eos_token_id": 0}


def test_config_from_hf_reports_every_unsupported_option_at_once():
    bad = {**BASE_HF, "normalize_before": True, "model_type": "bart", "activation_function": "tanh"}
    with pytest.raises(UnsupportedCheckpoint) as err:
        config_from_hf(bad)
    reasons = err.value.reasons
    assert len(reasons) == 3, reasons
    for word in ("normalize_before", "model_type", "activation_function"):
        assert sum(word in r for r in reasons) == 1, (word, reasons)
        assert word in str(err.value)


def test_config_from_hf_lists_more_reasons_too():
    bad = {**BASE_HF, "add_final_layer_norm": True, "static_position_embeddings": False, "normalize_embedding": True,
           "add_bias_logits": True, "decoder_vocab_size": 60, "d_model": 15}
    with pytest.raises(UnsupportedCheckpoint) as err:
        config_from_hf(bad)
    reasons = " | ".join(err.value.reasons)
    assert len(err.value.reasons) == 6, reasons
    for word in ("add_final_layer_norm", "static_position_embeddings", "normalize_embedding", "add_bias_logits",
                 "decoder_vocab_size", "divisible"):
        assert word in reasons


def test_config_from_hf_missing_vocab_size():
    with pytest.raises(UnsupportedCheckpoint, match="vocab_size missing"):
        config_from_hf({k: v for k, v in BASE_HF.items() if k != "vocab_size"})


def test_config_from_hf_bounds_every_size_and_token_id_at_once():
    bad = {**BASE_HF, "d_model": 10**6, "max_position_embeddings": 1e9, "encoder_layers": 0, "decoder_layers": True,
           "decoder_ffn_dim": "2048", "eos_token_id": 50, "decoder_start_token_id": -1}
    with pytest.raises(UnsupportedCheckpoint) as err:
        config_from_hf(bad)
    assert err.value.reasons == ["d_model=1000000 outside 1..16384", "decoder_ffn_dim='2048' is not an integer",
                                 "encoder_layers=0 outside 1..64", "decoder_layers=True is not an integer",
                                 "max_position_embeddings=1000000000.0 is not an integer",
                                 "eos_token_id=50 outside the vocabulary (0..49)",
                                 "decoder_start_token_id=-1 outside the vocabulary (0..49)"]


def test_config_from_hf_accepts_every_size_at_its_bound():
    hf = {**BASE_HF, **SIZE_LIMITS, "max_position_embeddings": 1024, "pad_token_id": 0, "eos_token_id": 0}
    cfg = config_from_hf(hf)
    assert (cfg.d_model, cfg.encoder_layers, cfg.decoder_vocab_size) == (16_384, 64, 1_048_576)


@pytest.mark.parametrize("overrides", [{}, dict(decoder_vocab_size=40, share_encoder_decoder_embeddings=False,
                                                tie_word_embeddings=False)])
def test_expected_layout_is_the_models_own_without_memory(overrides):
    model = tiny_model(30, **overrides)
    assert expected_layout(model.config) == state_layout(model)
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    hf = {**BASE_HF, **SIZE_LIMITS, "max_position_embeddings": 1024, "pad_token_id": 0, "eos_token_id": 0}
    layout = expected_layout(config_from_hf(hf))  # ~500G weights on the meta device
    assert layout.required_elements() > 4 * 10**11
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 256 * 1024  # KiB


def test_shape_problems_is_load_states_rule():
    layout = state_layout(tiny_model(30))
    found = dict(layout.shapes)
    assert shape_problems(layout, found) == []
    minimal = {k: v for k, v in found.items() if k in {g[-1] for g in layout.required()}}
    assert shape_problems(layout, minimal) == []  # any one name of a tied group; optional keys may be absent
    del minimal["lm_head.weight"]
    minimal["model.decoder.layers.0.fc1.bias"] = (31,)
    assert shape_problems(layout, minimal) == [
        "missing weight key 'model.shared.weight' (tied with ['model.encoder.embed_tokens.weight', "
        "'model.decoder.embed_tokens.weight', 'lm_head.weight'])",
        "'model.decoder.layers.0.fc1.bias' has shape (31,), model expects (32,)"]


@pytest.mark.parametrize(("name", "expected"), [
    ("en-mg", dict(vocab_size=54688, decoder_vocab_size=54688, activation_function="swish", pad_token_id=54687,
                   eos_token_id=0, decoder_start_token_id=54687, d_model=512, max_position_embeddings=512)),
    ("tc-big-fr-en", dict(vocab_size=53017, decoder_vocab_size=53017, activation_function="relu", pad_token_id=53016,
                          eos_token_id=43311, decoder_start_token_id=53016, d_model=1024,
                          max_position_embeddings=1024)),
])
def test_config_from_hf_real_opus_mt_configs(name, expected):
    cfg = config_from_hf(json.loads(shared_path("opus-mt-spm", name, "config.json").read_text()))
    for key, value in expected.items():
        assert getattr(cfg, key) == value, key
    assert cfg.scale_embedding and cfg.share_encoder_decoder_embeddings and cfg.tie_word_embeddings


# --- weight keys -----------------------------------------------------------------------------------

def test_load_state_reports_missing_unexpected_and_misshaped_keys_at_once():
    model = tiny_model(30)
    weights = dict(unique_state(model))
    del weights["model.encoder.layers.0.fc1.weight"]
    del weights["model.shared.weight"]
    weights["model.encoder.layers.7.fc1.weight"] = torch.zeros(3)
    weights["model.decoder.layers.1.fc2.bias"] = torch.zeros(17)
    with pytest.raises(UnsupportedCheckpoint) as err:
        load_state(tiny_model(30, seed=1), weights)
    reasons = err.value.reasons
    assert len(reasons) == 4, reasons
    text = "\n".join(reasons)
    assert "unexpected weight key 'model.encoder.layers.7.fc1.weight'" in text
    assert "missing weight key 'model.encoder.layers.0.fc1.weight'" in text
    assert "missing weight key 'model.shared.weight'" in text and "lm_head.weight" in text  # tied names listed
    assert "'model.decoder.layers.1.fc2.bias' has shape (17,), model expects (16,)" in text


def test_load_state_accepts_any_tied_name_and_optional_keys():
    """HF's full state dict (every tied name) loads; positions and final_logits_bias may be absent."""
    src = tiny_model(30)
    full = {k: v.clone() for k, v in src.state_dict().items()}
    dst = tiny_model(30, seed=1)
    load_state(dst, full)
    assert_same_state(src, dst)

    minimal = {k: v for k, v in unique_state(src).items()
               if not k.endswith(("embed_positions.weight", "final_logits_bias"))}
    dst = MarianModel(src.config)
    load_state(dst, minimal)
    torch.testing.assert_close(dst.model.encoder.embed_positions.weight, sinusoidal_table(32, 16))
    torch.testing.assert_close(dst.model.decoder.embed_positions.weight, sinusoidal_table(32, 16))
    assert not dst.final_logits_bias.any()
    torch.testing.assert_close(dst.model.shared.weight, src.model.shared.weight)


# --- files and formats -----------------------------------------------------------------------------

def test_save_then_load_safetensors_round_trip(tmp_path, tok_files):
    model = shared_checkpoint(tmp_path, tok_files)
    ckpt = load_checkpoint(local_reader(str(tmp_path)))
    assert ckpt.model.config == model.config
    assert_same_state(model, ckpt.model)
    ids = ckpt.tokenizer.encode("the cat sat")
    assert ids[-1] == 0 and 1 not in ids  # known pieces, no <unk>


def test_save_float16_loads_as_rounded_float32(tmp_path, tok_files):
    model = shared_checkpoint(tmp_path, tok_files, dtype=torch.float16)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "float16"
    ckpt = load_checkpoint(local_reader(str(tmp_path)))
    assert ckpt.model.model.shared.weight.dtype == torch.float32
    torch.testing.assert_close(ckpt.model.model.shared.weight, model.model.shared.weight.half().float(), atol=0, rtol=0)


def test_pytorch_model_bin_loads(tmp_path, tok_files):
    model = shared_checkpoint(tmp_path, tok_files)
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")  # as HF wrote them: every tied name
    ckpt = load_checkpoint(local_reader(str(tmp_path)))
    assert_same_state(model, ckpt.model)
    torch.testing.assert_close(logits(ckpt.model), logits(model), atol=0, rtol=0)


UNPICKLED: list[str] = []


def _record(tag: str) -> str:
    UNPICKLED.append(tag)
    return tag


class Payload:
    """Unpickling this calls ``_record``: a stand-in for arbitrary code in a malicious checkpoint."""

    def __reduce__(self):
        return (_record, ("payload ran",))


def test_pytorch_model_bin_with_arbitrary_object_is_refused(tmp_path, tok_files):
    model = shared_checkpoint(tmp_path, tok_files)
    (tmp_path / "model.safetensors").unlink()
    state = dict(model.state_dict())
    state["payload"] = Payload()
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(local_reader(str(tmp_path)))
    assert UNPICKLED == []


def test_missing_config_json(tmp_path, tok_files):
    shared_checkpoint(tmp_path, tok_files)
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_checkpoint(local_reader(str(tmp_path)))


def test_missing_tokenizer_files_all_listed(tmp_path, tok_files):
    shared_checkpoint(tmp_path, tok_files)
    (tmp_path / "vocab.json").unlink()
    (tmp_path / "target.spm").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_checkpoint(local_reader(str(tmp_path)))
    assert "vocab.json" in str(err.value) and "target.spm" in str(err.value)
    assert "source.spm" not in str(err.value)


def test_missing_weights(tmp_path, tok_files):
    shared_checkpoint(tmp_path, tok_files)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_checkpoint(local_reader(str(tmp_path)))


# --- readers ---------------------------------------------------------------------------------------

def test_model_reader_file_url(tmp_path, tok_files):
    model = shared_checkpoint(tmp_path, tok_files)
    read = model_reader(f"file://{tmp_path}")
    assert read("no-such-file") is None
    assert_same_state(model, load_checkpoint(read).model)


def test_model_reader_memory_filesystem(tmp_path, tok_files):
    model = shared_checkpoint(tmp_path, tok_files)
    fs = fsspec.filesystem("memory")
    root = f"/ckpt-{uuid.uuid4().hex}"
    try:
        for path in tmp_path.iterdir():
            fs.pipe(f"{root}/{path.name}", path.read_bytes())
        read = model_reader(f"memory://{root}")
        assert read("pytorch_model.bin") is None
        ckpt = load_checkpoint(read)
        assert_same_state(model, ckpt.model)
        fs.rm(f"{root}/config.json")
        with pytest.raises(FileNotFoundError, match="config.json"):
            load_checkpoint(read)
    finally:
        fs.rm(root, recursive=True)


# --- separate vocabularies -------------------------------------------------------------------------

def write_separate_tokenizer(directory, tok_files) -> None:
    (directory / "source.spm").write_bytes(tok_files["source.spm"])
    (directory / "target.spm").write_bytes(tok_files["target.spm"])
    (directory / "vocab.json").write_text(json.dumps(tok_files["source_vocab"]))
    (directory / "target_vocab.json").write_text(json.dumps(tok_files["target_vocab"]))
    (directory / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": True}))


def test_separate_vocab_hf_checkpoint_loads_with_identical_logits(tmp_path, tok_files):
    transformers = pytest.importorskip("transformers")
    v_src, v_tgt = len(tok_files["source_vocab"]), len(tok_files["target_vocab"])
    assert v_src > v_tgt  # the (single) pad id is the target vocabulary's last id
    pad = tok_files["target_vocab"]["<pad>"]
    cfg = transformers.MarianConfig(vocab_size=v_src, decoder_vocab_size=v_tgt, share_encoder_decoder_embeddings=False,
                                    activation_function="swish", pad_token_id=pad, eos_token_id=0,
                                    decoder_start_token_id=pad, forced_eos_token_id=0, **TINY)
    torch.manual_seed(0)
    hf = transformers.MarianMTModel(cfg).eval()
    with torch.no_grad():
        hf.final_logits_bias.normal_()
    hf.save_pretrained(tmp_path)
    write_separate_tokenizer(tmp_path, tok_files)

    ckpt = load_checkpoint(local_reader(str(tmp_path)))
    assert not ckpt.model.config.share_encoder_decoder_embeddings
    assert (ckpt.model.config.vocab_size, ckpt.model.config.decoder_vocab_size) == (v_src, v_tgt)
    assert ckpt.tokenizer.separate_vocabs
    tok = transformers.MarianTokenizer.from_pretrained(str(tmp_path))
    assert ckpt.tokenizer.encode(SOURCE_TEXT[0]) == tok(SOURCE_TEXT[0]).input_ids
    target_ids = ckpt.tokenizer.encode_target(TARGET_TEXT[1])
    assert target_ids == tok(text_target=TARGET_TEXT[1]).input_ids
    assert ckpt.tokenizer.decode(target_ids) == tok.decode(target_ids, skip_special_tokens=True) == TARGET_TEXT[1]

    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(ckpt.tokenizer.encode(t)) for t in SOURCE_TEXT[:3]],
                                          batch_first=True, padding_value=pad)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(ckpt.tokenizer.encode(t)), dtype=torch.bool)
                                            for t in SOURCE_TEXT[:3]], batch_first=True)
    tgt = torch.tensor([[pad] + ckpt.tokenizer.encode_target(TARGET_TEXT[i])[:4] for i in range(3)])
    with torch.no_grad():
        expected = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
        got = ckpt.model(src, mask, tgt)
    assert got.shape[-1] == v_tgt
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)

    # ... and our save of it loads back in HF with the same logits (no ``model.shared`` there).
    out = tmp_path / "resaved"
    save_checkpoint(str(out), ckpt.model, {})
    hf2, info = transformers.MarianMTModel.from_pretrained(str(out), output_loading_info=True)
    assert not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert "model.encoder.embed_tokens.weight" not in info["missing_keys"], info
    with torch.no_grad():
        again = hf2.eval()(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(again, expected, atol=1e-5, rtol=0)
