"""Native decode-step operators (``workers/csrc/*.cpp``), built on first use and cached.

At decoding shapes a step's work is many small calls, each paying dispatch and allocation; these
fuse the costliest chains (measured on 2 cores of an AVX-512 x86-64 CPU, 160 rows unless said):

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
~1e-6, as the oneDNN layers are. The extension uses torch's own vector types and thread pool, is
registered as torch operators (``torch.ops.raymt.*``, named in profiles) and is built by
``torch.utils.cpp_extension`` (g++ and ninja) for the instruction set this process decodes with
(``raymt.workers.isa``), with explicit flags (``MARCH_FLAGS``):

* ``x86-64-v4`` (AVX-512 F/BW/VL/DQ/CD) where ATen dispatches to AVX512;
* ``x86-64-v3`` (AVX2, FMA, F16C, BMI) where it dispatches to AVX2 (AMD Zen 2/3, older Intel);
* ``portable``: no ``-march`` (the compiler's baseline, ATen's scalar ``DEFAULT`` vector types)
  elsewhere, aarch64 included, and as the fallback when the build above fails. Its log-softmax is
  bit-equal to ATen's where ATen runs its scalar kernels too; beside ATen's AVX2/AVX-512 kernels it
  sums in another order (equal to ~1e-6, as the attention kernels are).

``RAYMT_NATIVE_MARCH`` (``x86-64-v4``, ``x86-64-v3`` or ``portable``) forces one, never above what
the CPU runs: ``RAYMT_NATIVE_MARCH=x86-64-v3`` with ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2`` emulates an AVX2-only CPU on an AVX-512 one. Where no build succeeds,
``load`` says why once and returns None, and the decoder runs the ATen path; importing this module
never builds anything.

No lock is shared between processes. The built library is cached as one file per target,
``<TORCH_EXTENSIONS_DIR>/raymt/raymt_ops_<target>-<key>.so``, its key a digest of the source, the
flags and the torch / Python versions, so an AVX-512 build is never loaded on an AVX2 CPU sharing the
cache; a process that finds it loads it directly. A process that does not builds
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

from raymt.workers.isa import CpuIsa, detect

logger = logging.getLogger(__name__)

SOURCES = [os.path.join(os.path.dirname(__file__), "csrc", name)
           for name in ("decode_ops.cpp", "beam_step.cpp", "small_linear.cpp")]
MARCH_ENV = "RAYMT_NATIVE_MARCH"
MARCH_FLAGS = {  # target -> compile flags; the CPU_CAPABILITY macros pick ATen's vector types as its kernels do
    "x86-64-v4": ["-march=x86-64-v4", "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "x86-64-v3": ["-march=x86-64-v3", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
    "portable": ["-DCPU_CAPABILITY=DEFAULT"],
}
_TARGET_OF_LEVEL = {"avx512": "x86-64-v4", "avx2": "x86-64-v3", "portable": "portable"}
_ORDER = ("portable", "x86-64-v3", "x86-64-v4")


@functools.cache
def load() -> ModuleType | None:
    """The compiled operators (``torch.ops.raymt``), or None (with one warning saying why) where they cannot be built.

    Tries the machine's target, then the portable build; each cached apart."""
    errors = []
    for target in build_targets():
        try:
            _load_or_build(target)
            return torch.ops.raymt
        except Exception as err:  # no compiler, no ninja, unwritable cache, flags the compiler lacks
            errors.append(f"{target}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    logger.warning("native decode operators unavailable (%s); decoding with ATen operators", "; ".join(errors))
    return None


def build_target(isa: CpuIsa | None = None, forced: str | None = None) -> str:
    """The ``MARCH_FLAGS`` target for this CPU: its ISA level's, or ``RAYMT_NATIVE_MARCH`` where that
    names one the CPU runs (one above it is ignored, with a warning: it would fault)."""
    own = _TARGET_OF_LEVEL[(isa or detect()).level]
    forced = os.environ.get(MARCH_ENV, "") if forced is None else forced
    if not forced:
        return own
    if forced not in MARCH_FLAGS:
        logger.warning("%s=%s: expected one of %s; building for %s", MARCH_ENV, forced, ", ".join(MARCH_FLAGS), own)
        return own
    if _ORDER.index(forced) > _ORDER.index(own):
        logger.warning("%s=%s: this process decodes with %s; building for %s", MARCH_ENV, forced, own, own)
        return own
    return forced


def build_targets() -> list[str]:
    """The target, then the portable fallback."""
    target = build_target()
    return [target] if target == "portable" else [target, "portable"]


def _load_or_build(target: str) -> None:
    name, flags, path = _library(target)
    if os.path.exists(path):
        torch.ops.load_library(path)
    else:
        _build(name, flags, path)  # loads the library it builds


def _library(target: str) -> tuple[str, list[str], str]:
    """(extension name, compile flags, cached library path) for this source, target, torch and Python."""
    flags = ["-O3", "-fopenmp", *MARCH_FLAGS[target]]
    texts = []
    for source in SOURCES:
        with open(source, "rb") as f:
            texts.append(f.read())
    key = hashlib.sha256(b"\0".join([*texts, " ".join(flags).encode(), torch.__version__.encode(),
                                      platform.python_version().encode()])).hexdigest()[:16]
    name = "raymt_ops_" + target.replace("-", "_")
    return name, flags, os.path.join(_extensions_root(), "raymt", f"{name}-{key}.so")


def _build(name: str, flags: list[str], path: str) -> None:
    """Build in a private directory (its ninja lock is this process's alone), load, then rename into place."""
    from torch.utils.cpp_extension import load as cpp_build

    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    _remove_stale_builds(folder)
    private = tempfile.mkdtemp(prefix=f"{name}-build-", dir=folder)
    logger.info("building the native decode operators (%s) into %s (once per machine and torch version, "
                "about a minute)", " ".join(flags), folder)
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
