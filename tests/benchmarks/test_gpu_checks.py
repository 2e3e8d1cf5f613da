"""The one-call GPU check (``benchmarks/gpu_check.py``): its summary's table and size limit, and its
dry run on the CPU (``--device cpu``), which runs every part at small sizes and writes the same two
files a GPU machine brings back. The dry run takes a few minutes on two shared cores, so it is
marked slow: ``python -m pytest -m slow tests/benchmarks/test_gpu_checks.py`` before a GPU run."""
from __future__ import annotations

import argparse
import json
import tarfile

import pytest

from benchmarks.gpu_check import NOT_MEASURED, SUMMARY_LIMIT, main, summary
from tests.conftest import shared_path

ENVIRONMENT = [{"check": k, "figure": v, "result": "-", "gpu_only": False, "seconds": 0}
               for k, v in (("gpu", "NVIDIA H100 80GB HBM3"), ("torch", "2.11.0"), ("cuda", "13.0"), ("triton", "3.5"),
                            ("transformers", "5.0"))]


def rows(n: int, figure: str = "1234.5 tok/s, BLEU 40.1", result: str = "pass") -> list[dict]:
    return ENVIRONMENT + [{"check": f"part {i}", "figure": figure, "result": result, "gpu_only": True, "seconds": i}
                          for i in range(n)]


