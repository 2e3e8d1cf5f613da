"""Shared pieces of the benchmarks: evaluation sets, reading them, Markdown tables, report files.

Every report names when and where it was measured: ``machine()`` (date, CPU model and ISA, cores,
GPU, versions) goes into its JSON and, as one line under the title, into its Markdown."""
from __future__ import annotations

import datetime
import json
import os
import platform
from importlib import metadata

# name -> (source, reference) under the shared data folder
SETS = {"multi30k": ("multi30k/test_2016_flickr.de", "multi30k/test_2016_flickr.en"),
        "wmt22": ("wmt22/generaltest2022.de-en.src.de", "wmt22/generaltest2022.de-en.ref.A.en")}


def read_lines(path: str, limit: int = 0) -> list[str]:
    """One sentence a line; the first ``limit`` lines when ``limit`` > 0."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines[:limit] if limit else lines


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """Where and when a benchmark ran: UTC date, CPU model, the ISA ATen dispatches to, cores, GPU, versions."""
    import torch

    versions = {}
    for package in ("torch", "ray", "ctranslate2", "transformers", "triton"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": cpu_model(), "isa": torch.backends.cpu.get_cpu_capability(), "cores": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "python": platform.python_version(), "versions": versions}


def machine_line(m: dict) -> str:
    gpu = f", GPU {m['gpu']}" if m["gpu"] else ""
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    return f"Measured {m['date']} on {m['cpu']} ({m['isa']}, {m['cores']} cores){gpu}; Python {m['python']}, {versions}."


def write_report(out: str, report: dict, markdown: list[str], echo: bool = True) -> None:
    """``<out>.json`` and ``<out>.md``, each naming the machine (``machine()``); the Markdown is
    printed too (``echo``)."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    where = report.setdefault("machine", machine())
    if markdown and markdown[0].startswith("# "):  # the line under the title
        markdown = [markdown[0], "", machine_line(where), *markdown[1:]]
    else:
        markdown = [machine_line(where), "", *markdown]
    with open(out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write("\n".join(markdown) + "\n")
    if echo:
        print("\n".join(markdown))
