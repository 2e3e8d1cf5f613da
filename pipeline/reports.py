"""Shared pieces of the benchmark jobs: evaluation sets, reading them, Markdown tables, report files."""
from __future__ import annotations

import json
import os

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


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def write_report(out: str, report: dict, markdown: list[str], echo: bool = True) -> None:
    """``<out>.json`` and ``<out>.md``; the Markdown is printed too (``echo``)."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write("\n".join(markdown) + "\n")
    if echo:
        print("\n".join(markdown))
