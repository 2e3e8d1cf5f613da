"""The README stays true: its translate command runs as written, CI runs exactly its test command,
its links resolve and its extras are the package's; and the project's text speaks about the product."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)[:2]


def test_ci_runs_the_readme_test_command():
    test_command = readme_commands()[1].split(" && ")[-1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().split("\n")
    assert ci[-1] == test_command


def test_readme_translate_command_runs(demo_model_dir, tmp_path):
    translate = next(part for part in readme_commands()[0].split(" && ") if "raymt.jobs.translate" in part)
    args = shlex.split(translate)
    assert args[:3] == ["python", "-m", "raymt.jobs.translate"]
    args[args.index("--output") + 1] = str(tmp_path / "sample.en.txt")
    args[args.index("--model") + 1] = str(demo_model_dir)
    subprocess.run([sys.executable, *args[1:]], cwd=ROOT, check=True, capture_output=True, timeout=600)
    lines = (tmp_path / "sample.en.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len((ROOT / "examples" / "sample.de.txt").read_text(encoding="utf-8").split("\n")[:-1])



def test_readme_python_example_runs():
    example = re.findall(r"```python\n(.*?)\n```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)[0]
    done = subprocess.run([sys.executable, "-c", example], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    best, nbest = done.stdout.strip().splitlines()
    assert "dog" in best and best.strip("[]'") in nbest  # the 1-best heads the n-best

def test_readme_is_short_and_its_links_and_the_docs_links_resolve():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"


def extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def test_readme_extras_are_the_package_extras():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert set(re.findall(r"^\| `(\w+)` \|", readme, flags=re.M)) == set(extras())


def test_the_test_extra_installs_every_other_extra():
    declared = extras()
    missing = {extra: sorted(set(packages) - set(declared["test"]))
               for extra, packages in declared.items() if extra != "test"}
    assert not any(missing.values()), f"[test] lacks {missing}"
