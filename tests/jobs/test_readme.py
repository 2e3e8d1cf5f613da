"""The README's set-up commands stay true: the translate command runs as written, and CI runs
exactly the README's test command."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

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


def test_readme_is_short_and_its_links_and_the_docs_links_resolve():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"


def test_readme_extras_are_the_package_extras():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(\w+)` \|", readme, flags=re.M))
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    declared = set(re.findall(r"^(\w+) = \[", section, flags=re.M))
    assert documented == declared
