"""Closed-loop batch size vs hand-tuned batch sizes: same model, input, beam and threads.

    python -m benchmarks.bench_tuning --set multi30k --sizes 8,16,32,64,128 --start 32 --rounds 3 \\
        --out docs/results/tuning-multi30k                                                # full (slow)
    python -m benchmarks.bench_tuning --lines 40 --sizes 4,8 --rounds 1 --out /tmp/t  # smoke

Each round runs every hand-set ``--max-batch-size`` and the tuned run (a fresh tuner starting at
``--start``, so its exploration is paid inside the timing, as a new decoder actor pays it) over
the same length-sorted lines; systems alternate within a round. Reports target tokens/s (median
over rounds), tuned ÷ best hand-tuned, the size the tuner settled on, and BLEU of each.
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

import sacrebleu

from benchmarks.reports import SETS, read_lines, write_report
from raymt.pipeline.reports.stats_tables import markdown_table
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.core_decoder import CoreDecoder
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.tuning import TunerConfig


def timed(translator: CoreDecoder, ids: list[list[int]], cfg: SearchConfig) -> tuple[float, int, list]:
    start = time.perf_counter()
    decoded = translator.decode_ids(ids, DecodeRequest(cfg))
    return time.perf_counter() - start, decoded.stats.target_tokens, decoded.hypotheses


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/demo-de-en")
    p.add_argument("--data", default="../shared/data")
    p.add_argument("--set", default="wmt22", choices=sorted(SETS))
    p.add_argument("--lines", type=int, default=0, help="first N lines (0: all)")
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sizes", default="8,16,32,64,128", help="hand-set batch sizes")
    p.add_argument("--start", type=int, default=8, help="the tuner's first batch size")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="docs/results/tuning-wmt22")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    src_path, ref_path = (os.path.join(args.data, x) for x in SETS[args.set])
    sources, refs = read_lines(src_path, args.lines), read_lines(ref_path, args.lines)
    cfg = SearchConfig(beam_size=args.beam_size, max_length_a=1.5, max_length_b=10)
    translator = CoreDecoder.load(args.model, threads=args.threads)
    tok = translator.checkpoint.tokenizer
    ids = translator.encode(sources)
    sizes = [int(s) for s in args.sizes.split(",")]
    names = [f"batch {s}" for s in sizes] + ["tuned"]
    rates: dict[str, list[float]] = {n: [] for n in names}
    bleu: dict[str, float] = {}
    settled: list[int] = []
    for _ in range(args.rounds):  # A B C .. T, A B C .. T: drift hits every system alike
        for name in names:
            if name == "tuned":
                translator.tune_batches(cfg, TunerConfig(start=args.start))
            else:
                translator.tuner, translator.max_batch_size = None, int(name.split()[1])
            seconds, tokens, hyps = timed(translator, ids, cfg)
            rates[name].append(tokens / seconds)
            bleu[name] = round(sacrebleu.corpus_bleu([tok.decode(list(h[0].tokens)) for h in hyps], [refs]).score, 2)
            if name == "tuned":
                settled.append(translator.tuner.size)
    rows = [{"system": n, "tokens_per_s": round(statistics.median(rates[n]), 1),
             "spread": f"{min(rates[n]):.0f}-{max(rates[n]):.0f}", "bleu": bleu[n]} for n in names]
    best = max((r for r in rows if r["system"] != "tuned"), key=lambda r: r["tokens_per_s"])
    tuned = rows[-1]
    ratio = round(tuned["tokens_per_s"] / best["tokens_per_s"], 3)
    report = {"set": args.set, "lines": len(sources), "beam": args.beam_size, "threads": args.threads,
              "rows": rows, "best_hand_tuned": best["system"], "tuned_over_best": ratio, "tuned_sizes": settled}
    md = [f"# Closed-loop batch size: {args.set}, {len(sources)} lines, beam {args.beam_size}, {args.threads} threads",
          "", f"{args.rounds} interleaved rounds, median tokens/s; each tuned run starts a fresh tuner at "
          f"{args.start} (exploration included).", "", markdown_table(rows), "",
          f"**tuned ÷ best hand-tuned ({best['system']}) = {ratio}**; sizes the tuner settled on: {settled}"]
    write_report(args.out, report, md)
    return report


if __name__ == "__main__":
    main()
