"""HF Marian / OPUS-MT checkpoint directory <-> ``MarianModel`` + ``MarianTokenizer``.

A directory holds ``config.json``, ``model.safetensors`` or ``pytorch_model.bin``, ``source.spm``,
``target.spm``, ``vocab.json`` (and ``target_vocab.json`` when vocabularies are separate).
Files are read through a ``reader(name) -> bytes | None`` callable, so this module stays free of
fsspec: ``local_reader`` serves plain directories, ``pipeline.storage.model_reader`` any fsspec URL.

Every unsupported config option is collected and raised at once (``UnsupportedCheckpoint``);
missing and unexpected weight keys are all reported. Weights load with safetensors or
``torch.load(weights_only=True)``; nothing is unpickled freely.
"""
from __future__ import annotations

import io
import json
import logging
import os
from dataclasses import dataclass
from typing import Callable

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from workers.config import ACTIVATIONS, ModelConfig
from workers.model import MarianModel
from workers.tokenizer import MarianTokenizer, load_vocab

logger = logging.getLogger(__name__)
Reader = Callable[[str], "bytes | None"]

# Keys that may be absent: static tables recomputed exactly, or a bias that defaults to zero.
OPTIONAL_SUFFIXES = ("embed_positions.weight", "final_logits_bias")


class UnsupportedCheckpoint(ValueError):
    """Raised once with every reason a checkpoint cannot be loaded."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("unsupported checkpoint:\n  - " + "\n  - ".join(reasons))


def local_reader(directory: str) -> Reader:
    def read(name: str) -> bytes | None:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return f.read()
    return read


def config_from_hf(hf: dict) -> ModelConfig:
    """Map an HF ``config.json`` dict to ``ModelConfig``, raising once with every unsupported option."""
    reasons = []
    if hf.get("model_type", "marian") != "marian":
        reasons.append(f"model_type={hf.get('model_type')!r} (only 'marian')")
    for key, supported in (("normalize_before", False), ("normalize_embedding", False),
                           ("add_final_layer_norm", False), ("static_position_embeddings", True),
                           ("add_bias_logits", False), ("scale_embedding", None)):
        if supported is not None and key in hf and bool(hf[key]) != supported:
            reasons.append(f"{key}={hf[key]!r} (only {supported})")
    if hf.get("activation_function", "gelu") not in ACTIVATIONS:
        reasons.append(f"activation_function={hf.get('activation_function')!r} (supported: {ACTIVATIONS})")
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if hf.get(key, 0.0) not in (0, 0.0):
            logger.info("ignoring %s=%s (training only)", key, hf[key])
    vocab = hf.get("vocab_size")
    if not isinstance(vocab, int):
        reasons.append("vocab_size missing")
    share = bool(hf.get("share_encoder_decoder_embeddings", True))
    dec_vocab = hf.get("decoder_vocab_size") or vocab
    if share and dec_vocab != vocab:
        reasons.append(f"shared embeddings with decoder_vocab_size={dec_vocab} != vocab_size={vocab}")
    if hf.get("d_model", 1024) % hf.get("encoder_attention_heads", 16):
        reasons.append("d_model not divisible by encoder_attention_heads")
    if reasons:
        raise UnsupportedCheckpoint(reasons)
    pad = hf.get("pad_token_id", dec_vocab - 1)
    return ModelConfig(
        vocab_size=vocab, decoder_vocab_size=dec_vocab, d_model=hf.get("d_model", 1024),
        encoder_layers=hf.get("encoder_layers", 12), decoder_layers=hf.get("decoder_layers", 12),
        encoder_attention_heads=hf.get("encoder_attention_heads", 16),
        decoder_attention_heads=hf.get("decoder_attention_heads", 16),
        encoder_ffn_dim=hf.get("encoder_ffn_dim", 4096), decoder_ffn_dim=hf.get("decoder_ffn_dim", 4096),
        activation_function=hf.get("activation_function", "gelu"),
        max_position_embeddings=hf.get("max_position_embeddings", 1024),
        scale_embedding=bool(hf.get("scale_embedding", False)), share_encoder_decoder_embeddings=share,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        pad_token_id=pad, eos_token_id=hf.get("eos_token_id", 0),
        decoder_start_token_id=hf.get("decoder_start_token_id", pad),
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


def load_state(model: MarianModel, weights: dict[str, torch.Tensor]) -> None:
    """Copy ``weights`` into ``model``; raise once listing every missing, unexpected or misshaped key."""
    params = model.state_dict(keep_vars=True)
    reasons = [f"unexpected weight key {k!r}" for k in sorted(set(weights) - set(params))]
    for group in tied_groups(model):
        present = [k for k in group if k in weights]
        if not present:
            if not all(k.endswith(OPTIONAL_SUFFIXES) for k in group):
                reasons.append(f"missing weight key {group[0]!r}" + (f" (tied with {group[1:]})" if group[1:] else ""))
            continue
        target = params[group[0]]
        source = weights[present[0]]
        if tuple(source.shape) != tuple(target.shape):
            reasons.append(f"{present[0]!r} has shape {tuple(source.shape)}, model expects {tuple(target.shape)}")
            continue
        with torch.no_grad():
            target.copy_(source.to(target.dtype))
    if reasons:
        raise UnsupportedCheckpoint(reasons)


@dataclass
class Checkpoint:
    model: MarianModel
    tokenizer: MarianTokenizer
    hf_config: dict


def load_checkpoint(read: Reader, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu") -> Checkpoint:
    """Load a Marian checkpoint directory served by ``read`` onto ``device``."""
    tokenizer, cfg, hf = load_tokenizer(read)
    model = MarianModel(cfg)
    load_state(model, read_weights(read))
    model.logits_bias()  # whether the bias is zero, read here on the host (a device never reads it back)
    model = model.to(device=device, dtype=dtype).eval()
    return Checkpoint(model, tokenizer, hf)


def load_tokenizer(read: Reader) -> tuple[MarianTokenizer, ModelConfig, dict]:
    """The tokenizer and config of a checkpoint, without its weights (for encoder actors)."""
    raw = read("config.json")
    if raw is None:
        raise FileNotFoundError("checkpoint has no config.json")
    hf = json.loads(raw)
    cfg = config_from_hf(hf)
    files = {name: read(name) for name in ("source.spm", "target.spm", "vocab.json")}
    missing = [n for n, b in files.items() if b is None]
    if missing:
        raise FileNotFoundError(f"checkpoint lacks tokenizer files {missing}")
    target_vocab = None
    if not cfg.share_encoder_decoder_embeddings or hf.get("separate_vocabs"):
        raw_tv = read("target_vocab.json")
        target_vocab = load_vocab(raw_tv) if raw_tv is not None else None
    tokenizer = MarianTokenizer(files["source.spm"], files["target.spm"], load_vocab(files["vocab.json"]), target_vocab)
    return tokenizer, cfg, hf


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
