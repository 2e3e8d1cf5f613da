"""Special files and OS errors are one ``error:`` line before any work, never a hang or a traceback:
a FIFO given as --input or inside an input directory, a socket, a symlink loop, an output whose
parent is a regular file. Each runs the real command in its own process, under a timeout."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from raymt.pipeline.errors import os_error_line
from tests.conftest import ROOT

SAMPLE = ROOT / "examples" / "sample.de.txt"


def translate(model: Path, src: Path | str, out: Path | str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raymt.jobs.translate", "--in-process", "--model", str(model),
                           "--input", str(src), "--output", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    return line


@pytest.mark.parametrize("inside", [False, True], ids=["as-input", "in-a-directory"])
def test_a_fifo_is_refused_not_waited_on(demo_model_dir, tmp_path, inside):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("Ein Hund.\n")
    fifo = folder / "pipe.txt"
    os.mkfifo(fifo)
    line = one_error_line(translate(demo_model_dir, folder if inside else fifo, tmp_path / "out.txt"))
    assert line.startswith(f"error: {fifo}: a named pipe (FIFO), not a regular file: refused before any work")
    assert "--input -" in line
    assert not (tmp_path / "out.txt").exists() and not (tmp_path / "out.txt.parts").exists()


def test_a_socket_in_an_input_directory_is_refused(demo_model_dir, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("Ein Hund.\n")
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(folder / "s.txt"))
        line = one_error_line(translate(demo_model_dir, folder, tmp_path / "out.txt"))
    finally:
        server.close()
    assert line.startswith(f"error: {folder / 's.txt'}: a socket, not a regular file")


def test_a_symlink_loop_in_an_input_directory_is_one_line(demo_model_dir, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("Ein Hund.\n")
    os.symlink("loop.txt", folder / "loop.txt")
    line = one_error_line(translate(demo_model_dir, folder, tmp_path / "out.txt"))
    assert line == f"error: {folder / 'loop.txt'}: cannot be read as input: {folder / 'loop.txt'}: Too many levels of " \
                   f"symbolic links (ELOOP)"


@pytest.mark.parametrize("out", ["afile/out.txt", "afile/sub/"])
def test_an_output_under_a_regular_file_is_one_line(demo_model_dir, tmp_path, out):
    (tmp_path / "afile").write_text("not a folder")
    line = one_error_line(translate(demo_model_dir, SAMPLE, f"{tmp_path}/{out}"))
    assert f"{tmp_path / 'afile'} is a file, not a directory (ENOTDIR)" in line
    assert (tmp_path / "afile").read_text() == "not a folder"


def test_os_errors_read_as_one_line():
    assert os_error_line(OSError(40, "Too many levels of symbolic links", "/a/b")) == \
        "/a/b: Too many levels of symbolic links (ELOOP)"
    assert os_error_line(OSError(18, "Invalid cross-device link", "/a", None, "/b")) == "/a -> /b: Invalid cross-device link (EXDEV)"
