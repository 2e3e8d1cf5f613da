"""HF ``M2M100ForConditionalGeneration`` directories (M2M100 418M / 1.2B, dense NLLB-200 600M / 1.3B /
3.3B: ``model_type: "m2m_100"``) -> ``ModelConfig`` and the generation settings the directory gives.

The architecture is ``MarianModel``'s M2M100 variant (``workers/model/model.py``): pre-norm layers, a final
LayerNorm on encoder and decoder, fairseq's sinusoidal positions, scaled embeddings shared by encoder,
decoder and ``lm_head`` (tied unless ``tie_word_embeddings`` is false), no ``final_logits_bias``. Its
weight keys are HF's (``model.shared.weight``, ``model.encoder.layer_norm.weight``, ...), so loading
is ``workers/checkpoints/checkpoint.py``'s identity map with its collect-all-errors checks. Decoding starts from
``decoder_start_token_id`` (``</s>``, 2) and the target language is forced as the first generated
token (``Translator.translate(..., target_lang=)``).
"""
from __future__ import annotations

import json
import logging
from typing import Callable

from raymt.workers.checkpoints.hf_config import UnsupportedCheckpoint, hf_sizes, token_id_reasons
from raymt.workers.config import ACTIVATIONS, ModelConfig

logger = logging.getLogger(__name__)
Reader = Callable[[str], "bytes | None"]

MODEL_TYPE = "m2m_100"
REFUSED_TYPES = {"nllb-moe": "model_type='nllb-moe' (NLLB's mixture-of-experts model) is not supported: "
                             "use a dense NLLB-200 checkpoint (model_type 'm2m_100')"}


def config_from_m2m100(hf: dict) -> ModelConfig:
    """Map an ``M2M100Config`` dict to ``ModelConfig``, raising once with every unsupported option and
    every size or token id out of bounds (``workers/checkpoints/hf_config.SIZE_LIMITS``)."""
    reasons = []
    activation = hf.get("activation_function", "relu")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        reasons.append(f"activation_function={activation!r} (supported: {ACTIVATIONS})")
    sizes, size_reasons = hf_sizes({k: v for k, v in hf.items() if k != "decoder_vocab_size"})
    reasons += size_reasons
    if sizes.get("d_model", 4) < 4:
        reasons.append(f"d_model={sizes['d_model']} (fairseq's position table needs at least 4)")
    ids = {}
    if "vocab_size" in sizes:
        ids = {"pad_token_id": hf.get("pad_token_id", 1), "eos_token_id": hf.get("eos_token_id", 2),
               "decoder_start_token_id": hf.get("decoder_start_token_id", 2)}
        reasons += token_id_reasons(ids, sizes["vocab_size"], sizes["vocab_size"])
    if reasons:
        raise UnsupportedCheckpoint(reasons)
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if hf.get(key, 0.0) not in (0, 0.0):
            logger.info("ignoring %s=%s (training only)", key, hf[key])
    return ModelConfig(
        **sizes, **ids, activation_function=activation, scale_embedding=bool(hf.get("scale_embedding", True)),
        share_encoder_decoder_embeddings=True, tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.1),
        activation_dropout=hf.get("activation_dropout", 0.0),
        normalize_before=True, final_layer_norms=True, position_style="fairseq")


def generation_settings(read: Reader, hf: dict) -> dict:
    """The generation settings as HF ``from_pretrained`` takes them: ``generation_config.json`` when the
    directory has one, else ``config.json`` (``GenerationConfig.from_model_config``); what they mean
    for the search is ``workers/checkpoints/generation.py``'s."""
    raw = read("generation_config.json")
    source = json.loads(raw) if raw is not None else hf
    if not isinstance(source, dict):
        raise UnsupportedCheckpoint([f"generation_config.json holds a {type(source).__name__}, not an object"])
    return source
