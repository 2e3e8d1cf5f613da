"""Marian's own checkpoint directories (``.npz``) served as the HF Marian directory ``checkpoint.py`` reads.

A Marian directory (OPUS-MT's original releases, Marian training output) holds ``decoder.yml``
(``models:``, ``vocabs:``, optionally ``shortlist:`` and ``beam-size:``), the model ``.npz`` with its
config embedded as ``special:model.yml`` (or beside it as ``<model>.yml``), the vocabularies
(``*.vocab.yml``: piece -> id, with ``source.spm`` / ``target.spm``; or ``*.spm`` whose ids are the
vocabulary) and optionally a lexical shortlist ``lex.s2t``. ``open_marian(read)`` returns a
``MarianReader``: a ``reader(name) -> bytes | None`` serving ``config.json``, ``model.safetensors``,
``source.spm``, ``target.spm``, ``vocab.json`` (and ``target_vocab.json``) exactly as HF's Marian
converter (``convert_marian_to_pytorch``) would write them, so HF and this project decode the
converted model alike:

- a ``<pad>`` token is appended to each vocabulary (id = its size) with a zero embedding row and a
  zero logit bias; it is also the decoder's start token; ``</s>`` is EOS;
- Marian's ``W`` matrices are (in, out) and transposed to torch's (out, in); biases and layer-norm
  parameters are (1, n) and flattened; ``decoder_ff_logit_out_b`` becomes ``final_logits_bias``;
- embeddings are scaled by sqrt(d_model), positions are Marian's static sinusoids, and
  ``max_position_embeddings`` is ``dim-emb`` (HF's choice, kept for equal outputs).

Every option this model cannot run (non-transformer types, pre-norm, average attention, learned
positions, factored vocabularies, Marian's sigmoid ``gelu``, ensembles, binary models, missing
files, shape mismatches) is collected and raised once (``UnsupportedCheckpoint``).
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import numpy as np
import sentencepiece as spm
import torch
import yaml
from safetensors.torch import save as save_safetensors

from raymt.workers.checkpoints.checkpoint import UnsupportedCheckpoint

Reader = Callable[[str], "bytes | None"]
CONFIG_KEY = "special:model.yml"
BIAS_KEY = "decoder_ff_logit_out_b"
OUTPUT_KEY = "decoder_ff_logit_out_W"
ACTIVATIONS = {"swish": "swish", "relu": "relu"}  # Marian's name -> HF's (Marian's gelu is x * sigmoid(1.702 x))
# option -> values this model runs (Marian's defaults where a key is absent)
REQUIRED_OPTIONS = {
    "type": ("transformer",), "transformer-postprocess": ("dan",), "transformer-preprocess": ("",),
    "transformer-postprocess-emb": ("d", ""), "transformer-ffn-depth": (2,), "transformer-decoder-ffn-depth": (0, 2),
    "transformer-decoder-autoreg": ("self-attention",), "transformer-train-position-embeddings": (False,),
    "transformer-no-projection": (False,), "transformer-tied-layers": ([],), "right-left": (False,),
    "ulr": (False,), "lemma-dim-emb": (0,), "factors-dim-emb": (0,),
}
MARIAN_DEFAULTS = {"type": "transformer", "transformer-postprocess": "dan", "transformer-preprocess": "",
                   "transformer-postprocess-emb": "d", "transformer-ffn-depth": 2, "transformer-decoder-ffn-depth": 0,
                   "transformer-decoder-autoreg": "self-attention", "transformer-train-position-embeddings": False,
                   "transformer-no-projection": False, "transformer-tied-layers": [], "right-left": False,
                   "ulr": False, "lemma-dim-emb": 0, "factors-dim-emb": 0, "transformer-decoder-dim-ffn": 0,
                   "transformer-ffn-activation": "swish", "tied-embeddings": False, "tied-embeddings-src": False,
                   "tied-embeddings-all": False}
SIZE_KEYS = ("dim-emb", "enc-depth", "dec-depth", "transformer-heads", "transformer-dim-ffn")


def layer_names() -> dict[str, tuple[str, bool]]:
    """Marian's per-layer parameter suffix -> (HF suffix, transposed)."""
    names = {}
    for marian, hf in (("self", "self_attn"), ("context", "encoder_attn")):
        for m, h in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
            names[f"{marian}_W{m}"] = (f"{hf}.{h}.weight", True)
            names[f"{marian}_b{m}"] = (f"{hf}.{h}.bias", False)
        names[f"{marian}_Wo_ln_scale"] = (f"{hf}_layer_norm.weight", False)
        names[f"{marian}_Wo_ln_bias"] = (f"{hf}_layer_norm.bias", False)
    for i in (1, 2):
        names[f"ffn_W{i}"] = (f"fc{i}.weight", True)
        names[f"ffn_b{i}"] = (f"fc{i}.bias", False)
    names["ffn_ffn_ln_scale"] = ("final_layer_norm.weight", False)
    names["ffn_ffn_ln_bias"] = ("final_layer_norm.bias", False)
    return names


