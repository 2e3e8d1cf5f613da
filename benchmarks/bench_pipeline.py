"""Pipeline overhead benchmark: end-to-end Ray pipeline tokens/s ÷ bare in-process engine tokens/s.

    python -m benchmarks.bench_pipeline --lines 20000 --out docs/results/pipeline-wmt22        # full (slow)
    python -m benchmarks.bench_pipeline --lines 200 --rounds 2 --unit-rows 50 --out /tmp/pipeline    # smoke

Same model, search, threads and input (WMT22 de-en repeated to ``--lines``). The in-process run is
the engine alone over the tokenised corpus (model loaded, nothing else timed). The pipeline run is
everything a user waits for once the cluster is up: planning, actor start and model load, reading
Parquet, cleaning and tokenising in the encoder actor, decoding, committing parts and stats. The
lines are cut into ``--rounds`` slices and the systems alternate slice by slice, so drift on a
shared machine hits every system alike; the ratio is of the totals.
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

from raymt.pipeline.orchestration.actors import DecoderSettings
from benchmarks.reports import SETS, read_lines, write_report
from raymt.pipeline.reports.stats_tables import markdown_table
from raymt.pipeline.orchestration.ray_session import init_ray
from raymt.pipeline.orchestration.run import PipelineConfig, run_pipeline
from raymt.pipeline.outputs.sink import OutputStore
from raymt.pipeline.reports.stats_tables import actor_table
from raymt.pipeline.orchestration.units import Columns
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.decode_config import BatchingConfig, DecodeConfig, DecodeRequest, RuntimeConfig
from raymt.workers.decoder.core_decoder import CoreDecoder


def in_process(translator: CoreDecoder, texts: list[str], cfg: SearchConfig) -> tuple[float, int]:
    """Seconds and target tokens of the bare engine over ``texts`` (tokenising not timed)."""
    ids = translator.encode(texts)
    start = time.perf_counter()
    decoded = translator.decode_ids(ids, DecodeRequest(cfg))
    return time.perf_counter() - start, decoded.stats.target_tokens


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/demo-de-en")
    p.add_argument("--data", default="../shared/data")
    p.add_argument("--lines", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds, each over its own slice of the lines")
    p.add_argument("--beam-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--unit-rows", type=int, default=2500)
    p.add_argument("--out", default="docs/results/pipeline-wmt22")
    p.add_argument("--encoders", default="1,0", help="pipeline variants to run: encoder actors (0: decoders tokenise)")
    p.add_argument("--stats-report", action=argparse.BooleanOptionalAction, default=True,
                   help="also render the pipeline runs' per-actor stats as <out>-stats.png / .html")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    base = read_lines(os.path.join(args.data, SETS["wmt22"][0]))
    texts = (base * (args.lines // len(base) + 1))[: args.lines]
    cfg = SearchConfig(beam_size=args.beam_size, max_length_a=1.5, max_length_b=10)
    model = os.path.abspath(args.model)
    work = tempfile.mkdtemp(prefix="bench-pipeline-")
    init_ray(num_cpus=args.threads)
    translator = CoreDecoder.load(model, threads=args.threads, max_batch_size=args.max_batch_size)
    names = {1: "Ray pipeline: encoder actor + decoder actor", 0: "Ray pipeline: decoder actor tokenises (--encoders 0)"}
    variants = [int(e) for e in args.encoders.split(",")]
    totals = {name: [0.0, 0] for name in ["in-process engine", *(names.get(e, f"{e} encoders") for e in variants)]}
    stats = []
    size = -(-len(texts) // args.rounds)
    for r in range(args.rounds):  # A B C, A B C, ...: drift on a shared machine hits every system alike
        part = texts[r * size:(r + 1) * size]
        src = os.path.join(work, f"in-{r}.parquet")
        pq.write_table(pa.table({"id": list(range(len(part))), "text": part}), src, row_group_size=1000)
        seconds, tokens = in_process(translator, part, cfg)
        totals["in-process engine"][0] += seconds
        totals["in-process engine"][1] += tokens
        for e in variants:
            settings = DecoderSettings(model=model, output=os.path.join(work, f"out-{r}-{e}"), signature=f"bench|{cfg.signature()}",
                                       decode=DecodeConfig(cfg, BatchingConfig(max_batch_size=args.max_batch_size),
                                                           RuntimeConfig(threads=args.threads)))
            result = run_pipeline(PipelineConfig(input=src, columns=Columns(), decoder=settings,
                                                 unit_rows=args.unit_rows, decoders=1, encoders=e, progress_every_s=60))
            totals[names.get(e, f"{e} encoders")][0] += result.seconds
            totals[names.get(e, f"{e} encoders")][1] += result.target_tokens
            if e == variants[0]:
                stats += OutputStore(settings.output).read_stats().to_pylist()
    bare = totals["in-process engine"][1] / totals["in-process engine"][0]
    runs = [{"system": name, "seconds": round(sec, 2), "target_tokens": tok, "tokens_per_s": round(tok / sec, 1),
             "vs_in_process": round(tok / sec / bare, 3)} for name, (sec, tok) in totals.items()]
    ratio = runs[1]["vs_in_process"]
    actors = actor_table(stats)
    report = {"model": args.model, "lines": len(texts), "rounds": args.rounds, "threads": args.threads,
              "search": cfg.signature(), "unit_rows": args.unit_rows, "cpu": platform.processor(), "runs": runs,
              "ratio": ratio, "actors": actors}
    md = [f"# Pipeline overhead: WMT22 de-en repeated to {len(texts)} lines\n",
          f"model `{args.model}`, {cfg.signature()}, {args.threads} threads, units of {args.unit_rows} rows; "
          f"{args.rounds} interleaved rounds over consecutive slices, totals per system (pipeline time includes "
          "planning, actor start and model load every round).\n", markdown_table(runs), "",
          f"**pipeline ÷ in-process = {ratio:.3f}** ({runs[1]['system']})\n",
          f"## Per-actor stats ({runs[1]['system']})\n", markdown_table(actors), ""]
    write_report(args.out, report, md)
    if args.stats_report:
        from raymt.pipeline.reports.stats_plots import render
        print("stats report:", render(stats, args.out + "-stats", f"Pipeline benchmark: {runs[1]['system']}"))


if __name__ == "__main__":
    main()
