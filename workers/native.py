"""Native decode-step operators (``workers/csrc/*.cpp``), built on first use and cached.

At decoding shapes a step's work is many small calls, each paying dispatch and allocation; these
fuse the costliest chains (measured on 2 cores of an AVX512 VM, 160 rows unless said):

* ``row_top_log_softmax``: log-softmax + ``<pad>`` ban + top-k over the vocabulary as one top-k
  scan and one exp-sum scan per row, the (N, V) log-probs never written (the top-up paper's fused
  softmax + top-k). Bit-equal to ATen's ``log_softmax`` + ``topk`` (same vectorised max, exp-sum
  and log); 4x faster at (160, 8001).
* ``self_attention``: one query per row over the time-major self-attention cache; ~2x.
* ``cross_attention``: one query per row over its sentence's cached source K/V; ~1.7x.
* ``small_linear`` (``small_linear.cpp``): ``x W^T + b`` (and the FFN's activation) for a step's few
  rows, without oneDNN's ~10-20 us of fixed cost per call: 1.33x on Multi30k greedy.
* ``beam_step`` (``beam_step.cpp``): the whole beam-search step after the output layer (candidates,
  finished pools, stop test, reorder, readback) in one call instead of ~20-50 ATen calls (greedy too).

The attention kernels sum in another order than MKL's batched GEMMs: float32 results equal to
~1e-6, as the oneDNN layers are. The extension is compiled for the instruction set ATen itself
dispatches to (``torch.backends.cpu.get_cpu_capability()``), with torch's own vector types and
thread pool, and registered as torch operators (``torch.ops.raymt.*``, named in profiles), by
``torch.utils.cpp_extension`` (g++ and ninja). Where it cannot be built, ``load`` says why once and
returns None, and the decoder runs the ATen path.

No lock is shared between processes. The built library is cached as one file,
``<TORCH_EXTENSIONS_DIR>/raymt/<name>-<key>.so``, its key a digest of the source, the flags and the
torch / Python versions; a process that finds it loads it directly. A process that does not builds
in a private directory of its own and moves the library into place with one atomic rename, so a
build killed at any point (a decoder actor SIGKILLed, the OOM killer) leaves only its own private
directory behind, which nobody waits on; concurrent builders each finish and the last rename wins.
The driver builds once per machine before any decoder starts (``prebuild``).
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import tempfile
import time
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

SOURCES = [os.path.join(os.path.dirname(__file__), "csrc", name)
           for name in ("decode_ops.cpp", "beam_step.cpp", "small_linear.cpp")]
ISA_FLAGS = {  # ATen's own per-capability compile flags (its CPU_CAPABILITY kernels)
    "AVX512": ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl",
               "-mavx512dq", "-mfma"],
    "AVX2": ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"],
}


@functools.cache
def load() -> ModuleType | None:
    """The compiled operators (``torch.ops.raymt``), or None (with one warning saying why) where they cannot be built."""
    try:
        name, flags, path = _library()
        if os.path.exists(path):
            torch.ops.load_library(path)
        else:
            _build(name, flags, path)  # loads the library it builds
        return torch.ops.raymt
    except Exception as err:  # no compiler, no ninja, unwritable cache: the ATen path still decodes
        logger.warning("native decode operators unavailable (%s: %s); decoding with ATen operators",
                       type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        return None


def _library() -> tuple[str, list[str], str]:
    """(extension name, compile flags, cached library path) for this source, ISA, torch and Python."""
    capability = torch.backends.cpu.get_cpu_capability()
    flags = ["-O3", "-fopenmp", *ISA_FLAGS.get(capability, [])]
    texts = []
    for source in SOURCES:
        with open(source, "rb") as f:
            texts.append(f.read())
    key = hashlib.sha256(b"\0".join([*texts, " ".join(flags).encode(), torch.__version__.encode(),
                                      platform.python_version().encode()])).hexdigest()[:16]
    name = f"raymt_decode_ops_{capability.lower()}"
    return name, flags, os.path.join(_extensions_root(), "raymt", f"{name}-{key}.so")


def _build(name: str, flags: list[str], path: str) -> None:
    """Build in a private directory (its ninja lock is this process's alone), load, then rename into place."""
    from torch.utils.cpp_extension import load as cpp_build

    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    _remove_stale_builds(folder)
    private = tempfile.mkdtemp(prefix=f"{name}-build-", dir=folder)
    logger.info("building the native decode operators into %s (once per machine and torch version, about a "
                "minute)", folder)
    try:
        built = cpp_build(name, SOURCES, build_directory=private, verbose=False, is_python_module=False,
                          extra_cflags=flags, extra_ldflags=["-fopenmp"])
        os.replace(built if isinstance(built, str) else os.path.join(private, f"{name}.so"), path)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def prebuild() -> bool:
    """Build the operators in this process (the driver, before decoders start); False if they cannot be built."""
    return load() is not None


def _extensions_root() -> str:
    from torch.utils.cpp_extension import get_default_build_root
    return os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()


def _remove_stale_builds(folder: str, older_than_s: float = 3600.0) -> None:
    """Private build directories left by killed builders (an hour old: no build takes that long)."""
    for entry in os.scandir(folder):
        if entry.is_dir() and "-build-" in entry.name and time.time() - entry.stat().st_mtime > older_than_s:
            shutil.rmtree(entry.path, ignore_errors=True)