LAYER_NAMES = layer_names()


def parse_yaml(text: str | bytes) -> object:
    """YAML with every scalar as a string (keys such as ``yes`` or ``1`` stay pieces), then cast back:
    ``true``/``false`` -> bool, integers -> int, other numbers -> float."""
    loader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)
    return cast(yaml.load(text, Loader=loader))


def cast(value: object) -> object:
    if isinstance(value, dict):
        return {k: cast(v) for k, v in value.items()}
    if isinstance(value, list):
        return [cast(v) for v in value]
    if value in ("true", "false"):
        return value == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except (TypeError, ValueError):
            pass
    return value


def file_name(path: str) -> str:
    """A file listed in decoder.yml, relative to the directory (absolute paths: their base name)."""
    return os.path.basename(path) if os.path.isabs(path) else path


def marian_options(arrays: dict[str, np.ndarray], read: Reader, model_name: str) -> tuple[dict, list[str]]:
    """The model's training options: ``special:model.yml`` in the npz, else ``<model>.yml`` beside it."""
    if CONFIG_KEY in arrays:
        raw = arrays[CONFIG_KEY].astype(np.uint8).tobytes().rstrip(b"\0")
    else:
        raw = read(f"{model_name}.yml")
        if raw is None:
            return {}, [f"{model_name} has no {CONFIG_KEY} and there is no {model_name}.yml beside it"]
    options = parse_yaml(raw)
    if not isinstance(options, dict):
        return {}, [f"the model's options ({CONFIG_KEY}) are not a YAML mapping"]
    return {**MARIAN_DEFAULTS, **options}, []


def option_reasons(options: dict) -> list[str]:
    """Every option this model cannot run, and every size missing or not an integer."""
    reasons = [f"{k}={options[k]!r} (supported: {', '.join(repr(v) for v in allowed)})"
               for k, allowed in REQUIRED_OPTIONS.items() if options[k] not in allowed]
    activation = options["transformer-ffn-activation"]
    if activation not in ACTIVATIONS:
        reasons.append(f"transformer-ffn-activation={activation!r} (supported: {', '.join(ACTIVATIONS)}"
                       + ("; Marian's gelu is x * sigmoid(1.702 x), which no HF activation here computes)"
                          if activation == "gelu" else ")"))
    reasons += [f"{k} missing or not an integer ({options.get(k)!r})" for k in SIZE_KEYS
                if not isinstance(options.get(k), int) or isinstance(options.get(k), bool)]
    return reasons


@dataclass(frozen=True)
class Vocabulary:
    """One side's piece -> id map (``<pad>`` appended) and its sentencepiece model."""

    pieces: dict[str, int]
    spm_model: bytes


