"""A Hugging Face hub cache laid out as huggingface_hub lays it out, filled from the shipped demo model.

    <cache>/models--org--name/blobs/<sha256>                      the files' bytes
    <cache>/models--org--name/snapshots/<40-hex commit>/<file>    -> ../../blobs/<sha256> (relative links)
    <cache>/models--org--name/refs/main                           the commit main points at (no newline)

Revision A is the demo model; revision B the same model with ``vocab.json`` rewritten (same vocabulary,
other bytes): a second commit whose files differ. ``main`` points at A until a test moves it.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = "org/name"
FILES = ("config.json", "generation_config.json", "model.safetensors", "source.spm", "target.spm",
         "tokenizer_config.json", "vocab.json")


@dataclass(frozen=True)
class HubCache:
    root: Path  # what HF_HUB_CACHE names
    a: str  # main's commit
    b: str  # another commit

    @property
    def repo(self) -> Path:
        return self.root / f"models--{REPO.replace('/', '--')}"

    def snapshot(self, commit: str) -> Path:
        return self.repo / "snapshots" / commit

    def move_main(self, commit: str) -> None:
        (self.repo / "refs" / "main").write_text(commit)


def commit_of(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def add_revision(repo: Path, commit: str, files: dict[str, bytes]) -> None:
    """One snapshot: each file a relative link to its blob, as huggingface_hub writes them."""
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        if not (repo / "blobs" / blob).exists():
            (repo / "blobs" / blob).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", blob), snapshot / name)


def build_cache(root: Path, model_dir: Path) -> HubCache:
    files = {name: (model_dir / name).read_bytes() for name in FILES if (model_dir / name).exists()}
    cache = HubCache(root, commit_of("revision a"), commit_of("revision b"))
    add_revision(cache.repo, cache.a, files)
    vocab = json.dumps(json.loads(files["vocab.json"]), ensure_ascii=False, indent=1).encode()
    add_revision(cache.repo, cache.b, {**files, "vocab.json": vocab})
    (cache.repo / "refs").mkdir()
    cache.move_main(cache.a)
    return cache


def go_offline(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> None:
    """``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE=1`` for subprocesses, and for huggingface_hub in this
    process too (it reads them once, when first imported)."""
    from huggingface_hub import constants
    monkeypatch.setenv("HF_HUB_CACHE", str(cache_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache_dir))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
