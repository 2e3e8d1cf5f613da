"""The ``raymt`` command: one entry point for the jobs.

    raymt translate --model DIR --input IN --output OUT [...]   # = python -m raymt.jobs.translate
    raymt autoscale --min-decoders 1 --max-decoders 16 ...      # translate on an autoscaling decoder pool
    raymt distill ...                                           # = python -m raymt.jobs.distill
    raymt report OUT                                            # = python -m raymt.jobs.report
    raymt build-shortlist ...                                   # = python -m raymt.jobs.build_shortlist
    raymt info [--model DIR]                                    # what a job would run with here (raymt.jobs.info)

``ray job submit`` runs ``python -m raymt.jobs.translate`` (or ``raymt translate``) the same way.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {  # command -> (module, what it does)
    "translate": ("raymt.jobs.translate", "translate a corpus (local path or s3://) on Ray, exactly once"),
    "autoscale": ("raymt.jobs.translate", "translate on an autoscaling decoder pool (--min/--max-decoders)"),
    "distill": ("raymt.jobs.distill", "distillation data: n-best translations with scores"),
    "report": ("raymt.jobs.report", "the stats report (PNG + HTML) of a job's output"),
    "build-shortlist": ("raymt.jobs.build_shortlist", "a lexical shortlist (lex.s2t) for a model"),
    "info": ("raymt.jobs.info", "what a job would run with here: device, ISA, kernels, threads, a model's search"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return "usage: raymt <command> [options]   (raymt <command> --help)\n\ncommands:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    if argv[0] in ("-V", "--version"):
        from raymt import __version__
        print(f"raymt {__version__}")
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        raise SystemExit(f"error: unknown command {command!r}\n{usage()}")
    if command == "autoscale" and not any(a.startswith("--max-decoders") for a in rest) \
            and not any(a in ("-h", "--help") for a in rest):
        raise SystemExit("error: raymt autoscale needs --max-decoders N (and --min-decoders M, default 1)")
    if command == "autoscale" and not any(a.startswith("--min-decoders") for a in rest):
        rest = ["--min-decoders", "1", *rest]
    module = importlib.import_module(COMMANDS[command][0])
    sys.argv = [f"raymt {command}", *rest]
    module.main(rest)


if __name__ == "__main__":
    main()
