"""Native operators built at install time (setup.py, workers/kernels/native_build.py) and found by the loader
(workers/kernels/native.py): an installed build whose key matches is loaded before any first-use build and
needs no compiler, one for another torch is passed over; ``raymt info`` and the job's summary line
say which kernels the decoders run."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from raymt.workers.kernels.native import kernels_summary
from raymt.workers.kernels.native_build import MARCH_FLAGS, installed_stem, library_key, library_name, machine_targets
from tests.conftest import ROOT

# Loads the operators with the installed builds in argv[1]; prints where they came from and whether they run.
LOADER = ("import sys, torch\n"
          "from raymt.workers.kernels import native\n"
          "native.INSTALLED_DIR = sys.argv[1]\n"
          "ops, done = native.load(), native.loaded()\n"
          "runs = ops is not None and ops.row_top_log_softmax(torch.randn(3, 50), 2, 0)[1].shape == (3, 2)\n"
          "print(done.origin if done else 'aten', runs)\n")
# A translate job (argv[2:]) with the installed builds in argv[1].
JOB = ("import sys\n"
       "from raymt.workers.kernels import native\n"
       "native.INSTALLED_DIR = sys.argv[1]\n"
       "from raymt.jobs.translate import main\n"
       "main(sys.argv[2:])\n")


def no_compiler_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A node without a compiler: g++, c++, gcc and cc on PATH exit 1, CXX is /bin/false, nothing cached."""
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    for name in ("g++", "c++", "gcc", "cc"):
        (shims / name).write_text("#!/bin/sh\nexit 1\n")
        (shims / name).chmod(0o755)
    return {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ.get('PATH', '')}", "CXX": "/bin/false",
            "CC": "/bin/false", "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), **extra}


