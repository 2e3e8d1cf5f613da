"""HF Marian / OPUS-MT checkpoint directory <-> ``MarianModel`` + ``MarianTokenizer``; M2M100 / NLLB-200
directories (``model_type: "m2m_100"``) load here too, their config and tokenizer mapped by
``workers/checkpoints/m2m100.py`` and ``workers/text/lang_tokenizer.py``.

A directory holds ``config.json``, ``model.safetensors`` or ``pytorch_model.bin``, ``source.spm``,
``target.spm``, ``vocab.json`` (and ``target_vocab.json`` when vocabularies are separate).
Files are read through a ``reader(name) -> bytes | None`` callable, so this module stays free of
fsspec: ``local_reader`` serves plain directories, ``raymt.pipeline.storage.model_reader`` any fsspec URL.

Every unsupported config option, and every size or token id out of bounds (``SIZE_LIMITS``), is
collected and raised at once (``UnsupportedCheckpoint``) before anything is allocated; missing,
unexpected and misshaped weight keys are all reported, by ``shape_problems``, which checks a
``StateLayout`` (built without memory on the meta device by ``expected_layout``) against the shapes
found, so a checkpoint can be checked from its header before it is loaded. Weights load with
safetensors or ``torch.load(weights_only=True)``; nothing is unpickled freely.
"""
from __future__ import annotations

import io
import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file
from torch.overrides import TorchFunctionMode

from raymt.workers.config import ACTIVATIONS, ModelConfig
from raymt.workers.checkpoints.hf_config import (  # noqa: F401  (re-exported: the loader's checks, pipeline/decoders/model_check.py)
    HF_SIZE_DEFAULTS, POSITION_TABLE_LIMIT, SIZE_LIMITS, UnsupportedCheckpoint, hf_sizes, is_int, token_id_reasons)
from raymt.workers.model.model import MarianModel
from raymt.workers.checkpoints import m2m100
from raymt.workers.text.lang_tokenizer import LanguageTokenizer, load_language_tokenizer
from raymt.workers.text.tokenizer import MarianTokenizer, load_vocab
from raymt.workers.text.tokenizer_json import MARIAN_JSON_NOTE, TOKENIZER_JSON

logger = logging.getLogger(__name__)
Reader = Callable[[str], "bytes | None"]

# Keys that may be absent: static tables recomputed exactly, or a bias that defaults to zero.
OPTIONAL_SUFFIXES = ("embed_positions.weight", "final_logits_bias")
# Keys some M2M100 / NLLB files carry that HF never loads either: the sinusoidal table's buffer (HF's
# name ``weights``, recomputed) and fairseq's ``_float_tensor`` placeholder. Skipped, not refused.
IGNORED_SUFFIXES = ("embed_positions.weights", "embed_positions._float_tensor")


def local_reader(directory: str) -> Reader:
    def read(name: str) -> bytes | None:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return f.read()
    return read


def config_from_hf(hf: dict) -> ModelConfig:
    """Map an HF ``config.json`` dict to ``ModelConfig``, raising once with every unsupported option
    and every size or token id out of bounds (``SIZE_LIMITS``), before anything is allocated.
    M2M100 / NLLB configs (``model_type: "m2m_100"``) map through ``workers/checkpoints/m2m100.py``."""
    if hf.get("model_type") in m2m100.REFUSED_TYPES:
        raise UnsupportedCheckpoint([m2m100.REFUSED_TYPES[hf["model_type"]]])
    if hf.get("model_type") == m2m100.MODEL_TYPE:
        return m2m100.config_from_m2m100(hf)
    reasons = []
    if hf.get("model_type", "marian") != "marian":
        reasons.append(f"model_type={hf.get('model_type')!r} (only 'marian' and 'm2m_100')")
    for key, supported in (("normalize_before", False), ("normalize_embedding", False),
                           ("add_final_layer_norm", False), ("static_position_embeddings", True),
                           ("add_bias_logits", False), ("scale_embedding", None)):
        if supported is not None and key in hf and bool(hf[key]) != supported:
            reasons.append(f"{key}={hf[key]!r} (only {supported})")
    activation = hf.get("activation_function", "gelu")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        reasons.append(f"activation_function={activation!r} (supported: {ACTIVATIONS})")
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if hf.get(key, 0.0) not in (0, 0.0):
            logger.info("ignoring %s=%s (training only)", key, hf[key])
    sizes, size_reasons = hf_sizes(hf)
    reasons += size_reasons
    share = bool(hf.get("share_encoder_decoder_embeddings", True))
    vocab, dec_vocab = sizes.get("vocab_size"), sizes.get("decoder_vocab_size")
    if share and vocab is not None and dec_vocab is not None and dec_vocab != vocab:
        reasons.append(f"shared embeddings with decoder_vocab_size={dec_vocab} != vocab_size={vocab}")
    ids = {}
    if vocab is not None and dec_vocab is not None:
        ids["pad_token_id"] = hf.get("pad_token_id", dec_vocab - 1)
        ids["eos_token_id"] = hf.get("eos_token_id", 0)
        ids["decoder_start_token_id"] = hf.get("decoder_start_token_id", ids["pad_token_id"])
        reasons += token_id_reasons(ids, vocab, dec_vocab)
    if reasons:
        raise UnsupportedCheckpoint(reasons)
    return ModelConfig(
        **sizes, **ids, activation_function=activation,
        scale_embedding=bool(hf.get("scale_embedding", False)), share_encoder_decoder_embeddings=share,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.0),
        activation_dropout=hf.get("activation_dropout", 0.0))


