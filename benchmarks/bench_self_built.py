"""Self-built shortlists: what the monolingual sample size costs in BLEU (guidance for
``raymt.jobs.build_shortlist --self-built --sample N``).

    python -m benchmarks.bench_self_built --sizes 1000,2000,5000,10000,29000 --out docs/results/self-built-multi30k
    python -m benchmarks.bench_self_built --sizes 20,40 --test-lines 16 --out /tmp/smoke          # smoke

The model translates one seeded random sample of Multi30k train.de (its English is never read), the
largest asked for, at the build's beam (5); each smaller size is a prefix of it, so every table
comes from the same translations. Each table, as a shortlist with the product's defaults
(``--shortlist-m 10 --shortlist-n 100``), then decodes test2016 at beam 5; BLEU, reference-token
coverage and mean shortlist size are reported beside the full vocabulary and the bitext-aligned
(WA) table. Quality only: speed ratios are ``benchmarks.bench_search``'s.
"""
from __future__ import annotations

import argparse
import os
import random

import sacrebleu
import torch

from raymt.pipeline.decoders.alignment import lexical_table
from benchmarks.search_variants import sentence_coverage
from benchmarks.reports import SETS, read_lines, write_report
from raymt.pipeline.reports.stats_tables import markdown_table
from raymt.workers.config import SearchConfig
from raymt.workers.search.shortlist import Shortlist
from raymt.workers.decoder.engine import DecodeStats
from raymt.workers.decoder.core_decoder import CoreDecoder


def evaluate(translator: CoreDecoder, sources: list[str], refs: list[str], cfg: SearchConfig,
             shortlist: Shortlist | None) -> dict:
    stats = DecodeStats()
    hyps = [t.text for t in translator.translate(sources, cfg, shortlist, stats=stats)]
    tok, sizes = translator.checkpoint.tokenizer, stats.shortlist_sizes
    cov = 1.0 if shortlist is None else sentence_coverage(shortlist, [tok.encode(s) for s in sources],
                                                           [tok.encode_target(r) for r in refs])
    return {"bleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2), "coverage": round(cov, 4),
            "mean_shortlist": round(sum(sizes) / len(sizes), 1) if sizes else None}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/demo-de-en")
    p.add_argument("--data", default="../shared/data")
    p.add_argument("--sizes", default="1000,2000,5000,10000,29000", help="monolingual sample sizes (lines)")
    p.add_argument("--test-lines", type=int, default=0, help="first N lines of test2016 (0: all)")
    p.add_argument("--top-m", type=int, default=10)
    p.add_argument("--top-n", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="docs/results/self-built-multi30k")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = sorted(int(x) for x in args.sizes.split(","))
    translator = CoreDecoder.load(args.model, threads=args.threads)
    tok, special = translator.checkpoint.tokenizer, translator.special_target_ids()
    cfg = SearchConfig(beam_size=5)
    mono = read_lines(os.path.join(args.data, "multi30k/train.de"))
    sample = random.Random(args.seed).sample(mono, min(sizes[-1], len(mono)))
    outputs = [t.text for t in translator.translate(sample, cfg)]
    src_path, ref_path = SETS["multi30k"]
    sources = read_lines(os.path.join(args.data, src_path), args.test_lines)
    refs = read_lines(os.path.join(args.data, ref_path), args.test_lines)
    rows = [{"system": "full vocabulary", "lines": None, **evaluate(translator, sources, refs, cfg, None)}]
    bitext = lexical_table(tok, mono, read_lines(os.path.join(args.data, "multi30k/train.en")), space="subword")
    rows.append({"system": f"WA (bitext) M={args.top_m}", "lines": len(mono),
                 **evaluate(translator, sources, refs, cfg,
                            Shortlist(bitext, top_m=args.top_m, top_n=args.top_n, special_ids=special))})
    for n in sizes:
        table = lexical_table(tok, sample[:n], outputs[:n], space="subword")
        rows.append({"system": f"self-built M={args.top_m}", "lines": min(n, len(sample)),
                     **evaluate(translator, sources, refs, cfg,
                                Shortlist(table, top_m=args.top_m, top_n=args.top_n, special_ids=special))})
    full = rows[0]["bleu"]
    for r in rows:
        r["bleu_cost"] = round(full - r["bleu"], 2)
    report = {"model": args.model, "threads": args.threads, "test_lines": len(sources), "rows": rows}
    markdown = [f"# Self-built shortlists by sample size, Multi30k test2016 ({len(sources)} lines), beam 5", "",
                f"model `{args.model}`; shortlist M={args.top_m} N={args.top_n}; samples: seeded random lines of "
                f"train.de translated by the model at beam 5 (prefixes of one sample).", "",
                f"Command: `python -m benchmarks.bench_self_built --sizes {args.sizes} --out {args.out}`", "",
                markdown_table(rows)]
    write_report(args.out, report, markdown)
    return report


if __name__ == "__main__":
    main()
