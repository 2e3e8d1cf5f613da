"""An M2M100 / NLLB directory's own generation defaults: its ``generation_config.json`` (else the
generation keys of ``config.json``, as HF ``from_pretrained`` reads them), as the search they ask for.

``effective_search(model, **given)`` is the one merge of the product's search defaults, a model's
generation settings and a caller's own (as transformers' ``_prepare_generation_config``); the command
line, the Python API and ``CoreDecoder`` all decode with what it returns.
``GenerationDefaults.search(base)`` is what HF ``model.generate(**inputs)`` runs with no arguments on
that directory: ``num_beams``, the length cap (``max_new_tokens``, else ``max_length - 1``: HF counts the
start token), ``early_stopping``, ``length_penalty``; the command line, the Python API and the Ray Data
operator decode with it unless told otherwise (an explicit flag or argument wins, field by field).
A directory that gives no length keeps the project's cap (HF's model-agnostic 20 tokens cuts
translations short; HF warns about it). ``forced_bos_token_id`` is a default target language, and
``forced_eos_token_id`` forces EOS at the cap (``CoreDecoder.forced_eos``). Settings this decoder does not implement
(``UNSUPPORTED``: sampling, n-gram and repetition penalties, minimum lengths, other banned words, ...)
are refused in one line naming them rather than decoded differently from HF.

Marian directories are not read here: what their ``generation_config.json`` holds is the converter's
template (OPUS-MT: ``num_beams`` 4 or 6, ``max_length`` 512; a directory written by transformers 5:
nothing), so they decode with the project's defaults (``decode_config.DEFAULTS``), as before.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Callable

from raymt.workers.checkpoints import m2m100
from raymt.workers.config import MAX_BEAM_SIZE, ModelConfig, SearchConfig

Reader = Callable[[str], "bytes | None"]

# Settings HF applies that this decoder does not, each with its value that changes nothing.
UNSUPPORTED = {"no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "repetition_penalty": 1.0,
               "encoder_repetition_penalty": 1.0, "do_sample": False, "num_beam_groups": 1, "diversity_penalty": 0.0,
               "min_length": 0, "min_new_tokens": 0, "suppress_tokens": [], "begin_suppress_tokens": [],
               "forced_decoder_ids": [], "sequence_bias": {}, "force_words_ids": [], "constraints": [],
               "exponential_decay_length_penalty": [], "penalty_alpha": 0.0, "prompt_lookup_num_tokens": 0}


class UnsupportedGeneration(ValueError):
    """A directory's generation settings ask for decoding this decoder does not do (one line)."""


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    """The generation settings of one directory that decide its output (HF's defaults where absent)."""

    num_beams: int = 1
    max_new_tokens: int | None = None  # generated tokens (the forced language and EOS included); None: not given
    length_penalty: float = 1.0
    early_stopping: bool = False
    forced_bos_token_id: int | None = None  # a default target language

    def __post_init__(self) -> None:
        if not 1 <= self.num_beams <= MAX_BEAM_SIZE:
            raise UnsupportedGeneration(f"generation setting num_beams={self.num_beams} "
                                        f"(must be in [1, {MAX_BEAM_SIZE}])")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise UnsupportedGeneration(f"generation length cap {self.max_new_tokens} (must leave >= 1 token)")
        if not math.isfinite(self.length_penalty):
            raise UnsupportedGeneration(f"generation setting length_penalty={self.length_penalty}")

    @classmethod
    def parse(cls, settings: dict, model: ModelConfig) -> GenerationDefaults:
        """``settings``: ``generation_config.json`` (or ``config.json``) as read; every setting that would
        make HF decode otherwise than this decoder is named in one ``UnsupportedGeneration``."""
        if problems := refusals(settings, model):
            raise UnsupportedGeneration(
                f"the model's generation settings ask for {', '.join(problems)}, which this decoder does not "
                "implement: remove them from its generation_config.json (config.json where it has none) to "
                "decode without them")
        early = _value(settings, "early_stopping", False)
        if not isinstance(early, bool):
            raise UnsupportedGeneration(f"the model's generation settings ask for early_stopping={early!r}; "
                                        "this decoder stops as HF's early_stopping true or false do")
        cap = _value(settings, "max_new_tokens", None)
        if cap is None and _value(settings, "max_length", None) is not None:
            cap = int(settings["max_length"]) - 1  # (HF counts the decoder's start token)
        return cls(num_beams=int(_value(settings, "num_beams", 1)), max_new_tokens=None if cap is None else int(cap),
                   length_penalty=float(_value(settings, "length_penalty", 1.0)), early_stopping=early,
                   forced_bos_token_id=_value(settings, "forced_bos_token_id", None))

    def search(self, base: SearchConfig) -> SearchConfig:
        """``base`` (the project's defaults) with these settings: what ``generate(**inputs)`` runs."""
        fields = {"beam_size": self.num_beams, "num_hypotheses": min(base.num_hypotheses, self.num_beams),
                  "length_penalty": self.length_penalty, "early_stopping": self.early_stopping}
        if self.max_new_tokens is not None:
            cap = self.max_new_tokens
            fields.update(max_decoding_length=cap, max_length_a=0.0, max_length_b=cap)
        return replace(base, **fields)


