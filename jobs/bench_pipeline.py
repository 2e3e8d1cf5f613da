"""Pipeline overhead benchmark: end-to-end Ray pipeline tokens/s ÷ bare in-process engine tokens/s.

    python -m jobs.bench_pipeline --lines 20000 --out reports/pipeline-wmt22        # full (slow)
    python -m jobs.bench_pipeline --lines 200 --unit-rows 50 --out /tmp/pipeline    # smoke

Same model, search, threads and input (WMT22 de-en repeated to ``--lines``). The in-process run is
the engine alone over the tokenised corpus (model loaded, nothing else timed). The pipeline run is
everything a user waits for once the cluster is up: planning, actor start and model load, reading
Parquet, cleaning and tokenising in the encoder actor, decoding, committing parts and stats. Runs go
in-process, pipeline, in-process, so drift on a shared machine shows; the ratio uses their mean.
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.actors import DecoderSettings
from pipeline.reports import SETS, markdown_table, read_lines, write_report
from pipeline.run import PipelineConfig, actor_table, init_ray, run_pipeline
from pipeline.sink import OutputStore
from pipeline.units import Columns
from workers.config import SearchConfig
from workers.engine import DecodeStats
from workers.translator import Translator


def in_process(model: str, texts: list[str], cfg: SearchConfig, threads: int, batch: int) -> dict:
    translator = Translator.load(model, threads=threads, max_batch_size=batch)
    ids = translator.encode(texts)
    translator.stats = DecodeStats()
    start = time.perf_counter()
    translator.translate_ids(ids, cfg)
    seconds = time.perf_counter() - start
    return {"system": "in-process engine", "seconds": round(seconds, 2), "target_tokens": translator.stats.target_tokens,
            "tokens_per_s": round(translator.stats.target_tokens / seconds, 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/demo-de-en")
    p.add_argument("--data", default="../shared/data")
    p.add_argument("--lines", type=int, default=20000)
    p.add_argument("--beam-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--unit-rows", type=int, default=1000)
    p.add_argument("--out", default="reports/pipeline-wmt22")
    p.add_argument("--encoders", default="1,0", help="pipeline variants to run: encoder actors (0: decoders tokenise)")
    p.add_argument("--repeat-in-process", action=argparse.BooleanOptionalAction, default=True,
                   help="a second in-process run after the pipeline runs (drift check)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    base = read_lines(os.path.join(args.data, SETS["wmt22"][0]))
    texts = (base * (args.lines // len(base) + 1))[: args.lines]
    cfg = SearchConfig(beam_size=args.beam_size, max_length_a=1.5, max_length_b=10)
    model = os.path.abspath(args.model)
    work = tempfile.mkdtemp(prefix="bench-pipeline-")
    src = os.path.join(work, "in.parquet")
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), src, row_group_size=1000)
    init_ray(num_cpus=args.threads)
    from ray.data import DataContext
    DataContext.get_current().enable_progress_bars = False
    runs = [in_process(model, texts, cfg, args.threads, args.max_batch_size)]
    results = {}
    names = {1: "Ray pipeline: encoder actor + decoder actor", 0: "Ray pipeline: decoder actor tokenises (--encoders 0)"}
    for encoders in map(int, args.encoders.split(",")):
        name = names.get(encoders, f"Ray pipeline: {encoders} encoder actors + decoder actor")
        settings = DecoderSettings(model=model, output=os.path.join(work, f"out-{encoders}"), search=cfg,
                                   batching=None, signature=f"bench|{cfg.signature()}", threads=args.threads,
                                   max_batch_size=args.max_batch_size)
        result = run_pipeline(PipelineConfig(input=src, columns=Columns(), decoder=settings, unit_rows=args.unit_rows,
                                             decoders=1, encoders=encoders, progress_every_s=30))
        results[encoders] = (result, settings.output)
        runs.append({"system": name, "seconds": round(result.seconds, 2), "target_tokens": result.target_tokens,
                     "tokens_per_s": round(result.tokens_per_second, 1)})
    if args.repeat_in_process:
        runs.append(in_process(model, texts, cfg, args.threads, args.max_batch_size))
    bare_runs = [r["tokens_per_s"] for r in runs if r["system"] == "in-process engine"]
    bare = sum(bare_runs) / len(bare_runs)
    for run in runs:
        run["vs_in_process"] = round(run["tokens_per_s"] / bare, 3)
    result, output = results[min(results, key=lambda e: -e)]  # the encoder-pool variant when run
    ratio = result.tokens_per_second / bare
    actors = actor_table(OutputStore(output).read_stats())
    report = {"model": args.model, "lines": len(texts), "threads": args.threads, "search": cfg.signature(),
              "unit_rows": args.unit_rows, "cpu": platform.processor(), "runs": runs, "ratio": round(ratio, 3),
              "actors": actors}
    md = [f"# Pipeline overhead: WMT22 de-en repeated to {len(texts)} lines\n",
          f"model `{args.model}`, {cfg.signature()}, {args.threads} threads, units of {args.unit_rows} rows; "
          "runs in the order listed.\n", markdown_table(runs), "",
          f"**pipeline ÷ in-process = {ratio:.3f}** (the encoder-pool variant when run, against the mean "
          "of the in-process runs)\n",
          "## Per-actor stats (decoder)\n", markdown_table(actors), ""]
    write_report(args.out, report, md)


if __name__ == "__main__":
    main()
