"""Shared fixtures: paths to the shipped demo model and to ../shared/data (skip when absent)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RAYMT_SHARED_DATA", ROOT.parent / "shared" / "data"))
DEMO_MODEL = Path(os.environ.get("RAYMT_DEMO_MODEL", ROOT / "models" / "demo-de-en"))

torch.set_num_threads(min(2, os.cpu_count() or 1))

# Subprocesses find this interpreter's scripts first, as in an activated virtual environment: Ray's
# cluster helpers run `ray`, and a submitted job's entrypoint runs `python`.
_SCRIPTS = os.path.dirname(sys.executable)
if _SCRIPTS not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join(filter(None, (_SCRIPTS, os.environ.get("PATH"))))


def shared_path(*parts: str) -> Path:
    """A file under ../shared/data, or skip the test with the reason."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs {path} (the shared data folder beside the project); not found")
    return path


@pytest.fixture(scope="session")
def native_kernels():
    """The native decode operators (``torch.ops.raymt``, workers/kernels/native.py), or a skip where they cannot be built."""
    from raymt.workers.kernels.native import load

    kernels = load()
    if kernels is None:
        pytest.skip("native decode operators could not be built here (see the logged reason)")
    return kernels


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    if not (DEMO_MODEL / "model.safetensors").exists():
        pytest.skip(f"demo model not found at {DEMO_MODEL}")
    return DEMO_MODEL


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one intra-op thread (a second one only stalls on sync when cores are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def nllb_dir(tmp_path_factory) -> Path:
    """A tiny random NLLB-200 directory (``tests/workers/test_m2m100.py``'s models, 1+1 layers)."""
    pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    from tests.workers.test_m2m100 import make_nllb_dir, train_spm
    return make_nllb_dir(tmp_path_factory.mktemp("nllb"), train_spm())