def effective_search(model: GenerationDefaults | None, **given) -> SearchConfig:
    """The search a decode runs: the product's defaults (``decode_config.DEFAULTS.search``), a model's
    own generation settings over them (``model``: an M2M100 / NLLB directory's; None: a Marian one,
    which keeps the product's), then the caller's ``given`` ``SearchConfig`` fields over those, field
    by field (a field given as None is left to the model; an invalid mix raises ``ValueError``)."""
    defaults = SearchConfig()  # (the product's search defaults: ``decode_config.DEFAULTS.search``)
    base = defaults if model is None else model.search(defaults)
    return replace(base, **{name: value for name, value in given.items() if value is not None})


def _value(settings: dict, key: str, default):
    """A setting as HF reads it: absent or null is HF's default."""
    value = settings.get(key)
    return default if value is None else value


def refusals(settings: dict, model: ModelConfig) -> list[str]:
    """Each setting (``name=value``) HF would apply and this decoder would not."""
    out = [f"{k}={settings[k]!r}" for k, neutral in UNSUPPORTED.items()
           if settings.get(k) not in (None, neutral)]
    bad = settings.get("bad_words_ids")
    if bad not in (None, [], [[model.pad_token_id]]):  # (<pad> is always banned here)
        out.append(f"bad_words_ids={bad!r} (only <pad>, id {model.pad_token_id}, is banned)")
    for key, want in (("decoder_start_token_id", model.decoder_start_token_id), ("eos_token_id", model.eos_token_id),
                      ("forced_eos_token_id", model.eos_token_id)):
        if settings.get(key) not in (None, [], want, [want]):
            out.append(f"{key}={settings[key]!r} (this decoder uses config.json's {want})")
    return out


def read_settings(read: Reader) -> tuple[dict, ModelConfig] | None:
    """An M2M100 / NLLB directory's generation settings and model config, read without its weights;
    None for any other directory (Marian)."""
    raw = read("config.json")
    if raw is None:
        return None
    hf = json.loads(raw)
    if not isinstance(hf, dict) or hf.get("model_type") != m2m100.MODEL_TYPE:
        return None
    return m2m100.generation_settings(read, hf), m2m100.config_from_m2m100(hf)


def language_code(tokenizer, token_id: int | None) -> str | None:
    """The language code whose id ``token_id`` is (a ``LanguageTokenizer``'s), else None."""
    languages = getattr(tokenizer, "languages", {})
    return next((code for code, i in languages.items() if i == token_id), None) if token_id is not None else None


def read_generation(read: Reader) -> GenerationDefaults | None:
    """``read_settings`` parsed: the directory's generation defaults, None for a Marian directory."""
    found = read_settings(read)
    return None if found is None else GenerationDefaults.parse(*found)
