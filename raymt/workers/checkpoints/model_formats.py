"""Which kind of model directory a reader serves, and the reader to load it from.

``open_model(read, name)``: an HF directory (``config.json``: Marian / OPUS-MT, NLLB / M2M100) is
read as it is (``checkpoint.py`` refuses the architectures it does not run); a Marian ``.npz``
directory (``decoder.yml`` or ``model.npz``) through ``marian_npz.MarianReader``. What cannot be read
gets one line (``ModelFormatError``) saying what it is, what is read, and how to get there: a
CTranslate2 directory (a converted format that cannot be turned back into weights), or a name that
is no directory here but looks like a Hugging Face hub id (download it first).
"""
from __future__ import annotations

import json
import os
import re
from typing import Callable

from raymt.workers.checkpoints.marian_npz import MarianReader, open_marian

Reader = Callable[[str], "bytes | None"]
READABLE = ("readable: an HF Marian/OPUS-MT or NLLB/M2M100 directory (config.json, model.safetensors, tokenizer "
            "files) or a Marian .npz directory (decoder.yml, the .npz, its vocabularies)")
CT2_VOCABULARIES = ("shared_vocabulary.json", "shared_vocabulary.txt", "source_vocabulary.json",
                    "source_vocabulary.txt")
CT2_CONFIG_KEYS = ("add_source_bos", "add_source_eos", "decoder_start_token", "unk_token", "layer_norm_epsilon")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ModelFormatError(ValueError):
    """A model directory of a kind that is not read here, in one line with what to do instead."""


def looks_like_hub_id(name: str) -> bool:
    """``owner/name`` that is not a path on this machine (``Helsinki-NLP/opus-mt-de-en``)."""
    return bool(HUB_ID.match(name)) and not os.path.exists(name)


def hub_hint(name: str) -> str:
    local = f"models/{name.rsplit('/', 1)[-1]}"
    return (f"{name} is not a model directory here; if it is a Hugging Face hub id, download it first "
            f"(huggingface-cli download {name} --local-dir {local}, or hf download {name} --local-dir {local}) "
            f"and pass {local}; {READABLE}")


def ct2_hint(name: str) -> str:
    return (f"{name} is a CTranslate2 model directory (model.bin), a converted format that cannot be read back: "
            f"pass the HF or Marian checkpoint it was converted from; {READABLE}")


def is_ct2(read: Reader, config: bytes) -> bool:
    """A CTranslate2 directory: its config.json has no ``model_type`` but CTranslate2's token keys,
    or it sits beside CTranslate2's vocabulary files."""
    try:
        cfg = json.loads(config)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not isinstance(cfg, dict) or "model_type" in cfg:
        return False
    return any(k in cfg for k in CT2_CONFIG_KEYS) or any(read(n) is not None for n in CT2_VOCABULARIES)


def open_model(read: Reader, name: str = "") -> Reader:
    """The reader to load the model served by ``read`` from (``name``: its path or URL, for messages).

    Raises ``ModelFormatError`` (one line) for a CTranslate2 directory or a hub id, and
    ``UnsupportedCheckpoint`` with every reason a Marian .npz directory cannot be loaded."""
    if isinstance(read, MarianReader):
        return read
    config = read("config.json")
    if config is not None:
        if is_ct2(read, config):
            raise ModelFormatError(ct2_hint(name or "the model"))
        return read
    if read("decoder.yml") is not None or read("model.npz") is not None:
        return open_marian(read)
    if any(read(n) is not None for n in CT2_VOCABULARIES):
        raise ModelFormatError(ct2_hint(name or "the model"))
    if name and looks_like_hub_id(name):
        raise ModelFormatError(hub_hint(name))
    return read  # (checkpoint.py names what is missing)
