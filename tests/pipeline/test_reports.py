"""Benchmark reports name when and where they were measured."""
from __future__ import annotations

import datetime
import json

import torch

from benchmarks.reports import machine, write_report


def test_machine_names_the_date_cpu_isa_and_versions():
    m = machine()
    assert m["date"].startswith(datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-"))
    assert m["isa"] == torch.backends.cpu.get_cpu_capability()
    assert m["cpu"] and m["cores"] >= 1
    assert m["versions"]["torch"].startswith(torch.__version__.split("+")[0])
    assert m["gpu"] is None or isinstance(m["gpu"], str)


def test_write_report_puts_the_machine_under_the_title_and_in_the_json(tmp_path):
    out = str(tmp_path / "sub" / "bench")
    write_report(out, {"tables": {}}, ["# A benchmark", "", "| a |", "|---|", "| 1 |"], echo=False)
    md = (tmp_path / "sub" / "bench.md").read_text(encoding="utf-8").splitlines()
    report = json.loads((tmp_path / "sub" / "bench.json").read_text(encoding="utf-8"))
    assert md[0] == "# A benchmark" and md[1] == ""
    assert md[2].startswith(f"Measured {report['machine']['date']} on {report['machine']['cpu']} "
                            f"({report['machine']['isa']}, ")
    assert md[3:] == ["", "| a |", "|---|", "| 1 |"]
    assert report["tables"] == {}


def test_a_report_rewritten_keeps_its_first_machine_record(tmp_path):
    report = {"tables": {}}
    write_report(str(tmp_path / "r"), report, ["# R"], echo=False)
    first = report["machine"]
    report["tables"]["t"] = 1
    write_report(str(tmp_path / "r"), report, ["# R", "", "more"], echo=False)
    assert json.loads((tmp_path / "r.json").read_text())["machine"] == first
