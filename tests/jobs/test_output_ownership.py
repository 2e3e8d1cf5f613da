"""A job never replaces or writes among files raymt did not write: an existing ``--output`` file is
replaced only when its parts folder's record names it (or with ``--overwrite``), and a non-empty
folder holding no raymt output is refused. Each case runs the real command in its own process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.jobs.test_special_paths import SAMPLE, one_error_line


def translate(model: Path, src: Path | str, out: Path | str, *flags: str,
              stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raymt.jobs.translate", "--in-process", "--model", str(model),
                           "--input", str(src), "--output", str(out), *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=180, input=stdin)


@pytest.mark.parametrize("name", ["mine.txt", "mine.jsonl", "mine.parquet"])
def test_a_user_s_file_named_as_output_is_refused_and_kept(demo_model_dir, tmp_path, name):
    mine = tmp_path / name
    mine.write_bytes(b"precious data\n")
    line = one_error_line(translate(demo_model_dir, SAMPLE, mine))
    assert line.startswith(f"error: --output {mine} exists and raymt did not write it")
    assert "--overwrite" in line
    assert mine.read_bytes() == b"precious data\n"
    assert not (tmp_path / f"{name}.parts").exists()


def test_overwrite_replaces_a_user_s_file_and_the_rerun_is_raymt_s_own(demo_model_dir, tmp_path):
    mine = tmp_path / "mine.txt"
    mine.write_text("precious data\n")
    first = translate(demo_model_dir, SAMPLE, mine, "--overwrite")
    assert first.returncode == 0, first.stderr
    translated = mine.read_text()
    assert translated != "precious data\n" and len(translated.splitlines()) == len(SAMPLE.read_text().splitlines())
    again = translate(demo_model_dir, SAMPLE, mine)  # its records name it now: a rerun needs no flag
    assert again.returncode == 0, again.stderr
    assert mine.read_text() == translated


def test_a_file_changed_after_raymt_wrote_it_is_the_user_s(demo_model_dir, tmp_path):
    out = tmp_path / "out.txt"
    assert translate(demo_model_dir, SAMPLE, out).returncode == 0
    out.write_text(out.read_text() + "a line the user added\n")
    line = one_error_line(translate(demo_model_dir, SAMPLE, out))
    assert "raymt did not write it" in line
    assert out.read_text().endswith("a line the user added\n")


def test_a_non_empty_folder_without_raymt_output_is_refused(demo_model_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("my notes\n")
    line = one_error_line(translate(demo_model_dir, SAMPLE, out))
    assert line.startswith(f"error: --output {out} is a folder holding 1 file(s) raymt did not write (notes.txt)")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    done = translate(demo_model_dir, SAMPLE, out, "--overwrite")  # asked: written among them, theirs kept
    assert done.returncode == 0, done.stderr
    assert (out / "_SUCCESS").exists() and (out / "notes.txt").read_text() == "my notes\n"
    assert translate(demo_model_dir, SAMPLE, out).returncode == 0  # raymt's output now: a rerun resumes


def test_an_empty_folder_and_hidden_files_are_accepted(demo_model_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".keep").write_text("")
    done = translate(demo_model_dir, SAMPLE, out)
    assert done.returncode == 0, done.stderr


def test_a_stream_does_not_replace_an_existing_file(demo_model_dir, tmp_path):
    mine = tmp_path / "mine.txt"
    mine.write_text("precious data\n")
    line = one_error_line(translate(demo_model_dir, "-", mine, stdin="Ein Hund.\n"))
    assert line.startswith(f"error: --output {mine} exists") and "--overwrite" in line
    assert mine.read_text() == "precious data\n"
    done = translate(demo_model_dir, "-", mine, "--overwrite", stdin="Ein Hund.\n")
    assert done.returncode == 0, done.stderr
    assert mine.read_text() != "precious data\n"
