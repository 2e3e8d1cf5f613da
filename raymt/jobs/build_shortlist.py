"""Build a shortlist table (Shi & Knight 2017) for a model.

    # alignment-based, from a bitext (.txt one sentence a line, or .parquet column text)
    python -m raymt.jobs.build_shortlist --model models/demo-de-en --source train.de --target train.en --output lex.s2t
    # self-built: translate a monolingual sample with the full vocabulary, align source with output
    python -m raymt.jobs.build_shortlist --model models/demo-de-en --source mono.de --self-built --sample 5000 --output lex.s2t
    # top-frequency baseline only
    python -m raymt.jobs.build_shortlist --model models/demo-de-en --target train.en --frequency-only --output freq.s2t

``--output`` ending in ``.vmap`` writes a CTranslate2 vocabulary map, anything else Marian's
``lex.s2t`` (plus ``<output>.freq``, target pieces by frequency).

An M2M100 / NLLB model gets one table per target language, built from its own translations of
``--source`` into each ``--target-lang`` (aligned, or counted with ``--frequency-only``), written
into the directory ``--output`` as ``<code>.s2t`` (+ ``.freq``; ``--vmap``: ``<code>.vmap``); decode
with ``--shortlist <that directory>``:

    python -m raymt.jobs.build_shortlist --model models/nllb-200-distilled-600M --source mono.de \
        --source-lang deu_Latn --target-lang fra_Latn eng_Latn --frequency-only --output shortlists/
"""
from __future__ import annotations

import argparse
import logging
import random
import time

from raymt.pipeline.decoders.alignment import SPACES, frequency_table, lexical_table
from raymt.pipeline.inputs.corpus import read_corpus
from raymt.pipeline.extras import MissingExtra, require, require_for_url
from raymt.pipeline.hub import HubError
from raymt.pipeline.decoders.shortlist_files import VMAP_TOP_M, VMAP_TOP_N, save_language_tables, save_table
from raymt.pipeline.storage import model_reader
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.decode_config import DEFAULTS
from raymt.workers.text.lang_tokenizer import LanguageError, LanguageTokenizer
from raymt.workers.decoder.core_decoder import CoreDecoder
from raymt.workers.search.shortlist import MAX_PER_SOURCE


