"""Search benchmark: Freitag Table 1 (beam pruning) and Shi & Knight Table 2 (shortlists) on our model.

    python -m benchmarks.bench_search --model models/demo-de-en --out docs/results/search   # full (slow)
    python -m benchmarks.bench_search --lines 100 --beams 5 --train-lines 2000 --self-built-lines 200 --out /tmp/smoke

Inputs: Multi30k test_2016_flickr and WMT22 de-en (from ../shared/data). Writes ``<out>.md`` and
``<out>.json``; every speed figure is a ratio against the exact system of the same run.
"""
from __future__ import annotations

import argparse
import logging
import os
import platform

import torch

from raymt.pipeline.decoders.alignment import frequency_table, lexical_table
from benchmarks.search_variants import (
    SystemRun,
    freitag_rows,
    output_layer_rows,
    pruning_systems,
    run_interleaved,
    shortlist_rows,
)
from benchmarks.reports import SETS, read_lines, write_report
from raymt.pipeline.reports.stats_tables import markdown_table
from raymt.workers.config import PruningConfig, SearchConfig
from raymt.workers.search.shortlist import Shortlist
from raymt.workers.decoder.core_decoder import CoreDecoder


def heuristics(args: argparse.Namespace) -> dict[str, PruningConfig]:
    return {f"rp {args.rp}": PruningConfig(rp=args.rp), f"ap {args.ap}": PruningConfig(ap=args.ap),
            f"rpl {args.rpl}": PruningConfig(rpl=args.rpl), f"mc {args.mc}": PruningConfig(mc=args.mc),
            f"delta {args.delta}": PruningConfig(delta=args.delta), "early stop": PruningConfig(early_stop=True),
            "rp+ap+rpl+mc": PruningConfig(rp=args.rp, ap=args.ap, rpl=args.rpl, mc=args.mc)}


def shortlist_systems(translator: CoreDecoder, args: argparse.Namespace, base: SearchConfig) -> list[SystemRun]:
    tok = translator.checkpoint.tokenizer
    special = translator.special_target_ids()
    train_src = read_lines(os.path.join(args.data, "multi30k/train.de"), args.train_lines)
    train_tgt = read_lines(os.path.join(args.data, "multi30k/train.en"), args.train_lines)
    tf = frequency_table(tok, train_tgt)
    wa = lexical_table(tok, train_src, train_tgt, space="subword")
    wa_word = lexical_table(tok, train_src, train_tgt, space="word")
    # self-built: only the model and German text (source side of train, its English never read)
    mono = read_lines(os.path.join(args.data, "multi30k/train.de"))[-args.self_built_lines:]
    own = lexical_table(tok, mono, [t.text for t in translator.translate(mono, base)], space="subword")
    systems = [SystemRun("full vocabulary", base)]
    systems += [SystemRun(f"TF {n}", base, Shortlist(tf, top_m=0, top_n=n, special_ids=special)) for n in (1000, 2000)]
    systems += [SystemRun(f"WA M={m} N={args.top_n}", base, Shortlist(wa, top_m=m, top_n=args.top_n, special_ids=special))
                for m in (10, 50, 250)]
    systems.append(SystemRun(f"WA word-space M=50 N={args.top_n}", base,
                             Shortlist(wa_word, top_m=50, top_n=args.top_n, special_ids=special)))
    systems.append(SystemRun(f"self-built M=50 N={args.top_n}", base,
                             Shortlist(own, top_m=50, top_n=args.top_n, special_ids=special)))
    return systems


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/demo-de-en")
    p.add_argument("--data", default="../shared/data")
    p.add_argument("--sets", default="multi30k,wmt22")
    p.add_argument("--lines", type=int, default=0, help="first N lines of each set (0: all)")
    p.add_argument("--beams", default="5,14")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rp", type=float, default=0.6)
    p.add_argument("--ap", type=float, default=2.5)
    p.add_argument("--rpl", type=float, default=0.02)
    p.add_argument("--mc", type=int, default=3)
    p.add_argument("--delta", type=float, default=1.5)
    p.add_argument("--top-n", type=int, default=100, help="frequent targets added to WA / self-built shortlists")
    p.add_argument("--train-lines", type=int, default=0, help="Multi30k train lines for the WA tables (0: all)")
    p.add_argument("--self-built-lines", type=int, default=5000,
                   help="German lines (end of Multi30k train.de) the model translates for the self-built table")
    p.add_argument("--tables", default="output,pruning,shortlist")
    p.add_argument("--out", default="docs/results/search")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    translator = CoreDecoder.load(args.model, threads=args.threads)
    base = SearchConfig(beam_size=5, max_length_a=1.5, max_length_b=10)
    report = {"model": args.model, "threads": args.threads, "repeats": args.repeats, "cpu": platform.processor(),
              "torch": torch.__version__, "search": base.signature(), "tables": {}}
    md = [f"# Search benchmark\n\nmodel `{args.model}`, {args.threads} threads, median of {args.repeats} "
          f"interleaved runs; speed-ups are ratios within one run.\n"]
    if "output" in args.tables:
        rows = output_layer_rows(translator)
        report["tables"]["output_layer"] = rows
        md += ["## Fused output layer: logsumexp + top-k vs log_softmax -> top-k (projection included)\n",
               markdown_table(rows), ""]
    shortlists = shortlist_systems(translator, args, base) if "shortlist" in args.tables else []
    for name in args.sets.split(","):
        sources = read_lines(os.path.join(args.data, SETS[name][0]), args.lines)
        refs = read_lines(os.path.join(args.data, SETS[name][1]), args.lines)
        if "pruning" in args.tables:
            for beam in map(int, args.beams.split(",")):
                systems = pruning_systems(beam, heuristics(args), base)
                run_interleaved(translator, sources, systems, args.repeats)
                rows = freitag_rows(systems, refs)
                report["tables"][f"{name}/pruning/beam{beam}"] = rows
                md += [f"## {name}: beam pruning, beam {beam} (Freitag & Al-Onaizan Table 1)\n", markdown_table(rows), ""]
        if shortlists:
            for s in shortlists:
                s.seconds.clear()
            run_interleaved(translator, sources, shortlists, args.repeats)
            tok = translator.checkpoint.tokenizer
            rows = shortlist_rows(shortlists, refs, translator.encode(sources), [tok.encode_target(r) for r in refs])
            report["tables"][f"{name}/shortlist"] = rows
            md += [f"## {name}: shortlist vocabulary, beam 5 (Shi & Knight Table 2)\n", markdown_table(rows), ""]
    write_report(args.out, report, md)


if __name__ == "__main__":
    main()