def run(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def built(native_kernels):
    """The library this process runs (``native.Loaded``): copied to stand for an installed or cached build."""
    from raymt.workers.kernels.native import loaded
    return loaded()


def install(folder: Path, target: str, torch_version: str, library: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{installed_stem(target, library_key(target, torch_version))}.so"
    shutil.copy(library, path)
    return path


def test_an_installed_build_whose_key_matches_runs_without_a_compiler(tmp_path, built) -> None:
    install(tmp_path / "installed", built.target, torch.__version__, built.path)
    env = no_compiler_env(tmp_path, RAYMT_NATIVE_MARCH=built.target)
    assert run([sys.executable, "-c", LOADER, tmp_path / "installed"], env).stdout.split() == ["installed", "True"]
    ignored = run([sys.executable, "-c", LOADER, tmp_path / "installed"], {**env, "RAYMT_NATIVE_PREBUILT": "0"})
    assert ignored.stdout.split() == ["aten", "False"] and "native decode operators unavailable" in ignored.stderr
    assert not (tmp_path / "ext").exists() or not list((tmp_path / "ext").rglob("*.so"))  # nothing built


def test_an_installed_build_for_another_torch_is_passed_over_for_the_first_use_build(tmp_path, built) -> None:
    install(tmp_path / "installed", built.target, "0.0.0", built.path)  # another torch: its key differs
    env = no_compiler_env(tmp_path, RAYMT_NATIVE_MARCH=built.target)
    out = run([sys.executable, "-c", LOADER, tmp_path / "installed"], env)
    assert out.stdout.split() == ["aten", "False"]  # not loaded; no compiler for a first-use build either
    cache = tmp_path / "ext" / "raymt"
    cache.mkdir(parents=True, exist_ok=True)  # (the failed first-use build made it)
    shutil.copy(built.path, cache / f"{library_name(built.target)}-{library_key(built.target, torch.__version__)}.so")
    assert run([sys.executable, "-c", LOADER, tmp_path / "installed"], env).stdout.split() == ["cached", "True"]


def test_a_job_on_a_node_without_a_compiler_runs_the_installed_build_and_says_so(tmp_path, built, demo_model_dir) -> None:
    install(tmp_path / "installed", built.target, torch.__version__, built.path)
    env = no_compiler_env(tmp_path, RAYMT_NATIVE_MARCH=built.target)
    source = tmp_path / "in.de.txt"
    source.write_text("Ein Hund läuft.\n", encoding="utf-8")
    job = ["--model", demo_model_dir, "--input", source, "--in-process"]
    out = run([sys.executable, "-c", JOB, tmp_path / "installed", *job, "--output", tmp_path / "a.en.txt"], env)
    assert "end to end), native kernels (installed build) [model:" in out.stdout
    fallback = run([sys.executable, "-c", JOB, tmp_path / "installed", *job, "--output", tmp_path / "b.en.txt"],
                   {**env, "RAYMT_NATIVE_PREBUILT": "0"})
    assert "end to end), ATen kernels (the native operators could not be loaded or built there" in fallback.stdout
    assert (tmp_path / "b.en.txt").read_text(encoding="utf-8").strip()  # it still translates


def test_raymt_info_prints_what_a_job_runs_with(capsys, demo_model_dir) -> None:
    from raymt.cli import main
    main(["info", "--model", str(demo_model_dir)])
    lines = capsys.readouterr().out.splitlines()
    for field in ("raymt ", "torch ", "device: cpu", "gpu: ", "kernels (cpu): ", "installed builds: ", "threads: ",
                  "model: ", "search: beam:"):
        assert any(line.startswith(field) for line in lines), (field, lines)
    assert "model_type marian" in next(line for line in lines if line.startswith("model: "))


def test_raymt_info_on_a_node_without_builds_or_a_compiler_says_aten(tmp_path) -> None:
    out = run([sys.executable, "-m", "raymt.cli", "info"], no_compiler_env(tmp_path, RAYMT_NATIVE_PREBUILT="0"))
    assert "kernels (cpu): ATen (" in out.stdout


def test_the_summary_names_the_kernels_and_any_fallback() -> None:
    assert kernels_summary([]) == kernels_summary([None, ""]) == ""
    assert kernels_summary(["native:installed"] * 3) == "native kernels (installed build)"
    assert kernels_summary(["native:cached", "native:installed", "native:cached"]) == \
        "native kernels (first-use build) on 2 of 3 units, native kernels (installed build) on 1 of 3 units"
    mixed = kernels_summary(["native:installed", "aten:fallback"])
    assert mixed.startswith("native kernels (installed build) on 1 of 2 units, ATen kernels on 1 of 2 units (the "
                            "native operators could not be loaded or built there")
    assert kernels_summary(["aten"]) == "ATen kernels"  # chosen (--no-speedups): no fallback said
    assert kernels_summary(["triton"]) == "Triton kernels"


def test_unit_stats_carry_the_kernels_and_read_earlier_rows_without_them() -> None:
    import pyarrow as pa
    from raymt.pipeline.outputs.records import UnitStats
    stats = UnitStats(unit="u0", actor="h:1", node="n", started=1.0, finished=2.0, wait_s=0.0, encode_s=0.1,
                      decode_s=0.5, sentences=1, pieces=1, source_tokens=5, target_tokens=6, steps=6, row_steps=6,
                      occupancy=1.0, refills=0, batch_size=32, pruned_fraction=0.0, shortlist_size=0.0,
                      statuses={"ok": 1}, batch_histogram={1: 6}, bleu_stats=None, chrf_stats=None, slices=(),
                      kernels="native:installed")
    row = pa.Table.from_pylist([stats.to_row()]).to_pylist()[0]
    assert UnitStats.from_row(row) == stats
    del row["kernels"]  # a unit committed by an earlier version
    assert UnitStats.from_row(row).kernels == ""


def setup_module_of_the_project():
    spec = importlib.util.spec_from_file_location("raymt_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # (setup() runs only as __main__)
    return module


def test_setup_builds_every_target_under_the_loaders_key_for_wheels_and_installs_only(monkeypatch) -> None:
    setup = setup_module_of_the_project()
    assert setup.builds_binaries(["setup.py", "bdist_wheel", "--dist-dir", "/tmp/x"])
    for metadata_or_editable in (["setup.py", "editable_wheel", "--dist-dir", "/x"], ["setup.py", "egg_info"],
                                 ["setup.py", "dist_info", "--output-dir", "/x"]):
        assert not setup.builds_binaries(metadata_or_editable)
    monkeypatch.setattr(sys, "argv", ["setup.py", "editable_wheel"])
    assert setup.native_extensions() == ([], {})  # an editable install imports no torch and builds nothing
    monkeypatch.setattr(sys, "argv", ["setup.py", "bdist_wheel"])
    extensions, commands = setup.native_extensions()
    assert [e.name.rsplit(".", 1)[-1] for e in extensions] == \
        [installed_stem(t, library_key(t, torch.__version__)) for t in machine_targets()]
    assert all(e.name.startswith("raymt.workers.kernels._native.") for e in extensions) and "build_ext" in commands
    monkeypatch.setenv("RAYMT_NATIVE_TARGETS", "x86-64-v3,portable")
    assert len(setup.native_extensions()[0]) == 2
    monkeypatch.setenv("RAYMT_BUILD_NATIVE", "0")
    assert setup.native_extensions() == ([], {})


def test_targets_per_architecture_are_the_loaders() -> None:
    assert machine_targets("x86_64") == ["x86-64-v4", "x86-64-v3", "portable"] and set(MARCH_FLAGS) == \
        set(machine_targets("x86_64"))
    assert machine_targets("aarch64") == ["portable"]


@pytest.mark.slow
def test_a_fresh_install_runs_the_native_kernels_on_a_node_without_a_compiler(tmp_path, demo_model_dir) -> None:
    """``pip install torch==X && pip install <project>`` in a new virtual environment (build isolation
    as pip does it; torch from the environment, not downloaded), then a job where every compiler
    fails: the installed build runs. The editable form builds nothing and leaves the first use to build."""
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", "build", ".git", "*.egg-info", "__pycache__",
                                                                 "_native", "out*", "data*", "tmp"))
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], dict(os.environ))
    bin_dir = venv / "bin"
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    run([bin_dir / "pip", "install", f"torch=={torch.__version__.split('+')[0]}"], env, timeout=1800)
    run([bin_dir / "pip", "install", source], env, timeout=3600)
    bare = no_compiler_env(tmp_path, PATH=f"{tmp_path / 'shims'}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(venv))
    info = run([bin_dir / "raymt", "info"], bare).stdout
    assert "kernels (cpu): native (installed build" in info, info
    sample = tmp_path / "in.de.txt"
    sample.write_text("Ein Hund läuft.\nZwei Kinder spielen.\n", encoding="utf-8")
    job = run([bin_dir / "raymt", "translate", "--model", demo_model_dir, "--input", sample, "--output",
               tmp_path / "out.en.txt", "--in-process"], bare)
    assert "native kernels (installed build)" in job.stdout, job.stdout
    assert not list((tmp_path / "ext").rglob("*.so"))  # nothing compiled on the node
    run([bin_dir / "pip", "install", "--no-deps", "-e", source], env, timeout=600)
    editable = run([bin_dir / "raymt", "info"], {**env, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext2")}).stdout
    assert "installed builds: none" in editable and "kernels (cpu): native (built on first use" in editable, editable


def test_every_header_the_sources_include_is_keyed_and_shipped() -> None:
    """A header edit changes the library key, and an installed package carries the headers its
    first-use build needs (``pyproject.toml``'s package data)."""
    from raymt.workers.kernels.native_build import HEADER_NAMES, HEADERS, SOURCES

    included = {line.split('"')[1] for path in (*SOURCES, *HEADERS) for line in open(path, encoding="utf-8")
                if line.startswith("#include \"")}
    assert included == set(HEADER_NAMES)
    assert '"csrc/*.h"' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
