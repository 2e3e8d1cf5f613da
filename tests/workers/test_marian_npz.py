"""Marian .npz checkpoint directories load as their HF conversion, and unreadable model paths get one line.

The demo model is written out in Marian's own layout (``tools/marian_export.py``: ``model.npz`` with
Marian's parameter names and ``special:model.yml``, ``decoder.yml``, ``vocab.yml`` + ``source.spm`` /
``target.spm``, or the sentencepiece model as ``vocab.spm``), then:

- HF's own Marian converter (``convert_marian_to_pytorch.OpusState``) reads that directory into a
  ``MarianMTModel`` whose greedy and beam-4 ``generate`` equal ours on the npz directory, token for
  token (transformers 5 no longer ships the converter: point ``RAYMT_MARIAN_CONVERTER`` at the file
  from a 4.x release, e.g. 4.46.3, to run it; HF's model loaded from the demo HF directory is compared always);
- our npz load equals our HF load: every weight, greedy and beam-5 n-best tokens and scores; the
  same for separate vocabularies, an untied output layer, and a random model with OPUS-MT en-mg's
  real 54,688-piece vocabulary (against HF's model, and HF's converter when it is at hand);
- refusals: a CTranslate2 directory, a hub id, unsupported Marian options (all at once), missing
  vocabularies, each reason one line; the translate job gives the same output from either directory.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from raymt.pipeline.decoders.model_check import ModelError, check_model
from raymt.pipeline.decoders.shortlist_files import load_table, shortlist_for
from raymt.workers.checkpoints.checkpoint import UnsupportedCheckpoint, local_reader
from raymt.workers.config import SearchConfig
from raymt.workers.checkpoints.marian_npz import MarianReader
from raymt.workers.checkpoints.model_formats import ModelFormatError, open_model
from raymt.workers.decoder.core_decoder import CoreDecoder
from tests.workers.reference_decoding import translate_ids
from tests.conftest import ROOT, shared_path
from tools.marian_export import export

pytestmark = [pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
              pytest.mark.usefixtures("one_thread")]
NUM_LINES = 8
MAX_NEW_TOKENS = 40


@pytest.fixture(scope="module")
def marian_dir(demo_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("marian") / "demo-de-en"
    export(str(demo_model_dir), str(out))
    return out


@pytest.fixture(scope="module")
def german() -> list[str]:
    return shared_path("multi30k", "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:NUM_LINES]


@pytest.fixture(scope="module")
def ours_npz(marian_dir) -> CoreDecoder:
    return CoreDecoder.load(str(marian_dir))


@pytest.fixture(scope="module")
def ours_hf(demo_model_dir) -> CoreDecoder:
    return CoreDecoder.load(str(demo_model_dir))


def search(beam: int) -> SearchConfig:
    return SearchConfig(beam_size=beam, num_hypotheses=beam, max_decoding_length=MAX_NEW_TOKENS,
                        max_length_b=MAX_NEW_TOKENS)


def hf_generate(model, pad: int, sources: list[list[int]], beam: int) -> list[tuple[int, ...]]:
    """HF ``generate`` on our token ids (right-padded), the best hypothesis of each without start and padding."""
    longest = max(map(len, sources))
    ids = torch.tensor([s + [pad] * (longest - len(s)) for s in sources])
    mask = torch.tensor([[1] * len(s) + [0] * (longest - len(s)) for s in sources])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, num_beams=beam, max_new_tokens=MAX_NEW_TOKENS,
                             do_sample=False, early_stopping=False, length_penalty=1.0, bad_words_ids=[[pad]])
    rows = []
    for row in out.tolist():
        row = row[1:]
        while row and row[-1] == pad:
            row.pop()
        rows.append(tuple(row))
    return rows


def assert_generate_equal(hf_model, ours: CoreDecoder, german: list[str]) -> None:
    sources = ours.encode(german)
    pad = ours.checkpoint.model.config.pad_token_id
    for beam in (1, 4):
        theirs = hf_generate(hf_model, pad, sources, beam)
        mine = [h[0].tokens for h in translate_ids(ours, sources, search(beam))]
        assert mine == theirs, beam


def hf_converter():
    """HF's ``convert_marian_to_pytorch`` module: transformers' own, or the file ``RAYMT_MARIAN_CONVERTER`` names."""
    try:
        return importlib.import_module("transformers.models.marian.convert_marian_to_pytorch")
    except ImportError:
        path = os.environ.get("RAYMT_MARIAN_CONVERTER")
        if not path:
            import transformers
            pytest.skip(f"transformers {transformers.__version__} no longer ships models/marian/"
                        "convert_marian_to_pytorch.py (4.46.3 does); set RAYMT_MARIAN_CONVERTER to that file "
                        "from a 4.x release to run HF's converter here (HF's model from the demo HF directory is "
                        "compared in test_hf_model_of_the_demo_equals_ours_from_npz)")
    spec = importlib.util.spec_from_file_location("convert_marian_to_pytorch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hf_converter_reads_the_npz_directory_to_our_outputs(marian_dir, ours_npz, german, tmp_path):
    pytest.importorskip("transformers")
    converter = hf_converter()
    source = tmp_path / "opus-mt-de-en"  # (the converter writes its vocab.json into the directory it reads)
    shutil.copytree(marian_dir, source)
    state = converter.OpusState(source)
    model = state.load_marian_model().eval()
    assert model.config.pad_token_id == ours_npz.checkpoint.model.config.pad_token_id
    assert state.tokenizer(german).input_ids == ours_npz.encode(german)
    assert_generate_equal(model, ours_npz, german)


def test_hf_model_of_the_demo_equals_ours_from_npz(demo_model_dir, ours_npz, german):
    transformers = pytest.importorskip("transformers")
    model = transformers.MarianMTModel.from_pretrained(str(demo_model_dir), dtype=torch.float32).eval()
    assert_generate_equal(model, ours_npz, german)


@pytest.mark.parametrize("spm_vocab", [False, True], ids=["vocab.yml", "vocab.spm"])
def test_npz_weights_and_config_equal_the_hf_directory(demo_model_dir, marian_dir, tmp_path, spm_vocab):
    directory = marian_dir
    if spm_vocab:
        directory = tmp_path / "spm"
        export(str(demo_model_dir), str(directory), spm_vocab=True)
    reader = open_model(local_reader(str(directory)), str(directory))
    assert isinstance(reader, MarianReader)
    ours = CoreDecoder.load(reader).checkpoint
    theirs = CoreDecoder.load(str(demo_model_dir)).checkpoint
    a, b = ours.model.state_dict(), theirs.model.state_dict()
    assert set(a) == set(b)
    for key in a:
        if key.endswith("embed_positions.weight"):  # static tables, not in the npz: HF's conversion keeps
            # dim-emb (256) positions, the demo 512, which it stores in float16 (ours are computed in float32)
            assert a[key].shape[0] == 256 and torch.allclose(a[key], b[key][:256], atol=1e-3), key
        else:
            assert torch.equal(a[key], b[key]), key
    assert ours.tokenizer.source_vocab == theirs.tokenizer.source_vocab
    assert json.loads(reader("vocab.json"))["<pad>"] == 8000
    same = ("vocab_size", "decoder_vocab_size", "pad_token_id", "eos_token_id", "decoder_start_token_id",
            "forced_eos_token_id", "activation_function", "scale_embedding", "tie_word_embeddings", "d_model",
            "encoder_layers", "decoder_layers", "encoder_ffn_dim", "decoder_ffn_dim", "encoder_attention_heads")
    assert {k: ours.hf_config[k] for k in same} == {k: theirs.hf_config[k] for k in same}


@pytest.mark.parametrize("beam", [1, 5])
def test_npz_decodes_as_the_hf_directory(ours_npz, ours_hf, german, beam):
    cfg = search(beam)
    mine = translate_ids(ours_npz, ours_npz.encode(german), cfg)
    theirs = translate_ids(ours_hf, ours_hf.encode(german), cfg)
    assert [[h.tokens for h in hs] for hs in mine] == [[h.tokens for h in hs] for hs in theirs]
    # scores: within 1e-4 (the demo's stored position table is float16-rounded; Marian's npz holds none)
    assert [h.score for hs in mine for h in hs] == pytest.approx([h.score for hs in theirs for h in hs], abs=1e-4)
    assert [t.text for t in ours_npz.translate(german, cfg)] == [t.text for t in ours_hf.translate(german, cfg)]


# --- refusals: one line each ---------------------------------------------------------------------

def one_line(message: str) -> str:
    assert "\n" not in message, message
    return message


def test_ctranslate2_directory_is_refused_in_one_line(tmp_path):
    ct2 = tmp_path / "ct2-de-en"  # CTranslate2's files and config keys (TransformersConverter's output)
    ct2.mkdir()
    (ct2 / "model.bin").write_bytes(b"\0" * 64)
    (ct2 / "shared_vocabulary.json").write_text(json.dumps(["</s>", "<unk>", "a"]))
    (ct2 / "config.json").write_text(json.dumps({
        "add_source_bos": False, "add_source_eos": False, "bos_token": "<s>", "decoder_start_token": "</s>",
        "eos_token": "</s>", "layer_norm_epsilon": None, "multi_query_attention": False, "unk_token": "<unk>"}))
    with pytest.raises(ModelFormatError) as err:
        CoreDecoder.load(str(ct2))
    assert one_line(str(err.value)).startswith(f"{ct2} is a CTranslate2 model directory (model.bin), a converted format")
    assert "pass the HF or Marian checkpoint it was converted from" in str(err.value)
    assert "Marian .npz directory" in str(err.value) and "NLLB/M2M100" in str(err.value)
    with pytest.raises(ModelError) as err:
        check_model(str(ct2))
    assert err.value.problems == [str(ModelFormatError(str(err.value.problems[0])))]
    assert "CTranslate2" in one_line(err.value.problems[0])


def test_hub_id_gets_the_download_command(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelFormatError) as err:
        CoreDecoder.load("Helsinki-NLP/opus-mt-de-en")
    message = one_line(str(err.value))
    assert "huggingface-cli download Helsinki-NLP/opus-mt-de-en --local-dir models/opus-mt-de-en" in message
    assert "hf download Helsinki-NLP/opus-mt-de-en" in message
    with pytest.raises(ModelError) as err:
        check_model("Helsinki-NLP/opus-mt-de-en")
    assert len(err.value.problems) == 1 and "huggingface-cli download" in one_line(err.value.problems[0])


def test_unsupported_options_are_all_listed_at_once(demo_model_dir, tmp_path):
    bad = tmp_path / "bad"
    export(str(demo_model_dir), str(bad), extra_options={
        "type": "s2s", "transformer-preprocess": "n", "transformer-postprocess": "da",
        "transformer-ffn-activation": "gelu", "transformer-decoder-autoreg": "average-attention"})
    with pytest.raises(UnsupportedCheckpoint) as err:
        CoreDecoder.load(str(bad))
    reasons = [one_line(r) for r in err.value.reasons]
    assert reasons == [
        "type='s2s' (supported: 'transformer')",
        "transformer-postprocess='da' (supported: 'dan')",
        "transformer-preprocess='n' (supported: '')",
        "transformer-decoder-autoreg='average-attention' (supported: 'self-attention')",
        "transformer-ffn-activation='gelu' (supported: swish, relu; Marian's gelu is x * sigmoid(1.702 x), "
        "which no HF activation here computes)",
    ]
    with pytest.raises(ModelError) as err:
        check_model(str(bad))
    assert err.value.problems == reasons


def test_missing_vocabularies_and_parameters_are_all_listed(marian_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(marian_dir, broken)
    (broken / "vocab.yml").unlink()
    with np.load(broken / "model.npz") as npz:
        arrays = {k: npz[k] for k in npz.files if k != "decoder_l2_context_Wq"}
    np.savez(broken / "model.npz", **arrays, Wpos=np.zeros((4, 4), np.float32))
    with pytest.raises(UnsupportedCheckpoint) as err:
        CoreDecoder.load(str(broken))
    assert [one_line(r) for r in err.value.reasons] == ["vocabulary file vocab.yml missing"]
    shutil.copy(marian_dir / "vocab.yml", broken / "vocab.yml")
    (broken / "target.spm").unlink()
    with pytest.raises(ModelError) as err:
        check_model(str(broken))
    assert err.value.problems == [
        "target.spm missing (the sentencepiece model that vocab.yml's pieces come from)"]
    shutil.copy(marian_dir / "target.spm", broken / "target.spm")
    with pytest.raises(ModelError) as err:
        check_model(str(broken))
    assert err.value.problems == ["parameter decoder_l2_context_Wq missing from the npz",
                                  "npz parameters this model has no place for: Wpos"]


# --- the translate job ----------------------------------------------------------------------------

def test_translate_job_gives_the_hf_directory_output(demo_model_dir, marian_dir, tmp_path, caplog):
    from raymt.jobs.translate import main
    sample = ROOT / "examples" / "sample.de.txt"
    outputs = {}
    for name, model in (("hf", demo_model_dir), ("npz", marian_dir)):
        out = tmp_path / f"{name}.en.txt"
        main(["--in-process", "--model", str(model), "--input", str(sample), "--output", str(out), "--beam-size", "2"])
        outputs[name] = out.read_text(encoding="utf-8")
    assert outputs["npz"] == outputs["hf"] and outputs["hf"].count("\n") == sample.read_text().count("\n")
    assert "using the model's lexical shortlist" not in caplog.text


def test_marian_directory_lexical_shortlist_is_used_by_default(marian_dir, tmp_path, caplog, capsys):
    with_lex = tmp_path / "with-lex"
    shutil.copytree(marian_dir, with_lex)
    (with_lex / "lex.s2t").write_text("▁dog ▁Hund 0.9\n▁a ▁Ein 0.8\n", encoding="utf-8")
    caplog.set_level("INFO")
    assert shortlist_for(None, str(with_lex)) == f"{with_lex}/lex.s2t"
    assert "using the model's lexical shortlist" in caplog.text
    from raymt.jobs.translate import main
    sample, out = ROOT / "examples" / "sample.de.txt", tmp_path / "out.en.txt"
    main(["--in-process", "--model", str(with_lex), "--input", str(sample), "--output", str(out), "--beam-size", "2"])
    assert f"|shortlist:{with_lex}/lex.s2t:" in capsys.readouterr().out  # the job's signature names it
    assert out.read_text(encoding="utf-8").count("\n") == sample.read_text(encoding="utf-8").count("\n")
    table = load_table(f"{with_lex}/lex.s2t", CoreDecoder.load(str(with_lex)).checkpoint.tokenizer)
    assert table.frequent[:3] == [0, 1, 2] and 8000 not in table.frequent  # no .freq: Marian's first ids, <pad> aside
    assert shortlist_for("none", str(with_lex)) is None
    assert shortlist_for("other.s2t", str(with_lex)) == "other.s2t"
    assert shortlist_for(None, str(marian_dir)) is None
    assert open_model(local_reader(str(with_lex)), str(with_lex)).shortlist == "lex.s2t"
    (with_lex / "decoder.yml").write_text((with_lex / "decoder.yml").read_text() + "shortlist:\n  - lex.s2t\n  - 50\n  - 50\n")
    assert shortlist_for(None, str(with_lex)) == f"{with_lex}/lex.s2t"


def test_python_api_loads_the_npz_directory(demo_model_dir, marian_dir, german):
    from raymt import Translator as Api
    assert Api.load(str(marian_dir)).translate(german[:3]) == Api.load(str(demo_model_dir)).translate(german[:3])


@pytest.mark.parametrize("layout", ["separate-vocabularies", "untied-output"])
def test_other_embedding_layouts_decode_as_the_hf_directory(marian_dir, ours_hf, german, tmp_path, layout):
    """Separate source and target embeddings and vocabularies (``encoder_Wemb``, ``decoder_Wemb``, two
    vocab files), or an output matrix of its own (``decoder_ff_logit_out_W``): holding the demo's
    shared table, both decode as the demo."""
    variant = tmp_path / layout
    shutil.copytree(marian_dir, variant)
    with np.load(variant / "model.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    options = arrays.pop("special:model.yml").astype(np.uint8).tobytes().rstrip(b"\0").decode()
    wemb = arrays["Wemb"]
    if layout == "separate-vocabularies":
        del arrays["Wemb"]
        arrays.update(encoder_Wemb=wemb, decoder_Wemb=wemb)
        options = options.replace("tied-embeddings-all: true", "tied-embeddings-all: false")
        for side in ("src", "trg"):
            shutil.copy(variant / "vocab.yml", variant / f"opus.{side}.vocab.yml")
        (variant / "decoder.yml").write_text("models:\n  - model.npz\nvocabs:\n  - opus.src.vocab.yml\n"
                                             "  - opus.trg.vocab.yml\n")
    else:
        arrays["decoder_ff_logit_out_W"] = wemb.T.copy()
        options = options.replace("tied-embeddings-all: true", "tied-embeddings-all: false").replace(
            "tied-embeddings: true", "tied-embeddings: false").replace("tied-embeddings-src: false",
                                                                      "tied-embeddings-src: true")
    arrays["special:model.yml"] = np.frombuffer(options.encode() + b"\0", dtype=np.int8)
    np.savez(variant / "model.npz", **arrays)
    reader = open_model(local_reader(str(variant)), str(variant))
    assert (reader("target_vocab.json") is not None) == (layout == "separate-vocabularies")
    ours = CoreDecoder.load(reader)
    cfg = search(2)
    assert [t.tokens for t in ours.translate(german, cfg)] == [t.tokens for t in ours_hf.translate(german, cfg)]


@pytest.fixture(scope="module")
def opus_mt_pair(tmp_path_factory):
    """A small random-weight model with OPUS-MT en-mg's real tokenizer (54,688 pieces through vocab.yml),
    a non-zero logits bias: HF's model loaded from its HF directory, and the model in Marian's layout."""
    transformers = pytest.importorskip("transformers")
    tokenizer = shared_path("opus-mt-spm", "en-mg")
    root = tmp_path_factory.mktemp("opus-mt")
    config = json.loads((tokenizer / "config.json").read_text())
    config.update(d_model=64, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
                  encoder_attention_heads=4, decoder_attention_heads=4, max_position_embeddings=64)
    model = transformers.MarianMTModel(transformers.MarianConfig(
        **{k: v for k, v in config.items() if k not in ("architectures", "transformers_version")})).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.1 if name.endswith(".bias") else 0.3))
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=gen) * 0.5)
        model.final_logits_bias[0, -1] = 0  # <pad>'s column and row: zero, as HF's conversion appends them
        model.model.shared.weight[-1] = 0
    hf_dir, marian = root / "hf", root / "marian"
    model.save_pretrained(hf_dir, safe_serialization=True)
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, hf_dir / name)
    export(str(hf_dir), str(marian))
    return transformers.MarianMTModel.from_pretrained(hf_dir, dtype=torch.float32).eval(), marian


def test_real_opus_mt_vocabulary_decodes_as_hf(opus_mt_pair):
    hf_model, marian = opus_mt_pair
    lines = shared_path("wmt22", "generaltest2022.de-en.ref.A.en").read_text(encoding="utf-8").splitlines()[:NUM_LINES]
    ours = CoreDecoder.load(str(marian))
    assert ours.checkpoint.tokenizer.source_vocab == \
        json.loads(shared_path("opus-mt-spm", "en-mg", "vocab.json").read_text(encoding="utf-8"))
    assert_generate_equal(hf_model, ours, lines)


def test_hf_converter_reads_the_real_opus_mt_layout(opus_mt_pair, tmp_path):
    converter = hf_converter()
    source = tmp_path / "opus-mt-en-mg"
    shutil.copytree(opus_mt_pair[1], source)
    state = converter.OpusState(source)
    lines = shared_path("wmt22", "generaltest2022.de-en.ref.A.en").read_text(encoding="utf-8").splitlines()[:NUM_LINES]
    assert_generate_equal(state.load_marian_model().eval(), CoreDecoder.load(str(opus_mt_pair[1])), lines)
