"""``raymt.*`` resolves for static tools as it does for Python: every ``raymt.*`` module the project
imports is found by a type checker (mypy) in a checkout, with no import hook. The parts are plain
packages, ``raymt/workers``, ``raymt/pipeline`` and ``raymt/jobs``; the top-level ``workers/``,
``pipeline/`` and ``jobs/`` are links to them."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.conftest import ROOT

FOLDERS = ("raymt", "benchmarks", "tools", "tests")


def raymt_imports() -> list[str]:
    found: set[str] = set()
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("raymt"):
                    found.add(node.module)
                elif isinstance(node, ast.Import):
                    found.update(a.name for a in node.names if a.name.startswith("raymt"))
    return sorted(found)


def test_the_parts_are_packages_and_the_top_level_folders_link_to_them():
    import raymt
    assert not hasattr(raymt, "__path__") or list(raymt.__path__) == [str(ROOT / "raymt")]  # no hook adds a path
    for part in ("workers", "pipeline", "jobs"):
        package, link = ROOT / "raymt" / part, ROOT / part
        assert (package / "__init__.py").is_file() and not package.is_symlink(), package
        assert link.is_symlink() and link.resolve() == package.resolve(), link


def test_a_type_checker_resolves_every_raymt_import():
    pytest.importorskip("mypy", reason="mypy is in the test extra (pip install -e '.[test]')")
    modules = raymt_imports()
    assert len(modules) > 50 and "raymt.workers.decoder.engine" in modules and "raymt.jobs.translate" in modules
    run = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=skip", "--cache-dir", "/dev/null",
                          "--no-error-summary", "-c", "import " + ", ".join(modules)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    unresolved = [line for line in run.stdout.splitlines() if "import-not-found" in line or "import-untyped" in line]
    assert not unresolved, "\n".join(unresolved)
