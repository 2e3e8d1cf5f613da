"""Translate a corpus with a Marian / OPUS-MT checkpoint.

    python -m jobs.translate --model models/demo-de-en --input examples/sample.de.txt --output out.en.txt

``--input``: ``.txt`` (one sentence a line) or ``.parquet`` (column ``text``, optional ``id``).
``--output``: ``.txt`` (one translation a line, input order) or ``.parquet`` (id, source,
translation, score, n-best, signature). Paths may be local or fsspec URLs (``s3://``).
"""
from __future__ import annotations

import argparse
import logging
import time

from pipeline.corpus import read_corpus, write_translations
from pipeline.shortlists import load_shortlist
from pipeline.storage import model_reader
from workers.config import PruningConfig, SearchConfig
from workers.scheduler import CapacityUnit, Policy, SchedulerConfig
from workers.translator import Translator


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint directory or fsspec URL")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--nbest", type=int, default=1, help="hypotheses kept per sentence (<= beam size)")
    p.add_argument("--length-penalty", type=float, default=1.0)
    p.add_argument("--max-length", type=int, default=256, help="absolute cap on generated tokens")
    p.add_argument("--max-length-a", type=float, default=1.5, help="per-sentence cap a * source_length + b")
    p.add_argument("--max-length-b", type=int, default=10)
    p.add_argument("--max-batch-size", type=int, default=32, help="sentences per decoding batch")
    g = p.add_argument_group("beam pruning (Freitag & Al-Onaizan 2017; Yang et al. 2020); all off by default")
    g.add_argument("--rp", type=float, help="relative threshold: drop p(cand) <= rp * p(best)")
    g.add_argument("--ap", type=float, help="absolute threshold: drop log p(cand) <= log p(best) - ap")
    g.add_argument("--rpl", type=float, help="relative local threshold on the last word's probability")
    g.add_argument("--mc", type=int, help="max candidates per node (same history)")
    g.add_argument("--delta", type=float, help="absolute threshold against the best candidate, finished ones included")
    g.add_argument("--early-stop", action="store_true", help="drop beams below the best finished hypothesis")
    g = p.add_argument_group("batching (Yang et al. 2020 VAR-STREAM; top-up batching)")
    g.add_argument("--batching", choices=["batch", *[x.value for x in Policy]], default="batch",
                   help="batch: length-sorted batches decoded to the end; otherwise the streaming decoder")
    g.add_argument("--epsilon", type=float, default=1 / 6, help="var-stream refill threshold")
    g.add_argument("--refill-threshold", type=float, default=0.5, help="topup: refill once this share is empty")
    g.add_argument("--capacity", type=int, default=0, help="streaming capacity (0: --max-batch-size sentences)")
    g.add_argument("--capacity-unit", choices=[x.value for x in CapacityUnit], default="sentences")
    g.add_argument("--flush-every", type=int, default=0, help="var-stream: expand all sentences every N steps")
    g = p.add_argument_group("shortlist vocabulary (Shi & Knight 2017); see jobs.build_shortlist")
    g.add_argument("--shortlist", help="lex.s2t (with its .freq) or CTranslate2 .vmap file")
    g.add_argument("--shortlist-m", type=int, default=50, help="top translations kept per source token")
    g.add_argument("--shortlist-n", type=int, default=100, help="most frequent target tokens always kept")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch default)")
    return p


def search_config(args: argparse.Namespace) -> SearchConfig:
    pruning = PruningConfig(rp=args.rp, ap=args.ap, rpl=args.rpl, mc=args.mc, delta=args.delta,
                            early_stop=args.early_stop)
    return SearchConfig(beam_size=args.beam_size, num_hypotheses=args.nbest, length_penalty=args.length_penalty,
                        max_decoding_length=args.max_length, max_length_a=args.max_length_a,
                        max_length_b=args.max_length_b, pruning=pruning)


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig | None:
    if args.batching == "batch":
        return None
    return SchedulerConfig(policy=Policy(args.batching), max_batch_sentences=args.max_batch_size,
                           capacity=args.capacity or args.max_batch_size, capacity_unit=CapacityUnit(args.capacity_unit),
                           beam_size=args.beam_size, epsilon=args.epsilon, refill_threshold=args.refill_threshold,
                           flush_every=args.flush_every)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = search_config(args)
    corpus = read_corpus(args.input)
    translator = Translator.load(model_reader(args.model), threads=args.threads or None,
                                 max_batch_size=args.max_batch_size)
    shortlist = None
    if args.shortlist:
        shortlist = load_shortlist(args.shortlist, translator.checkpoint.tokenizer, top_m=args.shortlist_m,
                                   top_n=args.shortlist_n, special_ids=translator.special_target_ids())
    start = time.perf_counter()
    batching = scheduler_config(args)
    translations = translator.translate(corpus.texts, cfg, shortlist, batching)
    elapsed = time.perf_counter() - start
    signature = f"model:{args.model}|{cfg.signature()}|batching:{args.batching}" + (
        f"|shortlist:{args.shortlist}:{args.shortlist_m}:{args.shortlist_n}" if args.shortlist else "")
    write_translations(args.output, corpus, translations, signature)
    tokens = translator.stats.target_tokens
    print(f"translated {len(corpus.texts)} lines -> {args.output} in {elapsed:.1f}s "
          f"({tokens / max(elapsed, 1e-9):.0f} target tokens/s) [{signature}]")
    if translator.shortlist_sizes:
        sizes = translator.shortlist_sizes
        print(f"shortlist: {sum(sizes) / len(sizes):.0f} candidates per batch on average (max {max(sizes)})")


if __name__ == "__main__":
    main()
