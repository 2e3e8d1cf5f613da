"""The native decode operators built into the package at install time (pyproject.toml holds the rest).

``pip install .`` and ``pip wheel .`` compile ``workers/kernels/csrc`` once per target the loader knows
(``workers/kernels/native_build.py``: x86-64-v4, x86-64-v3 and portable on x86-64, portable elsewhere) into
``raymt/workers/kernels/_native/``, against the torch installed in the environment the command runs in (install
torch first, as the README does). pip's build isolation hides that torch from the build: it is found
where the interpreter's own packages are, never downloaded (torch is not a build requirement: a build
against another torch would not match the one installed). The loader (``workers/kernels/native.py``) takes a
library only for the torch and Python it was built with, and the CPU's own target, so a node without a
compiler runs the installed build and no node compiles on its first unit.

An editable install (``pip install -e .``) builds nothing: the operators are built on first use, as in
a source checkout. Without torch in the environment, or with ``RAYMT_BUILD_NATIVE=0``, nothing is built
either. ``RAYMT_NATIVE_TARGETS=x86-64-v3,portable`` builds only those. A target that does not compile
(a compiler without ``-march=x86-64-v4``) is left out with a warning; the install goes on.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import site
import sys
from types import ModuleType

from setuptools import Extension, setup

logger = logging.getLogger("raymt.setup")
HERE = os.path.dirname(os.path.abspath(__file__))
BUILDING = {"bdist_wheel", "bdist", "build", "build_ext", "install"}  # commands that build binaries (not metadata)


def native_build() -> ModuleType:
    """``workers/kernels/native_build.py``, read by its path (raymt is not importable yet)."""
    spec = importlib.util.spec_from_file_location("raymt_native_build", os.path.join(HERE, "raymt", "workers", "kernels", "native_build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def builds_binaries(argv: list[str]) -> bool:
    """Whether this run of setup.py builds a wheel or installs (an editable wheel and metadata: no)."""
    return bool(BUILDING & {a for a in argv[1:] if not a.startswith("-")}) and os.environ.get("RAYMT_BUILD_NATIVE") != "0"


def find_torch() -> ModuleType | None:
    """The environment's torch; under pip's build isolation, from the interpreter's site-packages
    (appended after the isolated build tools), never downloaded."""
    try:
        import torch
        return torch
    except ImportError:
        pass
    for folder in [*site.getsitepackages(), site.getusersitepackages()]:
        if os.path.isdir(os.path.join(folder, "torch")) and folder not in sys.path:
            sys.path.append(folder)
            try:
                import torch
                return torch
            except ImportError as err:
                logger.warning("torch in %s does not import (%s)", folder, err)
                sys.path.remove(folder)
    return None


def targets(build_spec: ModuleType) -> list[str]:
    wanted = [t.strip() for t in os.environ.get("RAYMT_NATIVE_TARGETS", "").split(",") if t.strip()]
    unknown = [t for t in wanted if t not in build_spec.MARCH_FLAGS]
    if unknown:
        raise SystemExit(f"RAYMT_NATIVE_TARGETS: unknown target(s) {', '.join(unknown)}; known: {', '.join(build_spec.ORDER)}")
    return wanted or build_spec.machine_targets()


def native_extensions() -> tuple[list, dict]:
    """(ext_modules, cmdclass) building the operators, or nothing where they are not built here."""
    if not builds_binaries(sys.argv):
        return [], {}
    torch = find_torch()
    if torch is None:
        logger.warning("raymt: torch is not installed here, so the native operators are not built now; they are "
                       "built on first use (install torch first to build them with the package)")
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    build_spec = native_build()
    sources = [os.path.join("raymt", "workers", "kernels", "csrc", name) for name in build_spec.SOURCE_NAMES]
    built = {}
    extensions = []
    for target in targets(build_spec):
        key = build_spec.library_key(target, torch.__version__)
        stem = build_spec.installed_stem(target, key)
        built[stem] = target
        extensions.append(CppExtension(f"raymt.workers.kernels._native.{stem}", sources,
                                       depends=[os.path.join("raymt", "workers", "kernels", "csrc", h) for h in build_spec.HEADER_NAMES],
                                       extra_compile_args=[*build_spec.compile_flags(target), "-g0"],
                                       extra_link_args=list(build_spec.LINK_FLAGS)))
    manifest = {"torch": torch.__version__, "python": build_spec.python_abi()}
    return extensions, {"build_ext": build_command(BuildExtension, built, manifest, build_spec.MANIFEST)}


def build_command(base: type, built: dict[str, str], manifest: dict, manifest_name: str) -> type:
    """``BuildExtension`` (plain ``.so`` names) that skips editable builds, leaves out a target that
    fails with a warning, and writes the manifest of what it built."""

    class BuildNative(base.with_options(no_python_abi_suffix=True)):
        def run(self) -> None:
            if getattr(self, "editable_mode", False) or self.inplace:
                logger.info("raymt: editable install: the native operators are built on first use")
                return
            folder = os.path.join(self.build_lib, "raymt", "workers", "kernels", "_native")
            shutil.rmtree(folder, ignore_errors=True)  # an earlier build's libraries (other keys) left out
            self.done: dict[str, str] = {}
            try:
                super().run()
            except Exception as err:  # noqa: BLE001 - no compiler at all: the operators are built on first use
                logger.warning("raymt: native operators not built (%s); they are built on first use", err)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, manifest_name), "w") as f:
                json.dump({**manifest, "libraries": self.done}, f, indent=1)

        def build_extension(self, ext: Extension) -> None:
            stem = ext.name.rsplit(".", 1)[-1]
            try:
                super().build_extension(ext)
                self.done[built[stem]] = stem + ".so"
            except Exception as err:  # noqa: BLE001 - e.g. a compiler without this -march: built on first use
                logger.warning("raymt: native operators for %s not built (%s)", built[stem], err)

    return BuildNative


if __name__ == "__main__":  # (setuptools runs this file as __main__; tests import it)
    ext_modules, cmdclass = native_extensions()
    setup(ext_modules=ext_modules, cmdclass=cmdclass)
