"""Batching benchmark: VAR-STREAM paper Tables 1/4 and the top-up paper's comparison, on our model.

    python -m benchmarks.bench_batching --lines 400 --beams 5,50 --wide-beam-lines 100 \
        --out docs/results/batching-wmt22-400                                           # full (~15 min, 2 cores)
    python -m benchmarks.bench_batching --lines 48 --beams 4 --repeats 1 --out /tmp/batching      # smoke

Input: WMT22 de-en (long-tailed lengths), sorted by length (bucketed, as the paper does) and
shuffled. Systems per beam k (default k=5 and k=50): GREEDY, FIXED (exact beam), VAR-BATCH,
VAR-STREAM, VAR-STR-FIFO (pruning delta/M as the paper: 1.5 / 5) -> BLEU, wall-clock ratio vs
FIXED, timesteps, candidate expansions, expansions per step, and a line with the paper's headline
ratios (VAR-STREAM vs VAR-BATCH and vs FIXED, BLEU difference). Beams >= 20 run on the first
``--wide-beam-lines`` lines only (exact k=50 costs ~10x k=5); table titles give the line count.
Top-up table (first beam, all lines): mini-batch (input order), maxi-batch (length-sorted batches)
and top-up streaming, exact beam. Interleaved repetitions, median times.
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import time
from dataclasses import dataclass, field, replace

import sacrebleu

from benchmarks.reports import SETS, read_lines, write_report
from raymt.pipeline.reports.stats_tables import markdown_table
from raymt.workers.config import PruningConfig, SearchConfig
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.engine import DecodeStats
from raymt.workers.decoder.scheduler import CapacityUnit, Policy, SchedulerConfig
from raymt.workers.search.shortlist import Shortlist
from raymt.workers.decoder.core_decoder import CoreDecoder


@dataclass
class Run:
    name: str
    cfg: SearchConfig
    batching: SchedulerConfig | None
    sort: bool = True
    shortlist: Shortlist | None = None
    seconds: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)
    timesteps: int = 0
    batch_sizes: list[int] = field(default_factory=list)


def run_all(translator: CoreDecoder, sources: list[str], runs: list[Run], repeats: int) -> None:
    ids = translator.encode(sources)
    tok = translator.checkpoint.tokenizer
    for _ in range(repeats):
        for r in runs:
            translator.sort_by_length, st = r.sort, DecodeStats()
            batch = translator.max_batch_size
            if r.batching is None and not r.sort:  # mini-batch in input order
                order = list(range(len(ids)))
                start, hyps = time.perf_counter(), []
                for i in range(0, len(order), batch):
                    hyps += translator.decode_ids([ids[j] for j in order[i:i + batch]], DecodeRequest(r.cfg, r.shortlist),
                                                  stats=st).hypotheses
            else:
                start = time.perf_counter()
                hyps = translator.decode_ids(ids, DecodeRequest(r.cfg, r.shortlist, r.batching), stats=st).hypotheses
            r.seconds.append(time.perf_counter() - start)
            r.texts = [tok.decode(list(h[0].tokens)) for h in hyps]
            r.stats, r.timesteps = st, st.steps
            r.batch_sizes = st.scheduler.batch_sizes if r.batching is not None else []


def table(runs: list[Run], refs: list[str], baseline: str) -> list[dict]:
    base = next(r for r in runs if r.name == baseline)
    rows = []
    for r in runs:
        expansions = r.stats.row_steps
        rows.append({"system": r.name, "bleu": round(sacrebleu.corpus_bleu(r.texts, [refs]).score, 2),
                     "wall_ratio": round(statistics.median(r.seconds) / statistics.median(base.seconds), 3),
                     "timesteps": r.timesteps, "expansions": expansions,
                     "expansions_per_step": round(expansions / max(r.timesteps, 1), 1),
                     "median_s": round(statistics.median(r.seconds), 3)})
    return rows


def targets(rows: list[dict]) -> dict:
    """The headline ratios: VAR-STREAM speed-up over VAR-BATCH and FIXED, BLEU change vs FIXED."""
    by = {r["system"]: r for r in rows}
    stream = by["VAR-STREAM"]
    return {"var_stream_vs_var_batch": round(by["VAR-BATCH"]["median_s"] / stream["median_s"], 2),
            "var_stream_vs_fixed": round(by["FIXED"]["median_s"] / stream["median_s"], 2),
            "bleu_var_stream_minus_fixed": round(stream["bleu"] - by["FIXED"]["bleu"], 2)}


def systems(beam: int, n: int, epsilon: float, max_length: int) -> list[Run]:
    exact = SearchConfig(beam_size=beam, max_length_a=1.5, max_length_b=10, max_decoding_length=max_length)
    pruned = replace(exact, pruning=PruningConfig(delta=1.5, mc=min(5, beam)))
    sched = SchedulerConfig(max_batch_sentences=n, capacity=n, epsilon=epsilon)
    fifo = replace(sched, policy=Policy.FIFO, capacity=n * beam, capacity_unit=CapacityUnit.BEAMS)
    return [Run("GREEDY", replace(exact, beam_size=1), None), Run("FIXED", exact, None),
            Run("VAR-BATCH", pruned, replace(sched, policy=Policy.VAR_BATCH)),
            Run("VAR-STREAM", pruned, replace(sched, policy=Policy.VAR_STREAM)),
            Run("VAR-STR-FIFO", pruned, fifo)]


def topup_systems(beam: int, n: int, max_length: int) -> list[Run]:
    """The top-up paper's comparison, exact beam: mini-batch (input order), maxi-batch (length-sorted
    batches), top-up streaming, and top-up over sorted input."""
    exact = SearchConfig(beam_size=beam, max_length_a=1.5, max_length_b=10, max_decoding_length=max_length)
    topup = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=n, capacity=n)
    return [Run("mini-batch", exact, None, sort=False), Run("maxi-batch", exact, None, sort=True),
            Run("top-up", exact, topup, sort=False), Run("top-up + maxi-batch", exact, topup, sort=True)]


def topup_table(runs: list[Run], refs: list[str]) -> list[dict]:
    rows = table(runs, refs, "mini-batch")
    for row, r in zip(rows, runs):
        row["batch_size_histogram"] = dict(sorted({b: r.batch_sizes.count(b) for b in set(r.batch_sizes)}.items()))
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/demo-de-en")
    p.add_argument("--data", default="../shared/data")
    p.add_argument("--lines", type=int, default=0)
    p.add_argument("--beams", default="5,50", help="comma-separated beam sizes (default: k=5 and k=50)")
    p.add_argument("--wide-beam-lines", type=int, default=100,
                   help="beams >= 20 decode only the first N of the lines (0: all); exact k=50 is slow")
    p.add_argument("--batch-sentences", type=int, default=32)
    p.add_argument("--epsilon", type=float, default=1 / 6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-length", type=int, default=256, help="absolute cap on generated tokens")
    p.add_argument("--out", default="docs/results/batching")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    translator = CoreDecoder.load(args.model, threads=args.threads, max_batch_size=args.batch_sentences)
    sources = read_lines(os.path.join(args.data, SETS["wmt22"][0]), args.lines)
    refs = read_lines(os.path.join(args.data, SETS["wmt22"][1]), args.lines)
    report = {"model": args.model, "threads": args.threads, "lines": len(sources), "tables": {}, "targets": {}}
    wide = min(args.wide_beam_lines or len(sources), len(sources))
    subset = f" (beams >= 20: first {wide})" if any(int(b) >= 20 for b in args.beams.split(",")) else ""
    md = [f"# Batching benchmark: WMT22 de-en, first {len(sources)} lines{subset}, {args.threads} threads, CPU\n"]
    shuffled = list(range(len(sources)))
    random.Random(1).shuffle(shuffled)
    for order_name, order in (("sorted", None), ("shuffled", shuffled)):
        src = sources if order is None else [sources[i] for i in order]
        ref = refs if order is None else [refs[i] for i in order]
        for beam in map(int, args.beams.split(",")):
            lines = min(args.wide_beam_lines, len(src)) if beam >= 20 and args.wide_beam_lines else len(src)
            runs = systems(beam, args.batch_sentences, args.epsilon, args.max_length)
            for r in runs:
                r.sort = order is None
            run_all(translator, src[:lines], runs, args.repeats)
            rows = table(runs, ref[:lines], "FIXED")
            goals = targets(rows)
            report["tables"][f"{order_name}/beam{beam}"] = rows
            report["targets"][f"{order_name}/beam{beam}"] = {"lines": lines, **goals}
            md += [f"## WMT22 {order_name}, k={beam}, {lines} lines (VAR-STREAM Table 1 / 4 shape)\n",
                   markdown_table(rows), "",
                   f"VAR-STREAM is {goals['var_stream_vs_var_batch']}x VAR-BATCH and {goals['var_stream_vs_fixed']}x "
                   f"FIXED; BLEU VAR-STREAM - FIXED = {goals['bleu_var_stream_minus_fixed']}.", ""]
    beam = int(args.beams.split(",")[0])
    runs = topup_systems(beam, args.batch_sentences, args.max_length)
    run_all(translator, sources, runs, args.repeats)
    rows = topup_table(runs, refs)
    report["tables"]["topup"] = rows
    md += [f"## Top-up batching, k={beam}, {len(sources)} lines (mini-batch vs maxi-batch vs top-up)\n",
           markdown_table(rows), ""]
    write_report(args.out, report, md)


if __name__ == "__main__":
    main()
