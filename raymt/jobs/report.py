"""The stats report of a finished (or partly finished) translate job: PNG + single-page HTML.

    python -m raymt.jobs.report out/corpus-de-en                  # -> out/corpus-de-en.report.{png,html}
    python -m raymt.jobs.report s3://bucket/out --out report      # -> report.{png,html}

Reads the per-unit stats rows the decoder actors committed under ``<output>/_stats``.
"""
from __future__ import annotations

import argparse

from raymt.pipeline.extras import MissingExtra, require
from raymt.pipeline.outputs.sink import OutputStore
from raymt.pipeline.reports.stats_plots import render, summary


def report(output: str, out: str | None = None, title: str | None = None) -> tuple[str, str]:
    require("matplotlib", "plots", "the stats report")  # before any reading
    stats = OutputStore(output).read_stats()
    if stats is None:
        raise SystemExit(f"error: no stats under {output}/_stats (has any unit been committed?)")
    if out is None:
        if "://" in output and not output.startswith("file://"):
            raise SystemExit("error: --out is needed for a remote output")
        out = output.rstrip("/").removesuffix(".parts") + ".report"
    rows = stats.to_pylist()
    paths = render(rows, out, title or f"Translation job: {output}")
    print(f"report: {paths[0]}, {paths[1]}  {summary(rows)}")
    return paths


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output", help="the job's --output (local path or s3://)")
    p.add_argument("--out", help="report path without extension (default: <output>.report)")
    p.add_argument("--title")
    args = p.parse_args(argv)
    try:
        report(args.output, args.out, args.title)
    except MissingExtra as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
