"""Documents benchmark: rows of several sentences (paragraphs built from held-out test sets) against
the same sentences given one per row, for quality (BLEU) and speed (target tokens/s).

    python -m benchmarks.bench_documents --model models/demo-de-en --out /tmp/documents-demo
    python -m benchmarks.bench_documents --model ../shared/models/base-de-en --out docs/results/documents
    python -m benchmarks.bench_documents --lines 40 --rounds 1 --out /tmp/smoke      # a smoke run

Paragraphs are consecutive lines of Multi30k test_2016_flickr and WMT22 de-en, 4 to 8 a row in
turn, joined by a space (every fifth by a newline); their references are the reference lines joined
the same way. A line with no sentence end (a caption, a headline) gets a full stop on both sides
first: a paragraph is made of sentences, and the one-per-row system decodes the same lines. Three systems decode every set through the Python API (the job's row path):
``sentences`` (one sentence a row, translations joined per paragraph as the references are),
``paragraphs`` (the paragraph rows, split into sentences: the default) and ``paragraphs, no split``
(``split_sentences=False``: each paragraph one sequence). BLEU is corpus BLEU over the paragraphs
for all three; speed is target tokens per second, each system's best of ``--rounds`` interleaved.
"""
from __future__ import annotations

import argparse
import os
import time

import sacrebleu
import torch

from raymt.pipeline.decoders.api import Translator
from benchmarks.reports import SETS, machine, read_lines, write_report
from raymt.pipeline.reports.stats_tables import markdown_table


def group(lines: list[str], low: int, high: int) -> list[tuple[int, int]]:
    """Consecutive (start, stop) ranges of ``low``..``high`` lines in turn, covering ``lines``."""
    spans, start, size = [], 0, low
    while start < len(lines):
        spans.append((start, min(start + size, len(lines))))
        start += size
        size = low if size >= high else size + 1
    return spans


def joined(lines: list[str], spans: list[tuple[int, int]]) -> list[str]:
    """Each span's lines joined by a space (every fifth paragraph by a newline)."""
    return [("\n" if k % 5 == 4 else " ").join(lines[a:b]) for k, (a, b) in enumerate(spans)]


def punctuated(line: str) -> str:
    """A caption or headline ends with a full stop where it has no sentence end: a paragraph is made
    of sentences, and no splitter can find the end of one that has none. Both sides get the same."""
    return line if line.rstrip()[-1:] in ".!?…\"'”“»)]" else line.rstrip() + "."


def flat(text: str) -> str:
    return " ".join(text.split())


def run_system(translator: Translator, rows: list[str], beam: int) -> tuple[list[str], float, int]:
    """(translations, seconds, target tokens) of one pass over ``rows``."""
    tokens = translator.stats.target_tokens
    start = time.perf_counter()
    out = [r.text for r in translator.translate_rows(rows, beam_size=beam)]
    return out, time.perf_counter() - start, translator.stats.target_tokens - tokens


def bench_set(name: str, args: argparse.Namespace, split: Translator, whole: Translator) -> dict:
    src_path, ref_path = (os.path.join(args.data, p) for p in SETS[name])
    src = [punctuated(x) for x in read_lines(src_path, args.lines)]
    ref = [punctuated(x) for x in read_lines(ref_path, args.lines)]
    spans = group(src, args.min_sentences, args.max_sentences)
    paragraphs, references = joined(src, spans), [flat(r) for r in joined(ref, spans)]
    systems = {"sentences": (split, src), "paragraphs": (split, paragraphs), "paragraphs, no split": (whole, paragraphs)}
    best: dict[str, tuple[list[str], float, int]] = {}
    for _ in range(args.rounds):  # interleaved: each system's best pass
        for label, (translator, rows) in systems.items():
            run = run_system(translator, rows, args.beam)
            if label not in best or run[1] < best[label][1]:
                best[label] = run
    out = {}
    for label, (texts, seconds, tokens) in best.items():
        hyps = [flat(" ".join(texts[a:b])) for a, b in spans] if label == "sentences" else [flat(t) for t in texts]
        out[label] = {"bleu": round(sacrebleu.corpus_bleu(hyps, [references]).score, 2), "seconds": round(seconds, 2),
                      "target_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1)}
    out["paragraphs"]["speed_vs_sentences"] = round(out["paragraphs"]["tokens_per_s"] / out["sentences"]["tokens_per_s"], 3)
    return {"set": name, "lines": len(src), "paragraphs": len(spans), "systems": out}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/demo-de-en")
    p.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))
    p.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    p.add_argument("--lines", type=int, default=0, help="the first N lines of each set (0: all)")
    p.add_argument("--min-sentences", type=int, default=4)
    p.add_argument("--max-sentences", type=int, default=8)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default="docs/results/documents")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    split = Translator.load(args.model, threads=args.threads)
    whole = Translator.load(args.model, threads=args.threads, split_sentences=False)
    for translator in (split, whole):  # warmed up (native operators, allocator) before anything is timed
        translator.translate(["Ein Hund läuft über die Wiese. Eine Katze schläft."] * 8, beam_size=args.beam)
    sets = [bench_set(name, args, split, whole) for name in args.sets]
    rows = [{"set": s["set"], "system": label, "rows": s["lines"] if label == "sentences" else s["paragraphs"],
             "BLEU": r["bleu"], "target tokens/s": r["tokens_per_s"],
             "speed vs sentences": r.get("speed_vs_sentences", 1.0 if label == "sentences" else "")}
            for s in sets for label, r in s["systems"].items()]
    report = {"model": args.model, "beam": args.beam, "threads": args.threads, "rounds": args.rounds,
              "min_sentences": args.min_sentences, "max_sentences": args.max_sentences, "sets": sets,
              "machine": machine()}
    command = "python -m benchmarks.bench_documents " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in (("model", args.model), ("beam", args.beam),
                                                     ("threads", args.threads), ("lines", args.lines)))
    md = [f"# Documents: paragraphs of {args.min_sentences}-{args.max_sentences} sentences against one sentence a row",
          "", f"Model `{args.model}`, beam {args.beam}, {args.threads} threads; BLEU over the paragraphs for every "
          "system (sentence translations joined as the references are); speed: target tokens/s, best of "
          f"{args.rounds} interleaved rounds.", "", markdown_table(rows), "", f"`{command}`"]
    write_report(args.out, report, md)
    return report


if __name__ == "__main__":
    main()