def config_to_hf(cfg: ModelConfig) -> dict:
    """``ModelConfig`` -> HF ``config.json`` dict (loadable by transformers and ct2-transformers-converter)."""
    d = {k: v for k, v in cfg.to_dict().items() if k != "decoder_vocab_size"}
    d.update(model_type="marian", architectures=["MarianMTModel"], decoder_vocab_size=cfg.decoder_vocab_size,
             bos_token_id=0, forced_eos_token_id=cfg.eos_token_id, bad_words_ids=[[cfg.pad_token_id]],
             static_position_embeddings=True, normalize_embedding=False, normalize_before=False,
             is_encoder_decoder=True, num_hidden_layers=cfg.encoder_layers, use_cache=True,
             num_beams=4, max_length=512)
    return d


def read_weights(read: Reader) -> dict[str, torch.Tensor]:
    data = read("model.safetensors")
    if data is not None:
        return load_safetensors(data)
    data = read("pytorch_model.bin")
    if data is not None:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    raise FileNotFoundError("checkpoint has neither model.safetensors nor pytorch_model.bin")


def tied_groups(model: MarianModel) -> list[list[str]]:
    """State-dict keys grouped by the tensor they share (tied embeddings appear under several keys)."""
    groups: dict[int, list[str]] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), []).append(key)
    return list(groups.values())


@dataclass(frozen=True)
class StateLayout:
    """The tensors a ``MarianModel`` holds: its keys grouped by shared tensor (tied names) and each key's shape."""

    groups: tuple[tuple[str, ...], ...]
    shapes: dict[str, tuple[int, ...]]

    def required(self) -> list[tuple[str, ...]]:
        """The groups a checkpoint must hold (positions are recomputed, ``final_logits_bias`` defaults to zero)."""
        return [g for g in self.groups if not all(k.endswith(OPTIONAL_SUFFIXES) for k in g)]

    def required_elements(self) -> int:
        return sum(math.prod(self.shapes[g[0]]) for g in self.required())


def state_layout(model: MarianModel) -> StateLayout:
    return StateLayout(tuple(map(tuple, tied_groups(model))),
                       {k: tuple(v.shape) for k, v in model.state_dict(keep_vars=True).items()})