def read_vocabulary(read: Reader, name: str, spm_name: str) -> tuple[Vocabulary | None, list[str]]:
    """A Marian vocabulary file: ``*.yml`` (piece -> id; the sentencepiece model is ``spm_name``) or
    ``*.spm`` (its ids are the vocabulary); ``<pad>`` appended after the largest id, as HF does."""
    if name.endswith((".fsv", ".fm")):
        return None, [f"vocabulary {name} is a factored vocabulary (not supported)"]
    data = read(name)
    if data is None:
        return None, [f"vocabulary file {name} missing"]
    if name.endswith(".spm"):
        model, proc = data, spm.SentencePieceProcessor(model_proto=data)
        pieces = {proc.id_to_piece(i): i for i in range(proc.get_piece_size())}
    elif name.endswith((".yml", ".yaml", ".json")):
        model = read(spm_name)
        if model is None:
            return None, [f"{spm_name} missing (the sentencepiece model that {name}'s pieces come from)"]
        raw = parse_yaml(data)
        if not isinstance(raw, dict) or not all(isinstance(v, int) for v in raw.values()):
            return None, [f"vocabulary {name} is not a mapping of piece -> integer id"]
        pieces = {str(k): v for k, v in raw.items()}
    else:
        return None, [f"vocabulary {name}: only *.yml and *.spm vocabularies are read"]
    missing = [t for t in ("</s>", "<unk>") if t not in pieces]
    if missing:
        return None, [f"vocabulary {name} lacks {missing}"]
    if "<pad>" not in pieces:
        pieces["<pad>"] = max(pieces.values()) + 1
    return Vocabulary(pieces, model), []


@dataclass(frozen=True)
class DecoderYaml:
    """What decoder.yml names: the model file, the source and target vocabularies, the shortlist, the beam."""

    model: str
    vocabs: tuple[str, str]
    shortlist: tuple[str, ...] = ()
    beam_size: int = 4


def read_decoder_yaml(read: Reader) -> tuple[DecoderYaml | None, list[str]]:
    raw = read("decoder.yml")
    if raw is None:  # a bare training directory: model.npz with its vocabularies by name
        if read("model.npz") is None:
            return None, ["neither decoder.yml nor model.npz found"]
        vocab = next((n for n in ("vocab.yml", "vocab.spm") if read(n) is not None), "vocab.yml")
        return DecoderYaml("model.npz", (vocab, vocab)), []
    d = parse_yaml(raw)
    if not isinstance(d, dict):
        return None, ["decoder.yml is not a YAML mapping"]
    models, vocabs, reasons = d.get("models") or [], d.get("vocabs") or [], []
    if len(models) != 1:
        reasons.append(f"decoder.yml lists {len(models)} models (an ensemble is not supported; one model is)"
                       if models else "decoder.yml lists no models")
    if models and not str(models[0]).endswith(".npz"):
        reasons.append(f"model {models[0]} is not an .npz file (Marian's binary .bin models are not read; "
                       "use the .npz checkpoint they were made from)")
    if len(vocabs) != 2:
        reasons.append(f"decoder.yml lists {len(vocabs)} vocabularies (expected source and target)")
    if reasons:
        return None, reasons
    shortlist = tuple(str(v) for v in d.get("shortlist") or ())
    beam = d.get("beam-size", 4)
    return DecoderYaml(file_name(str(models[0])), (file_name(str(vocabs[0])), file_name(str(vocabs[1]))),
                           shortlist, beam if isinstance(beam, int) and beam > 0 else 4), []


def shared_embeddings(options: dict) -> bool:
    return bool(options["tied-embeddings-all"] or options["tied-embeddings-src"])


def tied_output(options: dict) -> bool:
    return bool(options["tied-embeddings-all"] or options["tied-embeddings"])


def with_pad_row(table: np.ndarray) -> torch.Tensor:
    """(V, D) -> (V + 1, D): the zero row of the appended ``<pad>`` token."""
    t = torch.from_numpy(np.asarray(table, dtype=np.float32))
    return torch.cat([t, t.new_zeros(1, t.shape[1])])


