"""Sequence-level knowledge-distillation data: translate a corpus with the teacher on Ray and write
training-ready Parquet (every row kept, filters recorded as columns; see pipeline/outputs/distill_columns.py).

    python -m raymt.jobs.distill --model models/demo-de-en --input train.parquet --text-column de \\
        --target-column en --output out/distill --nbest 4 --token-logprobs

Output ``<output>/distilled/part-<unit>.parquet``: id, row, source, translation (the teacher's
best), score, nbest (text + score, best first), token_logprobs (with ``--token-logprobs``),
reference (the bitext's own target, with ``--target-column``), status, reason, length_ratio,
filters, keep; ``_SUMMARY.json`` counts each filter. It is the translate job underneath (same
flags, same ``ray job submit`` use, same per-unit commits and resume); rerunning it finishes the
translation and rewrites the filtered files.
"""
from __future__ import annotations

import dataclasses
import json
import logging

from raymt.jobs.translate import JOB_ERRORS, build_parser, decode_config, interrupted, model_generation, pipeline_config
from raymt.workers.checkpoints.generation import UnsupportedGeneration
from raymt.pipeline.outputs.distill_columns import Filters, write_distilled
from raymt.pipeline.orchestration.run import run_pipeline


def main(argv: list[str] | None = None) -> dict:
    p = build_parser()
    p.description = __doc__
    g = p.add_argument_group("distillation")
    g.add_argument("--target-column", help="a bitext's target column, kept alongside as 'reference'")
    g.add_argument("--token-logprobs", action="store_true", help="per-token teacher log-probs of the best translation")
    g.add_argument("--max-length-ratio", type=float, default=Filters().max_length_ratio,
                   help="filter: target/source words outside [1/r, r]")
    g.add_argument("--min-score", type=float, default=Filters().min_score, help="filter: length-normalised log-prob below")
    args = p.parse_args(argv)
    if args.split_sentences is None:  # a bitext row is one training pair: decoded whole unless asked
        args.split_sentences = False
    if args.output.endswith((".txt", ".parquet")):
        raise SystemExit("error: --output of a distillation run is a folder (it holds parts and distilled/)")
    if args.target_column:
        if args.reference_column and args.reference_column != args.target_column:
            raise SystemExit("error: give --target-column or --reference-column, not both")
        args.reference_column = args.target_column
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    summaries = []
    try:  # the distilled files are written under the output's lease, like every other file of the job
        pc = pipeline_config(args, decode_config(args, model_generation(args)))
        pc = dataclasses.replace(pc, decoder=dataclasses.replace(pc.decoder, parts=dataclasses.replace(
            pc.decoder.parts, token_logprobs=args.token_logprobs, keep_reference=bool(args.target_column))))
        result = run_pipeline(pc, finish=lambda store: summaries.append(
            write_distilled(store, Filters(args.max_length_ratio, args.min_score))))
    except (*JOB_ERRORS, UnsupportedGeneration) as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        raise interrupted() from None
    summary = summaries[0]
    print(f"distilled {result.rows} rows in {result.seconds:.1f}s ({result.tokens_per_second:.0f} target tokens/s) "
          f"-> {args.output}/distilled: {json.dumps(summary)}")
    return summary


if __name__ == "__main__":
    main()
