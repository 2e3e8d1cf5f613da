"""What the native decode operators (``workers/kernels/csrc``) are built from and for: shared by the loader
(``workers/kernels/native.py``) and the install-time build (``setup.py``, which reads this file by its path,
before raymt is installed: it imports neither raymt nor torch).

A library is named by its target and a key, a digest of the sources, the compile flags, the torch
version and Python's ABI version (``3.11``: CPython keeps its ABI within a minor version, and a wheel's
tag pins the same): ``raymt_ops_<target>-<key>.so`` in the first-use cache, ``raymt_ops_<target>_<key>.so``
beside the package (``INSTALLED_DIR``, written by ``pip install .`` / ``pip wheel .``). The loader
takes a library only under the key it computes itself, so one built for another torch or Python, or
from other sources, is never loaded.
"""
from __future__ import annotations

import hashlib
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_NAMES = ("decode_ops.cpp", "beam_step.cpp", "small_linear.cpp", "head_top.cpp")
HEADER_NAMES = ("tiles.h",)  # included by the sources above: part of the key
SOURCES = [os.path.join(HERE, "csrc", name) for name in SOURCE_NAMES]
HEADERS = [os.path.join(HERE, "csrc", name) for name in HEADER_NAMES]
INSTALLED_DIR = os.path.join(HERE, "_native")  # the install-time builds (absent in a source checkout)
MANIFEST = "manifest.json"  # in INSTALLED_DIR: the torch and Python versions its libraries were built for
MARCH_FLAGS = {  # target -> compile flags; the CPU_CAPABILITY macros pick ATen's vector types as its kernels do
    "x86-64-v4": ["-march=x86-64-v4", "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "x86-64-v3": ["-march=x86-64-v3", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
    "portable": ["-DCPU_CAPABILITY=DEFAULT"],
}
ORDER = ("portable", "x86-64-v3", "x86-64-v4")  # lowest first
LINK_FLAGS = ["-fopenmp"]
X86 = ("x86_64", "amd64", "i686", "i386")


def compile_flags(target: str) -> list[str]:
    return ["-O3", "-fopenmp", *MARCH_FLAGS[target]]


def library_name(target: str) -> str:
    """``raymt_ops_x86_64_v3``: the extension's name for ``target``."""
    return "raymt_ops_" + target.replace("-", "_")


def python_abi() -> str:
    """This interpreter's ABI version, ``3.11``."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def library_key(target: str, torch_version: str, python_version: str | None = None) -> str:
    """The digest of the sources and headers, ``target``'s flags, the torch version and the Python ABI (16 hex digits)."""
    texts = []
    for source in (*SOURCES, *HEADERS):
        with open(source, "rb") as f:
            texts.append(f.read())
    python_version = python_version or python_abi()
    return hashlib.sha256(b"\0".join([*texts, " ".join(compile_flags(target)).encode(), torch_version.encode(),
                                      python_version.encode()])).hexdigest()[:16]


def installed_stem(target: str, key: str) -> str:
    """The install-time library's file name without ``.so`` (an extension module name: no ``-``)."""
    return f"{library_name(target)}_{key}"


def machine_targets(machine: str | None = None) -> list[str]:
    """Every target a CPU of this architecture may load, highest first: x86-64 all three, else portable."""
    machine = (machine or platform.machine()).lower()
    return list(reversed(ORDER)) if machine in X86 else ["portable"]
