"""Output paths refused before any work, and a full or read-only disk reported in one line: through
the CLI, as a user meets them. The disk cases run in a private mount namespace (``unshare -rm``) on a
real tmpfs that is small or read-only; they skip where user namespaces are not allowed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raymt.pipeline.outputs.guards import OutputRefused, check_output
from tests.conftest import ROOT

SAMPLE = ROOT / "examples" / "sample.de.txt"


def cli(model: Path, src: Path | str, out: Path | str, *flags: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raymt.jobs.translate", "--in-process", "--model", str(model), "--input",
                           str(src), "--output", str(out), "--beam-size", "1", *flags],
                          cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def one_error_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode != 0, run.stdout + run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    return run.stderr.strip().splitlines()[-1]


def test_an_output_that_is_the_input_is_refused_and_the_input_untouched(demo_model_dir, tmp_path) -> None:
    src = tmp_path / "in.txt"
    shutil.copy(SAMPLE, src)
    before = src.read_bytes()
    line = one_error_line(cli(demo_model_dir, src, src))
    assert line.startswith("error: --output") and "is the --input itself" in line
    assert src.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


@pytest.mark.parametrize("where", ["/", ".", "cwd-absolute"])
def test_a_filesystem_root_or_the_current_directory_is_refused(demo_model_dir, tmp_path, where) -> None:
    out = str(tmp_path) if where == "cwd-absolute" else where
    line = one_error_line(cli(demo_model_dir, SAMPLE, out, cwd=tmp_path))
    assert ("a filesystem root" if where == "/" else "the current directory") in line
    assert list(tmp_path.iterdir()) == []


def test_an_output_around_or_inside_the_input_is_refused(tmp_path) -> None:
    (tmp_path / "corpus").mkdir()
    src = tmp_path / "corpus" / "a.txt"
    shutil.copy(SAMPLE, src)
    with pytest.raises(OutputRefused, match="contains the --input"):
        check_output(str(src), str(tmp_path))
    with pytest.raises(OutputRefused, match="inside the --input directory"):
        check_output(str(tmp_path / "corpus"), str(tmp_path / "corpus" / "out"))
    with pytest.raises(OutputRefused, match="is the --input itself"):
        check_output(str(src), str(tmp_path / "out.parts"), str(tmp_path / "corpus" / ".." / "corpus" / "a.txt"))
    (tmp_path / "link").symlink_to(tmp_path / "corpus")
    with pytest.raises(OutputRefused, match="inside the --input directory"):
        check_output(str(tmp_path / "corpus"), str(tmp_path / "link" / "out"))
    check_output(str(src), str(tmp_path / "elsewhere"), str(tmp_path / "elsewhere.txt"))  # fine


def test_a_bucket_root_is_refused() -> None:
    with pytest.raises(OutputRefused, match="a bucket's root"):
        check_output("s3://corpus-bucket/in.txt", "s3://corpus-bucket/")


def in_namespace(script: str) -> subprocess.CompletedProcess:
    """``script`` (bash) as root of a private user and mount namespace, where it may mount a tmpfs."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"user namespaces are not allowed here: {probe.stderr.decode().strip()}")
    return subprocess.run(["unshare", "-rm", "bash", "-c", script], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_no_space_left_while_assembling_is_one_line_leaves_nothing_partial_and_a_rerun_assembles(
        demo_model_dir, tmp_path) -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    src = tmp_path / "in.txt"
    src.write_text("\n".join(f"{lines[i % len(lines)]} ({i})" for i in range(300)) + "\n", encoding="utf-8")
    small, parts = tmp_path / "small", tmp_path / "parts"
    small.mkdir()
    parts.mkdir()
    job = (f"{sys.executable} -m raymt.jobs.translate --in-process --model {demo_model_dir} --input {src} "
           f"--output {small}/out.txt --beam-size 1")
    run = in_namespace(f"""
        mount -t tmpfs -o size=8k tmpfs {small} && ln -s {parts} {small}/out.txt.parts || exit 90
        {job}; echo "first=$?"; echo "left: $(ls -A {small} | tr '\\n' ' ')"
        mount -o remount,size=1m {small}
        {job}; echo "second=$?"; wc -l < {small}/out.txt""")
    out = run.stdout
    assert "first=1" in out, out + run.stderr
    error = [x for x in run.stderr.splitlines() if x.startswith("error:")]
    assert len(error) == 1 and "No space left on device assembling" in error[0] and "errno 28" in error[0], run.stderr
    left = next(x for x in out.splitlines() if x.startswith("left: "))
    assert left.split() == ["left:", "out.txt.parts"], left  # no out.txt, no temporary file
    assert "second=0" in out and out.strip().splitlines()[-1] == "300", out + run.stderr


def test_a_read_only_output_is_one_line_before_any_work(demo_model_dir, tmp_path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    run = in_namespace(f"""
        mount -t tmpfs -o ro,size=64k tmpfs {ro} || exit 90
        {sys.executable} -m raymt.jobs.translate --in-process --model {demo_model_dir} --input {SAMPLE} \
            --output {ro}/out/ --beam-size 1""")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot write --output {ro}/out") and "Read-only file system" in last, run.stderr


def test_no_space_for_a_part_stops_at_once_without_decoding_again_and_a_rerun_resumes(demo_model_dir, tmp_path) -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    src = tmp_path / "in.txt"
    src.write_text("\n".join(f"{lines[i % len(lines)]} ({i})" for i in range(160)) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    job = (f"{sys.executable} -m raymt.jobs.translate --in-process --model {demo_model_dir} --input {src} "
           f"--output {out}/ --beam-size 1 --unit-rows 20")
    run = in_namespace(f"""
        mount -t tmpfs -o size=24k tmpfs {out} || exit 90
        {job}; echo "first=$?"; echo "left: $(ls -A {out} | tr '\\n' ' ')"; ls {out}/_manifest | wc -l
        mount -o remount,size=4m {out}
        {job}; echo "second=$?"
        {sys.executable} -c "import pyarrow.parquet as pq, glob; t = pq.read_table(sorted(glob.glob('{out}/part-*'))); \
print('rows', t.num_rows, len(set(t.column('row').to_pylist())))" """)
    out_text, err = run.stdout, run.stderr
    assert "first=1" in out_text, out_text + err
    first_err = err.split("second", 1)[0]
    error = [x for x in err.splitlines() if x.startswith("error:")]
    assert error and "No space left on device writing" in error[0] and "errno 28" in error[0], err
    assert "attempt" not in first_err, err  # deterministic: failed at once, not decoded again
    left = next(x for x in out_text.splitlines() if x.startswith("left: "))
    assert not [n for n in left.split() if n.endswith(".tmp")], left
    assert "second=0" in out_text and "rows 160 160" in out_text, out_text + err


def test_an_output_in_or_around_the_model_directory_is_refused(demo_model_dir, tmp_path) -> None:
    with pytest.raises(OutputRefused, match="inside the --model directory"):
        check_output(str(SAMPLE), str(demo_model_dir / "out"), model_url=str(demo_model_dir))
    with pytest.raises(OutputRefused, match="contains the --model"):
        check_output(str(SAMPLE), str(demo_model_dir.parent), model_url=str(demo_model_dir))
