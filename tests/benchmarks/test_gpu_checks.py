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
