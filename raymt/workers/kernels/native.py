"""Native decode-step operators (``workers/kernels/csrc/*.cpp``): built at install time, else on first use and cached.

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
* ``head_top_log_softmax`` (``head_top.cpp``): the output layer's product and the row top above in
  one pass over the weights, the (N, V) logits never written (37 MB a step at 160 rows of a 58k-word
  vocabulary); the same columns as the two calls, log-probs to float32 rounding of the normaliser.
* ``beam_step`` (``beam_step.cpp``): the whole beam-search step after the output layer (candidates,
  finished pools, stop test, reorder, readback) in one call instead of ~20-50 ATen calls (greedy too).

The attention kernels sum in another order than MKL's batched GEMMs: float32 results equal to
~1e-6, as the oneDNN layers are. The extension uses torch's own vector types and thread pool, is
registered as torch operators (``torch.ops.raymt.*``, named in profiles) and is built by
``torch.utils.cpp_extension`` (g++) for the instruction set this process decodes with
(``raymt.workers.kernels.isa``), with explicit flags (``MARCH_FLAGS``, ``workers/kernels/native_build.py``):

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

Each target's library is looked up in this order (``load``), each under its key, a digest of the
source, the flags, the torch version and the Python ABI (``library_key`` of ``workers/kernels/native_build.py``):

1. installed: ``pip install .`` / ``pip wheel .`` build every target of the architecture into the
   package (``setup.py``), so a node with no compiler runs them and no node compiles on its first
   unit; used only where this process's torch and Python (3.x) are the ones it was built with
   (``RAYMT_NATIVE_PREBUILT=0`` ignores it);
2. cached: ``<TORCH_EXTENSIONS_DIR>/raymt/raymt_ops_<target>-<key>.so``, built on first use (an
   editable install, a source checkout, or another torch than the installed build's);
3. built here, with g++ and ninja (about a minute). No lock is shared between processes: a process
   builds in a private directory of its own and moves the library into place with one atomic
   rename, so a build killed at any point (a decoder actor SIGKILLed, the OOM killer) leaves only
   its own private directory behind, which nobody waits on; concurrent builders each finish and
   the last rename wins. The driver builds once per machine before any decoder starts (``prebuild``).

An AVX-512 build is never loaded on an AVX2 CPU: the target is chosen from the CPU first.
``loaded`` says which library this process runs; ``plan`` what ``load`` would do, without building.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from types import ModuleType

import torch

from raymt.workers.kernels.isa import CpuIsa, detect
from raymt.workers.kernels.native_build import (INSTALLED_DIR, LINK_FLAGS, MANIFEST, MARCH_FLAGS, ORDER, SOURCES,
                                        compile_flags, installed_stem, library_key, library_name, python_abi)

logger = logging.getLogger(__name__)

MARCH_ENV = "RAYMT_NATIVE_MARCH"
PREBUILT_ENV = "RAYMT_NATIVE_PREBUILT"  # "0": ignore the installed build (first-use builds only)
_TARGET_OF_LEVEL = {"avx512": "x86-64-v4", "avx2": "x86-64-v3", "portable": "portable"}


@dataclass(frozen=True, slots=True)
class Loaded:
    """Where this process's operators come from: ``origin`` "installed" (built with the package),
    "cached" (built on first use, earlier) or "built" (built on first use, by this process)."""

    target: str
    origin: str
    path: str

    def describe(self) -> str:
        how = {"installed": "installed build", "cached": "first-use build, cached",
               "built": "first-use build, built by this process"}[self.origin]
        return f"native ({how}, {self.target})"


_state: dict[str, Loaded | str | None] = {"loaded": None, "failure": None}


@functools.cache
def load() -> ModuleType | None:
    """The compiled operators (``torch.ops.raymt``), or None (with one warning saying why) where they cannot be built.

    Tries the machine's target, then the portable build; each installed, cached or built apart."""
    errors = []
    for target in build_targets():
        try:
            _state["loaded"] = _load_or_build(target)
            return torch.ops.raymt
        except Exception as err:  # no compiler, no ninja, unwritable cache, flags the compiler lacks
            errors.append(f"{target}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    _state["failure"] = "; ".join(errors)
    logger.warning("native decode operators unavailable (%s); decoding with ATen operators", _state["failure"])
    return None


def loaded() -> Loaded | None:
    """The library ``load`` loaded in this process; None before it ran, or where it found none."""
    return _state["loaded"]  # type: ignore[return-value]


def failure() -> str | None:
    """Why ``load`` found no operators (each target's error), or None."""
    return _state["failure"]  # type: ignore[return-value]


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
    if ORDER.index(forced) > ORDER.index(own):
        logger.warning("%s=%s: this process decodes with %s; building for %s", MARCH_ENV, forced, own, own)
        return own
    return forced


def build_targets() -> list[str]:
    """The target, then the portable fallback."""
    target = build_target()
    return [target] if target == "portable" else [target, "portable"]


def installed_library(target: str) -> str | None:
    """The install-time build of ``target`` for this source, torch and Python, where there is one."""
    if os.environ.get(PREBUILT_ENV, "1") == "0":
        return None
    path = os.path.join(INSTALLED_DIR, installed_stem(target, library_key(target, torch.__version__)) + ".so")
    return path if os.path.exists(path) else None


def installed_manifest() -> dict | None:
    """What the installed builds were built for (``{"torch", "python", "libraries": {target: file}}``), or None."""
    try:
        with open(os.path.join(INSTALLED_DIR, MANIFEST)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _load_or_build(target: str) -> Loaded:
    if installed := installed_library(target):
        try:
            torch.ops.load_library(installed)
            return Loaded(target, "installed", installed)
        except Exception as err:  # noqa: BLE001 - e.g. a system library it needs is missing: a first-use build may run
            logger.warning("installed native operators %s not loaded (%s); trying a first-use build", installed, err)
    name, flags, path = _library(target)
    if os.path.exists(path):
        torch.ops.load_library(path)
        return Loaded(target, "cached", path)
    _build(name, flags, path)  # loads the library it builds
    return Loaded(target, "built", path)


def _library(target: str) -> tuple[str, list[str], str]:
    """(extension name, compile flags, cached library path) for this source, target, torch and Python."""
    name, key = library_name(target), library_key(target, torch.__version__)
    return name, compile_flags(target), os.path.join(_extensions_root(), "raymt", f"{name}-{key}.so")


def _build(name: str, flags: list[str], path: str) -> None:
    """Build in a private directory (its ninja lock is this process's alone), load, then rename into place."""
    from torch.utils.cpp_extension import load as cpp_build

    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    _remove_stale_builds(folder)
    private = tempfile.mkdtemp(prefix=f"{name}-build-", dir=folder)
    logger.info("building the native decode operators (%s) into %s (once per machine and torch version, "
                "about a minute; a non-editable install builds them at install time)", " ".join(flags), folder)
    try:
        built = cpp_build(name, SOURCES, build_directory=private, verbose=False, is_python_module=False,
                          extra_cflags=flags, extra_ldflags=LINK_FLAGS)
        os.replace(built if isinstance(built, str) else os.path.join(private, f"{name}.so"), path)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def prebuild() -> bool:
    """Build the operators in this process (the driver, before decoders start); False if they cannot be built."""
    return load() is not None


def plan() -> str:
    """What ``load`` does (or did) in this process, in a line, without building anything."""
    if (done := loaded()) is not None:
        return f"{done.describe()}: {done.path}"
    if failure() is not None:
        return f"ATen (native operators unavailable: {failure()})"
    for target in build_targets():
        if installed := installed_library(target):
            return f"native (installed build, {target}): {installed}"
        cached = _library(target)[2]
        if os.path.exists(cached):
            return f"native (first-use build, cached, {target}): {cached}"
        if _cannot_build() is None:
            return f"native (built on first use, {target}: about a minute, then cached in {os.path.dirname(cached)})"
    return f"ATen (no installed build for torch {torch.__version__} / Python {python_abi()}; " \
           f"no first-use build: {_cannot_build()})"


def decoder_kernels(ops: object) -> str:
    """The kernels a decoder's step backend (``model.ops``) runs, as its units' stats record them:
    ``native:<origin>`` (``Loaded.origin``), ``aten``, ``aten:fallback`` (the native operators were
    wanted and could not be had) or ``triton``."""
    backend = getattr(ops, "backend", "aten")
    if backend == "native" and (done := loaded()) is not None:
        return f"native:{done.origin}"
    if backend == "aten" and failure() is not None:
        return "aten:fallback"
    return backend


_KERNEL_WORDS = {"native:installed": "native kernels (installed build)", "native:cached": "native kernels (first-use "
                 "build)", "native:built": "native kernels (built on first use)", "native": "native kernels",
                 "aten": "ATen kernels", "triton": "Triton kernels"}


def kernels_summary(labels: list[str | None]) -> str:
    """A job summary's words for its units' ``decoder_kernels`` labels; "" where none were recorded."""
    counts = Counter(label for label in labels if label)
    fallback = counts.pop("aten:fallback", 0)
    total = sum(counts.values()) + fallback
    mixed = len(counts) + bool(fallback) > 1
    parts = [_KERNEL_WORDS.get(k, k) + (f" on {n} of {total} units" if mixed else "") for k, n in counts.most_common()]
    if fallback:
        parts.append(f"ATen kernels{f' on {fallback} of {total} units' if mixed else ''} (the native operators "
                     "could not be loaded or built there: several times slower; raymt info on that node says why)")
    return ", ".join(parts)


def _cannot_build() -> str | None:
    """Why a first-use build cannot start here (no C++ compiler, no ninja), or None."""
    from torch.utils.cpp_extension import get_cxx_compiler, is_ninja_available

    compiler = get_cxx_compiler()
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler})"
    try:  # (what the build itself runs first)
        subprocess.run([compiler, "--version"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return f"the C++ compiler {compiler} does not run"
    if not is_ninja_available():
        return "no ninja"
    return None


def _extensions_root() -> str:
    from torch.utils.cpp_extension import get_default_build_root
    return os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()


def _remove_stale_builds(folder: str, older_than_s: float = 3600.0) -> None:
    """Private build directories left by killed builders (an hour old: no build takes that long)."""
    for entry in os.scandir(folder):
        if entry.is_dir() and "-build-" in entry.name and time.time() - entry.stat().st_mtime > older_than_s:
            shutil.rmtree(entry.path, ignore_errors=True)