def table(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| check")]


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_summary_is_a_table_of_every_check(device):
    args = argparse.Namespace(device=device, budget_s=540.0)
    crashed = {"check": "bench", "figure": "-", "result": "FAIL: timed out after 70 s", "gpu_only": True, "seconds": 70}
    text = summary(rows(3) + [crashed], args, 300.0)
    got = table(text)
    assert [r[0] for r in got] == ["part 0", "part 1", "part 2", "bench"]
    assert got[-1][1:3] == ["-", "FAIL: timed out after 70 s"]  # a part that did not finish fails on any device
    if device == "cuda":
        assert text.startswith("# GPU check on NVIDIA H100 80GB HBM3\n")
        assert all(r[1:3] == ["1234.5 tok/s, BLEU 40.1", "pass"] for r in got[:3])
        assert "3 pass, 1 FAIL" in text
    else:
        assert "(dry run on the CPU)" in text.splitlines()[0]
        assert all(r[1:3] == [NOT_MEASURED, "ran (dry run)"] for r in got[:3])
        assert "3 ran, 1 FAIL" in text
    assert "torch 2.11.0, CUDA 13.0" in text


def test_a_summary_of_long_figures_is_cut_to_its_limit():
    text = summary(rows(60, figure="x" * 200, result="FAIL: " + "y" * 200), argparse.Namespace(device="cuda",
                                                                                              budget_s=540.0), 1.0)
    assert len(text.encode()) <= SUMMARY_LIMIT
    assert len(table(text)) == 60  # every check keeps its row


def stub_parts(monkeypatch, ran: list[str], raising: dict[str, BaseException]):
    """Every part answered at once (no subprocess), recorded in ``ran``; a part named in ``raising`` raises."""
    from benchmarks import gpu_check

    def part(name: str) -> list[dict]:
        ran.append(name)
        if name in raising:
            raise raising[name]
        return ENVIRONMENT if name == "environment" else rows(1, result="pass")[-1:]

    monkeypatch.setattr(gpu_check, "step_rows", lambda name, *a: part(name))
    monkeypatch.setattr(gpu_check, "pytest_rows", lambda *a: part("tests"))
    monkeypatch.setattr(gpu_check, "job_rows", lambda *a: part("job"))


def written(out) -> tuple[dict[str, list[str]], list[dict], list[str]]:
    """The summary's rows by check, and the tarball's rows.json and file names."""
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.tar.gz", "summary.md"]
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        return ({r[0]: r for r in table((out / "summary.md").read_text())},
                json.load(tar.extractfile("gpu_check/rows.json")), tar.getnames())


def test_a_part_that_raises_is_a_fail_naming_the_error_and_the_files_are_written(tmp_path, monkeypatch):
    """Unpacking the base model fails (a full disk): its row names the error, its traceback is in
    the tarball, the parts after it still run, and both files come back."""
    from benchmarks import gpu_check, gpu_data

    data = tmp_path / "data-gpu"
    (data / "base-de-en.int8").mkdir(parents=True)
    monkeypatch.setattr(gpu_check, "SHARED", tmp_path / "no-shared")

    def full_disk(packed, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gpu_data, "unpack_model", full_disk)
    ran: list[str] = []
    stub_parts(monkeypatch, ran, {})
    out = tmp_path / "out"
    gpu_check.main(["--out", str(out), "--device", "cpu", "--data", str(data)])
    got, logged, names = written(out)
    assert got["base model"][2] == "FAIL: OSError: [Errno 28] No space left on device"
    assert ran == ["environment", "tests", "replay", "bleu", "index", "job", "bench", "bench_base"]
    assert any(r["result"].startswith("FAIL: OSError") for r in logged) and "gpu_check/base_model.log" in names


def test_an_interrupted_check_still_writes_its_summary_naming_the_stop(tmp_path, monkeypatch):
    from benchmarks import gpu_check

    monkeypatch.setattr(gpu_check, "SHARED", tmp_path / "no-shared")
    ran: list[str] = []
    stub_parts(monkeypatch, ran, {"bleu": KeyboardInterrupt()})
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--out", str(out), "--device", "cpu", "--data", str(tmp_path / "none")])
    got, logged, _ = written(out)
    assert ran == ["environment", "tests", "replay", "bleu"] and got["gpu check (stopped)"][2] == "FAIL: KeyboardInterrupt"
    assert got["base model"][2].startswith("skipped: no base-de-en") and "part 0" in got  # (the rows before the stop)
    assert logged[-1]["check"] == "gpu check (stopped)"


def test_the_data_folder_defaults_to_the_checkouts_data_gpu(monkeypatch, tmp_path):
    """A GPU machine without ``../shared``: ``data-gpu/`` copied into the checkout is found from any
    working directory; elsewhere ``--data`` names it."""
    from benchmarks import gpu_check

    monkeypatch.setattr(gpu_check, "SHARED", tmp_path / "no-shared")
    monkeypatch.chdir(tmp_path)
    assert gpu_check.parse_args(["--out", "o"]).data == str(gpu_check.ROOT / "data-gpu")
    assert gpu_check.parse_args(["--out", "o", "--data", "/x/data-gpu"]).data == "/x/data-gpu"


@pytest.mark.slow
def test_the_dry_run_writes_the_two_files_and_the_table(tmp_path, capsys):
    shared_path("multi30k", "test_2016_flickr.de")
    out = tmp_path / "out"
    main(["--out", str(out), "--device", "cpu", "--data", str(shared_path())])
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.tar.gz", "summary.md"]
    text = (out / "summary.md").read_text()
    assert len(text.encode()) < SUMMARY_LIMIT and capsys.readouterr().out.rstrip().endswith(text.rstrip())
    got = {r[0]: r for r in table(text)}
    assert not [r for r in got.values() if r[2].startswith("FAIL")], text
    measured = [r for r in got.values() if r[1] != "-"]
    assert len(measured) >= 8 and all(r[1:3] == [NOT_MEASURED, "ran (dry run)"] for r in measured), text
    for prefix in ("gpu tests", "graph replay = eager", "bf16 vs fp32 BLEU", "translation on", "translate job",
                   "tokens/s, demo"):
        assert any(name.startswith(prefix) for name in got), (prefix, text)
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        names = tar.getnames()
        logged = json.load(tar.extractfile("gpu_check/rows.json"))
    assert {"gpu_check/summary.md", "gpu_check/tests-0.log", "gpu_check/replay.log",
            "gpu_check/bench.log"} <= set(names)
    replays = [r for r in logged if r["check"].startswith("graph replay")]
    assert len(replays) == 3 and all(r["result"] == "pass" for r in replays)  # (eager = eager here: no graphs)