class _SkipRandomInit(TorchFunctionMode):
    """Meta tensors hold no values, so random initialisation is skipped: ``normal_`` on the meta device
    would load torch's Python decompositions on first use (~2 s, ~150 MB), longer than the whole check."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in ("normal_", "uniform_"):
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def expected_layout(cfg: ModelConfig) -> StateLayout:
    """The layout ``MarianModel(cfg)`` has, built on the meta device: no memory is allocated for any weight."""
    with torch.device("meta"), _SkipRandomInit():
        return state_layout(MarianModel(cfg))


def shape_problems(layout: StateLayout, found: Mapping[str, tuple[int, ...]]) -> list[str]:
    """Every unexpected, missing (optional keys aside) or misshaped key of a checkpoint whose tensors
    have shapes ``found``; any name of a tied group stands for the group."""
    reasons = [f"unexpected weight key {k!r}" for k in sorted(set(found) - set(layout.shapes))
               if not k.endswith(IGNORED_SUFFIXES)]
    required = set(layout.required())
    for group in layout.groups:
        present = [k for k in group if k in found]
        if not present and group in required:
            tied = f" (tied with {list(group[1:])})" if group[1:] else ""
            reasons.append(f"missing weight key {group[0]!r}{tied}")
        want = layout.shapes[group[0]]
        reasons += [f"{k!r} has shape {tuple(found[k])}, model expects {want}" for k in present
                    if tuple(found[k]) != want]
    return reasons


def load_state(model: MarianModel, weights: dict[str, torch.Tensor]) -> None:
    """Copy ``weights`` into ``model``; raise once listing every missing, unexpected or misshaped key."""
    layout = state_layout(model)
    reasons = shape_problems(layout, {k: tuple(v.shape) for k, v in weights.items()})
    if reasons:
        raise UnsupportedCheckpoint(reasons)
    params = model.state_dict(keep_vars=True)
    for group in layout.groups:
        present = [k for k in group if k in weights]
        if present:
            with torch.no_grad():
                params[group[0]].copy_(weights[present[0]].to(params[group[0]].dtype))


@dataclass
class Checkpoint:
    model: MarianModel
    tokenizer: MarianTokenizer | LanguageTokenizer  # LanguageTokenizer: M2M100 / NLLB (language codes)
    hf_config: dict
    generation: dict = field(default_factory=dict)  # M2M100 / NLLB: ``m2m100.generation_settings``

    @property
    def multilingual(self) -> bool:
        """Whether sources and targets name their languages (M2M100, NLLB-200)."""
        return isinstance(self.tokenizer, LanguageTokenizer)


def load_checkpoint(read: Reader, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu") -> Checkpoint:
    """Load a Marian checkpoint directory served by ``read`` onto ``device``."""
    tokenizer, cfg, hf = load_tokenizer(read)
    model = MarianModel(cfg)
    load_state(model, read_weights(read))
    model.logits_bias()  # whether the bias is zero, read here on the host (a device never reads it back)
    model = model.to(device=device, dtype=dtype).eval()
    generation = {}
    if isinstance(tokenizer, LanguageTokenizer):
        generation = m2m100.generation_settings(read, hf)
    return Checkpoint(model, tokenizer, hf, generation)


def separate_target_vocab(cfg: ModelConfig, hf: dict) -> bool:
    """Whether the target side reads ``target_vocab.json`` (when present) instead of ``vocab.json``."""
    return not cfg.share_encoder_decoder_embeddings or bool(hf.get("separate_vocabs"))


def load_tokenizer(read: Reader) -> tuple[MarianTokenizer | LanguageTokenizer, ModelConfig, dict]:
    """The tokenizer and config of a checkpoint, without its weights (for encoder actors)."""
    raw = read("config.json")
    if raw is None:
        raise FileNotFoundError("checkpoint has no config.json")
    hf = json.loads(raw)
    cfg = config_from_hf(hf)
    if cfg.position_style == "fairseq":  # M2M100 / NLLB: sentencepiece.bpe.model + vocab or language codes
        return load_language_tokenizer(read), cfg, hf
    files = {name: read(name) for name in ("source.spm", "target.spm", "vocab.json")}
    missing = [n for n, b in files.items() if b is None]
    if missing:
        note = MARIAN_JSON_NOTE if read(TOKENIZER_JSON) is not None else ""
        raise FileNotFoundError(f"checkpoint lacks tokenizer files {missing}{note}")
    target_vocab = None
    if separate_target_vocab(cfg, hf):
        raw_tv = read("target_vocab.json")
        target_vocab = load_vocab(raw_tv) if raw_tv is not None else None
    tokenizer = MarianTokenizer(files["source.spm"], files["target.spm"], load_vocab(files["vocab.json"]), target_vocab)
    tokenizer.source_lang = _source_lang(read)
    return tokenizer, cfg, hf


def _source_lang(read: Reader) -> str | None:
    """The source language a Marian directory names (``tokenizer_config.json``: ``source_lang``), for
    the sentence splitter's rules; None where it names none or a group (``mul``)."""
    try:
        code = json.loads(read("tokenizer_config.json") or b"{}").get("source_lang")
    except ValueError:
        return None
    return code if isinstance(code, str) and 2 <= len(code) <= 3 and code != "mul" else None


def unique_state(model: MarianModel) -> dict[str, torch.Tensor]:
    """One key per tensor, the first HF name of each tied group (``model.shared.weight`` for embeddings).

    With separate vocabularies HF has no ``model.shared``: the encoder table is saved under
    ``model.encoder.embed_tokens.weight`` instead.
    """
    sd = model.state_dict()
    absent_in_hf = () if model.config.share_encoder_decoder_embeddings else ("model.shared.weight",)
    names = [next(k for k in group if k not in absent_in_hf) for group in tied_groups(model)]
    return {name: sd[name].contiguous() for name in names}


def save_checkpoint(directory: str, model: MarianModel, tokenizer_files: dict[str, bytes],
                    *, dtype: torch.dtype = torch.float32, extra_config: dict | None = None) -> None:
    """Write an HF Marian directory: config.json, model.safetensors and the tokenizer files."""
    os.makedirs(directory, exist_ok=True)
    hf = config_to_hf(model.config)
    hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    hf.update(extra_config or {})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf, f, indent=2, sort_keys=True)
    state = {k: v.to(dtype) for k, v in unique_state(model).items()}
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    for name, data in tokenizer_files.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"bad_words_ids": [[model.config.pad_token_id]], "decoder_start_token_id": model.config.decoder_start_token_id,
                   "eos_token_id": model.config.eos_token_id, "forced_eos_token_id": model.config.eos_token_id,
                   "pad_token_id": model.config.pad_token_id, "num_beams": 4, "max_length": 512}, f, indent=2)