def convert_state(arrays: dict[str, np.ndarray], options: dict) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Marian parameter names -> HF Marian's, every unused or missing Marian parameter a reason."""
    state, used, reasons = {}, {CONFIG_KEY}, []

    def take(marian: str, hf: str, transform: Callable[[np.ndarray], torch.Tensor]) -> None:
        if marian not in arrays:
            reasons.append(f"parameter {marian} missing from the npz")
            return
        used.add(marian)
        state[hf] = transform(arrays[marian])

    for side, depth in (("encoder", options["enc-depth"]), ("decoder", options["dec-depth"])):
        for i in range(depth if isinstance(depth, int) else 0):
            for suffix, (hf, transposed) in LAYER_NAMES.items():
                if side == "encoder" and suffix.startswith("context_"):
                    continue
                take(f"{side}_l{i + 1}_{suffix}", f"model.{side}.layers.{i}.{hf}",
                     (lambda a: torch.from_numpy(np.asarray(a, dtype=np.float32).T)) if transposed  # (views)
                     else (lambda a: torch.from_numpy(np.asarray(a, dtype=np.float32).reshape(-1))))
    if shared_embeddings(options):
        take("Wemb", "model.shared.weight", with_pad_row)
    else:
        take("encoder_Wemb", "model.encoder.embed_tokens.weight", with_pad_row)
        take("decoder_Wemb", "model.decoder.embed_tokens.weight", with_pad_row)
    if not tied_output(options):  # (D, V) -> (V + 1, D)
        take(OUTPUT_KEY, "lm_head.weight", lambda a: with_pad_row(np.asarray(a).T))
    if BIAS_KEY in arrays:  # (1, V) -> (1, V + 1); absent with Marian's output-omit-bias: zero
        take(BIAS_KEY, "final_logits_bias",
             lambda a: torch.cat([torch.from_numpy(np.asarray(a, dtype=np.float32).reshape(1, -1)), torch.zeros(1, 1)], 1))
    unused = sorted(set(arrays) - used)
    if unused:
        listed = ", ".join(unused[:6]) + (f" and {len(unused) - 6} more" if len(unused) > 6 else "")
        reasons.append(f"npz parameters this model has no place for: {listed}")
    return state, reasons


def hf_config(options: dict, source: Vocabulary, target: Vocabulary, beam_size: int) -> dict:
    """The HF ``config.json`` HF's Marian converter writes for these options and vocabularies."""
    shared = shared_embeddings(options)
    vocab, dec_vocab = max(source.pieces.values()) + 1, max(target.pieces.values()) + 1
    pad, eos = target.pieces["<pad>"], target.pieces["</s>"]
    ffn, dec_ffn = options["transformer-dim-ffn"], options["transformer-decoder-dim-ffn"]
    return {
        "model_type": "marian", "architectures": ["MarianMTModel"], "vocab_size": vocab, "decoder_vocab_size": dec_vocab,
        "share_encoder_decoder_embeddings": shared, "separate_vocabs": not shared,
        "tie_word_embeddings": tied_output(options), "d_model": options["dim-emb"],
        "encoder_layers": options["enc-depth"], "decoder_layers": options["dec-depth"],
        "encoder_attention_heads": options["transformer-heads"], "decoder_attention_heads": options["transformer-heads"],
        "encoder_ffn_dim": ffn, "decoder_ffn_dim": dec_ffn or ffn,
        "activation_function": ACTIVATIONS.get(options["transformer-ffn-activation"]),
        "max_position_embeddings": options["dim-emb"], "scale_embedding": True, "normalize_embedding": False,
        "normalize_before": False, "static_position_embeddings": True, "pad_token_id": pad, "eos_token_id": eos,
        "forced_eos_token_id": eos, "bos_token_id": 0, "decoder_start_token_id": pad, "bad_words_ids": [[pad]],
        "num_beams": beam_size, "max_length": 512, "is_encoder_decoder": True,
    }