SELF_BUILT_SAMPLE = 10_000  # lines translated for a self-built table unless --sample says otherwise


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint directory, fsspec URL or hub id (org/name[@revision])")
    p.add_argument("--source", help="source side (bitext, or monolingual with --self-built)")
    p.add_argument("--target", help="target side of the bitext")
    p.add_argument("--output", required=True)
    p.add_argument("--space", choices=SPACES, default="subword", help="align subword pieces, or words mapped to pieces")
    p.add_argument("--self-built", action="store_true", help="no bitext: translate --source and align with the output")
    p.add_argument("--frequency-only", action="store_true", help="top-frequency list only (the TF baseline)")
    p.add_argument("--sample", type=int, default=None,
                   help=f"use a random sample of this many lines (0: all). Default: all lines of a bitext; "
                        f"{SELF_BUILT_SAMPLE} for --self-built (measured on Multi30k, "
                        "docs/results/self-built-multi30k.md: 2,000 lines cost 3.2 BLEU, 5,000 1.4, 10,000 0.35, "
                        "29,000 none)")
    p.add_argument("--beam-size", type=int, default=DEFAULTS.search.beam_size,
                   help="beam for --self-built translations")
    p.add_argument("--max-per-source", type=int, default=MAX_PER_SOURCE)
    p.add_argument("--vmap-top-m", type=int, default=VMAP_TOP_M)
    p.add_argument("--vmap-top-n", type=int, default=VMAP_TOP_N)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--source-lang", help="M2M100 / NLLB: the language of --source")
    p.add_argument("--target-lang", nargs="+", help="M2M100 / NLLB: the target languages, one table each")
    p.add_argument("--vmap", action="store_true", help="M2M100 / NLLB: write <code>.vmap instead of <code>.s2t")
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    try:  # an optional package the command needs is named before any work
        for url in filter(None, (args.model, args.source, args.target, args.output)):
            require_for_url(url)
        if not args.frequency_only:
            require("eflomal", "align", "aligning a bitext")
    except MissingExtra as e:
        raise SystemExit(f"error: {e}") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        translator = CoreDecoder.load(model_reader(args.model))  # (a hub id: fetched into the hub cache first)
    except HubError as e:
        raise SystemExit(f"error: {e}") from None
    tok = translator.checkpoint.tokenizer
    start = time.perf_counter()
    if isinstance(tok, LanguageTokenizer) or args.target_lang:
        try:
            written = language_tables(args, translator)
        except LanguageError as e:
            raise SystemExit(f"error: {e}") from None
        print(f"wrote {len(written)} per-language tables into {args.output} in {time.perf_counter() - start:.1f}s")
        return
    if args.frequency_only:
        if not args.target:
            p.error("--frequency-only needs --target")
        table = frequency_table(tok, read_corpus(args.target).texts)
    else:
        if not args.source or not (args.target or args.self_built):
            p.error("give --source and --target, or --source with --self-built")
        source = read_corpus(args.source).texts
        target = None if args.self_built else read_corpus(args.target).texts
        if target is not None and len(target) != len(source):
            p.error(f"--source has {len(source)} lines, --target {len(target)}")
        sample = args.sample if args.sample is not None else (SELF_BUILT_SAMPLE if args.self_built else 0)
        if sample and sample < len(source):
            idx = sorted(random.Random(args.seed).sample(range(len(source)), sample))
            source = [source[i] for i in idx]
            target = None if target is None else [target[i] for i in idx]
        if target is None:
            target = [t.text for t in translator.translate(source, SearchConfig(beam_size=args.beam_size))]
        table = lexical_table(tok, source, target, space=args.space, max_per_source=args.max_per_source)
    save_table(args.output, table, tok, top_m=args.vmap_top_m, top_n=args.vmap_top_n)
    print(f"wrote {args.output}: {len(table.translations)} source entries, {len(table.frequent)} frequent targets "
          f"in {time.perf_counter() - start:.1f}s")


def language_tables(args: argparse.Namespace, translator: CoreDecoder) -> list[str]:
    """One table per ``--target-lang``: the model's own translations of ``--source`` into that
    language, aligned with the source (or counted, ``--frequency-only``); returns the files written."""
    tok = translator.checkpoint.tokenizer
    if not isinstance(tok, LanguageTokenizer):
        raise LanguageError("--target-lang applies to M2M100 / NLLB models; this Marian model has one target language")
    if not args.target_lang or not args.source or not args.source_lang:
        raise LanguageError("an M2M100 / NLLB model's shortlists need --source, --source-lang and --target-lang "
                            "(one table per target language, from the model's own translations of --source)")
    for code in [args.source_lang, *args.target_lang]:
        tok.lang_id(code)  # (an unknown code: one line, before any work)
    source = read_corpus(args.source).texts
    if args.sample and args.sample < len(source):
        source = [source[i] for i in sorted(random.Random(args.seed).sample(range(len(source)), args.sample))]
    tables = {}
    for code in args.target_lang:
        target = [t.text for t in translator.translate(source, SearchConfig(beam_size=args.beam_size),
                                                       source_lang=args.source_lang, target_lang=code)]
        tables[code] = frequency_table(tok, target) if args.frequency_only else \
            lexical_table(tok, source, target, space=args.space, max_per_source=args.max_per_source)
    return save_language_tables(args.output, tables, tok, top_m=args.vmap_top_m, top_n=args.vmap_top_n,
                                suffix="vmap" if args.vmap else "s2t")


if __name__ == "__main__":
    main()
