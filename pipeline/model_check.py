"""The model directory checked in the driver, before Ray starts any actor: every problem at once.

Reads ``config.json`` (and validates it as ``workers.checkpoint`` would load it), checks the
tokenizer files exist, and that a weights file exists whose header is readable (the safetensors
header only: a few kilobytes, also on object stores). One ``ModelError`` names the directory and
every problem found, instead of an actor-creation traceback from inside a decoder.
"""
from __future__ import annotations

import json
import struct

import fsspec

from pipeline.storage import storage_options
from workers.checkpoint import UnsupportedCheckpoint, config_from_hf

TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")


class ModelError(ValueError):
    def __init__(self, url: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"model {url} cannot be used:\n  - " + "\n  - ".join(problems))


def check_model(url: str) -> None:
    """Raise ``ModelError`` listing every problem of the checkpoint directory at ``url``; else return."""
    fs, root = fsspec.core.url_to_fs(url, **storage_options(url))
    root = root.rstrip("/")
    if not fs.isdir(root):
        raise ModelError(url, ["no such directory" if not fs.exists(root) else "not a directory"])
    problems = _config_problems(fs, f"{root}/config.json")
    missing = [n for n in TOKENIZER_FILES if not fs.exists(f"{root}/{n}")]
    if missing:
        problems.append(f"tokenizer file(s) missing: {', '.join(missing)}")
    problems += _weights_problems(fs, root)
    if problems:
        raise ModelError(url, problems)


def _config_problems(fs, path: str) -> list[str]:
    if not fs.exists(path):
        return ["config.json missing"]
    try:
        hf = json.loads(fs.cat_file(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return [f"config.json is not valid JSON ({e})"]
    if not isinstance(hf, dict):
        return ["config.json is not a JSON object"]
    try:
        config_from_hf(hf)
    except UnsupportedCheckpoint as e:
        return [f"config.json: {r}" for r in e.reasons]
    except (TypeError, ValueError, KeyError) as e:
        return [f"config.json: unusable value ({type(e).__name__}: {e})"]
    return []


def _weights_problems(fs, root: str) -> list[str]:
    if fs.exists(f"{root}/model.safetensors"):
        try:
            with fs.open(f"{root}/model.safetensors", "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                if size > 100_000_000:
                    raise ValueError(f"header length {size}")
                json.loads(f.read(size))
        except Exception as e:  # noqa: BLE001 - any unreadable header is a broken file
            return [f"model.safetensors is not a readable safetensors file ({type(e).__name__}: {e})"]
        return []
    if fs.exists(f"{root}/pytorch_model.bin"):
        return []  # loaded with torch.load(weights_only=True) by the decoders; its errors name the file
    return ["no weights: neither model.safetensors nor pytorch_model.bin"]
