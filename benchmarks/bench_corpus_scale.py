"""The driver-side cost of a large corpus: planning a text file, reading one unit, assembling one file.

    python -m benchmarks.bench_corpus_scale --lines 2000000 --parts 200 --rows 5000

Builds a text corpus of ``--lines`` lines from the WMT22 source (``../shared/data``), plans it into
2,500-row units and reads the middle unit, then commits ``--parts`` synthetic parts of ``--rows``
rows and assembles them into one ``.txt`` file. Prints seconds and peak memory of each step (Python
heap by tracemalloc; Arrow's pool for the assembly; the process's max RSS at the end). Run it at
another commit to compare.
"""
from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
import tracemalloc
from pathlib import Path

import pyarrow as pa

from raymt.pipeline.outputs.sink import OUTPUT_SCHEMA, OutputStore, assemble
from raymt.pipeline.orchestration.units import Columns, plan_units, read_unit

SHARED_DATA = Path(os.environ.get("RAYMT_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
WMT22 = SHARED_DATA / "wmt22" / "generaltest2022.de-en.src.de"


def timed(step, *args):
    tracemalloc.start()
    start = time.perf_counter()
    value = step(*args)
    seconds, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return value, seconds, peak / 1e6


def part(first: int, rows: int) -> pa.Table:
    text = "A sentence from a corpus that is fairly long and goes on. " * 2
    ids = range(first, first + rows)
    return pa.table({"id": [str(r) for r in ids], "row": pa.array(ids, pa.int64()),
                     "source": ["Ein Satz aus einem Korpus, der recht lang ist und weiter geht. " * 2] * rows,
                     "translation": [text] * rows, "score": [0.0] * rows,
                     "nbest": pa.array([[{"text": text, "score": -1.0}] * 3] * rows, OUTPUT_SCHEMA.field("nbest").type),
                     "status": ["ok"] * rows, "reason": [""] * rows, "signature": ["sig"] * rows})


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=2_000_000)
    p.add_argument("--parts", type=int, default=200)
    p.add_argument("--rows", type=int, default=5000)
    args = p.parse_args(argv)
    lines = WMT22.read_bytes().split(b"\n")[:-1]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.de"
        with open(corpus, "wb") as f:
            for i in range(0, args.lines, len(lines)):
                f.write(b"\n".join(lines[: args.lines - i]) + b"\n")
        plan, plan_s, plan_mb = timed(plan_units, str(corpus), Columns(), 2500)
        _, read_s, read_mb = timed(read_unit, plan.units[len(plan.units) // 2], Columns())
        print(f"text corpus {corpus.stat().st_size / 1e6:.0f} MB, {plan.rows} lines, {len(plan.units)} units: "
              f"plan {plan_s:.2f} s ({plan_mb:.0f} MB), one unit read {read_s * 1e3:.1f} ms ({read_mb:.1f} MB)")
        store = OutputStore(str(Path(tmp) / "out"))
        for k in range(args.parts):
            store.commit(f"00000-{k * args.rows:010d}", part(k * args.rows, args.rows), None, {})
        before = pa.default_memory_pool().max_memory()
        _, assemble_s, _ = timed(assemble, store, str(Path(tmp) / "all.txt"))
        print(f"assembled {args.parts * args.rows} rows into one .txt in {assemble_s:.2f} s; Arrow pool peak "
              f"{pa.default_memory_pool().max_memory() / 1e6:.0f} MB (before: {before / 1e6:.0f} MB); "
              f"process max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB")
        assembled = (Path(tmp) / "all.txt").read_bytes().count(b"\n")
    return {"rows": plan.rows, "units": len(plan.units), "plan_mb": plan_mb, "read_mb": read_mb, "assembled": assembled}


if __name__ == "__main__":
    main()