def vocabulary_reasons(options: dict, source: Vocabulary, target: Vocabulary,
                       arrays: dict[str, np.ndarray]) -> list[str]:
    """Vocabularies that do not fit the embeddings (rows = the vocabulary without ``<pad>``)."""
    reasons = []
    if shared_embeddings(options) and source.pieces != target.pieces:
        reasons.append("source and target vocabularies differ but the embeddings are tied (tied-embeddings-src/all)")
    names = (("Wemb", source), ("Wemb", target)) if shared_embeddings(options) else \
        (("encoder_Wemb", source), ("decoder_Wemb", target))
    for name, vocab in names:
        rows = arrays[name].shape[0] if name in arrays and arrays[name].ndim == 2 else None
        if rows is not None and rows != vocab.pieces["<pad>"]:
            reasons.append(f"{name} has {rows} rows but its vocabulary has {vocab.pieces['<pad>']} pieces")
    return reasons


@dataclass
class MarianReader:
    """A ``reader(name) -> bytes | None`` over a Marian directory, serving the HF files; ``shortlist``:
    the lexical shortlist file named in decoder.yml (or ``lex.s2t``) when the directory has one."""

    read: Reader
    config: dict
    state: dict[str, torch.Tensor] = field(repr=False)
    files: dict[str, bytes] = field(repr=False)
    shortlist: str | None = None

    @cached_property
    def weights(self) -> bytes:
        return save_safetensors({k: v.contiguous() for k, v in self.state.items()}, metadata={"format": "pt"})

    def __call__(self, name: str) -> bytes | None:
        if name == "config.json":
            return json.dumps(self.config, indent=2, sort_keys=True).encode()
        if name == "model.safetensors":
            return self.weights
        if name in self.files:
            return self.files[name]
        if name == self.shortlist:
            return self.read(name)
        return None


def load_npz(data: bytes, name: str) -> tuple[dict[str, np.ndarray], list[str]]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}, []
    except (ValueError, OSError, EOFError) as e:
        return {}, [f"{name} is not a readable npz file ({type(e).__name__}: {e})"]


def shortlist_candidates(settings: DecoderYaml) -> list[str]:
    """The text shortlist files a Marian directory may hold, first found first: decoder.yml's
    ``shortlist:`` file, then ``lex.s2t`` (binary ``.bin`` and gzipped ``.gz`` shortlists are not read)."""
    named = [file_name(settings.shortlist[0])] if settings.shortlist else []
    return [n for n in dict.fromkeys(named + ["lex.s2t"]) if not n.endswith((".bin", ".gz"))]


def shortlist_file(read: Reader, settings: DecoderYaml) -> str | None:
    return next((n for n in shortlist_candidates(settings) if read(n) is not None), None)


def open_marian(read: Reader) -> MarianReader:
    """The Marian directory served by ``read`` as an HF Marian directory; raises ``UnsupportedCheckpoint``
    once with every reason it cannot be (see the module's docstring)."""
    settings, reasons = read_decoder_yaml(read)
    if settings is None:
        raise UnsupportedCheckpoint(reasons)
    data = read(settings.model)
    arrays, options = {}, {}
    if data is None:
        reasons.append(f"model file {settings.model} missing")
    else:
        arrays, npz_reasons = load_npz(data, settings.model)
        reasons += npz_reasons
    if arrays:
        options, option_problems = marian_options(arrays, read, settings.model)
        reasons += option_problems + (option_reasons(options) if options else [])
    spm_yml = ("source.spm", "target.spm")
    source, r1 = read_vocabulary(read, settings.vocabs[0], spm_yml[0])
    target, r2 = read_vocabulary(read, settings.vocabs[1], spm_yml[1])
    reasons += list(dict.fromkeys(r1 + r2))  # (one vocabulary file for both sides: its problem once)
    if reasons or not options:
        raise UnsupportedCheckpoint(reasons)
    state, state_reasons = convert_state(arrays, options)
    reasons += state_reasons + vocabulary_reasons(options, source, target, arrays)
    if reasons:
        raise UnsupportedCheckpoint(reasons)
    files = {"source.spm": source.spm_model, "target.spm": target.spm_model,
             "vocab.json": json.dumps(source.pieces, ensure_ascii=False).encode()}
    if not shared_embeddings(options):
        files["target_vocab.json"] = json.dumps(target.pieces, ensure_ascii=False).encode()
    return MarianReader(read, hf_config(options, source, target, settings.beam_size), state, files,
                        shortlist_file(read, settings))
