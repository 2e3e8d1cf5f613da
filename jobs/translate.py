"""Translate a corpus with a Marian / OPUS-MT checkpoint, on Ray.

    python -m raymt.jobs.translate --model models/demo-de-en --input examples/sample.de.txt --output out.en.txt
    ray job submit --working-dir . -- python -m raymt.jobs.translate --model models/demo-de-en \
        --input s3://bucket/corpus/ --output s3://bucket/out/ --evaluate --reference-column ref

Runs on the cluster at ``RAY_ADDRESS`` (or the job's cluster under ``ray job submit``), else on a
local one; a small job (``--local-rows``, default 1000) with no cluster address, or any job with
``--in-process``, runs the same worker code in this process without starting Ray.

``--input``: ``.txt`` (one sentence a line), a ``.parquet`` file, or a directory of them (columns
``--text-column``, optional ``--id-column`` / ``--reference-column``). ``--output``: a directory
(one Parquet part per work unit: id, row, source, translation, score, nbest, status, reason,
signature; ``_manifest/``, ``_stats/``, ``_PLAN.json``, ``_SUCCESS``) when the path ends in ``/``,
is an existing directory or has no file extension; otherwise one file assembled from the parts
kept in ``<output>.parts/``: Parquet for ``.parquet``, text (a line per input row) for any other
extension (``.txt``, ``.en``, ...). Rerunning the same command resumes: committed units are
skipped; a rerun with another input, model, search or ``--unit-rows`` is refused (``--restart``
discards the old output; a rerun that leaves ``--unit-rows`` out keeps the output's). Paths may be
local or fsspec URLs (``s3://``; endpoint and credentials from the AWS environment variables).

Decoding on a GPU (``--gpus-per-decoder 1`` or ``--device cuda``), the batching flags left out take
the GPU's defaults (``workers/device.py``): 1024 slots fitted to free memory, the static step read
back every 4 steps, refill at 5% empty, larger work units.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import time
from dataclasses import replace

import fsspec
import torch

from raymt.pipeline.actors import DecoderSettings
from raymt.pipeline.dispatch import Health
from raymt.pipeline.errors import JobStopped
from raymt.pipeline.extras import MissingExtra, require
from raymt.pipeline.guards import OutputRefused
from raymt.pipeline.driver import DecodersUnavailable, ResourcesUnavailable
from raymt.pipeline.ledger import OutputBusy, PlanMismatch
from raymt.pipeline.model_check import ModelError
from raymt.pipeline.reports import markdown_table
from raymt.pipeline.run import PipelineConfig, UnitsFailed, actor_table, run_pipeline
from raymt.pipeline.shortlists import load_shortlist
from raymt.pipeline.sink import OutputStore
from raymt.pipeline.storage import storage_options
from raymt.pipeline.units import Columns, InputError
from raymt.workers.config import FAST_PRUNING, PruningConfig, SearchConfig
from raymt.workers.device import CPU_DEFAULTS, GPU_DEFAULTS, BatchingDefaults, DeviceUnavailable, on_gpu
from raymt.workers.engine import StaticStep
from raymt.workers.scheduler import CapacityUnit, Policy, SchedulerConfig
from raymt.workers.speedups import EXACT, CpuSpeedups
from raymt.workers.translator import Translator


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default in its help line (a flag without
    one, or whose default depends on the device, says so in its own words)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint directory or fsspec URL")
    p.add_argument("--input", required=True, help="a text file (a sentence a line), a .parquet file, or a "
                   "directory / prefix of .parquet and .txt files (local or URL)")
    p.add_argument("--output", required=True, help="a directory (ends in '/', exists, or has no extension) or one "
                   "file: .parquet, else text")
    p.add_argument("--beam-size", type=int, default=5, help="beam width (1: greedy)")
    p.add_argument("--nbest", type=int, default=1, help="hypotheses kept per sentence (<= beam size)")
    p.add_argument("--length-penalty", type=float, default=1.0, help="score / length ** penalty (HF semantics)")
    p.add_argument("--max-length", type=int, default=256, help="absolute cap on generated tokens")
    p.add_argument("--max-length-a", type=float, default=1.5, help="per-sentence cap a * source_length + b")
    p.add_argument("--max-length-b", type=int, default=10, help="see --max-length-a")
    p.add_argument("--max-batch-size", type=int, help="sentences per decoding batch (the streaming slots); default "
                   "32 on the CPU, 1024 on a GPU, fitted there to free memory (workers/device.py)")
    p.add_argument("--tune-batch", action="store_true",
                   help="closed-loop batch size from measured throughput and free memory, starting at "
                        "--max-batch-size; a batch that runs out of memory is split and retried")
    g = p.add_argument_group("beam pruning (Freitag & Al-Onaizan 2017; Yang et al. 2020); all off by default")
    g.add_argument("--rp", type=float, help="relative threshold: drop p(cand) <= rp * p(best)")
    g.add_argument("--ap", type=float, help="absolute threshold: drop log p(cand) <= log p(best) - ap")
    g.add_argument("--rpl", type=float, help="relative local threshold on the last word's probability")
    g.add_argument("--mc", type=int, help="max candidates per node (same history)")
    g.add_argument("--delta", type=float, help="absolute threshold against the best candidate, finished ones included")
    g.add_argument("--early-stop", action="store_true", help="drop beams below the best finished hypothesis")
    g.add_argument("--fast", action="store_true", help="the measured fast default (raymt.workers.config.FAST_PRUNING: "
                   "rp 0.6) unless heuristics are given explicitly; see docs/results/search.md")
    g = p.add_argument_group("batching (Yang et al. 2020 VAR-STREAM; top-up batching)")
    g.add_argument("--batching", choices=["auto", "batch", *[x.value for x in Policy]], default="auto",
                   help="batch: length-sorted batches decoded to the end; otherwise that streaming policy (every "
                        "policy gives the same translations). auto: topup (1.2x batch on WMT22's long-tailed "
                        "lengths), or batch with --shortlist or --tune-batch, which work per batch")
    g.add_argument("--epsilon", type=float, default=1 / 6, help="var-stream refill threshold")
    g.add_argument("--refill-threshold", type=float,
                   help="topup: refill once this share is empty (default 0.5 on the CPU, 0.05 on a GPU)")
    g.add_argument("--capacity", type=int, default=0, help="streaming capacity (0: --max-batch-size sentences)")
    g.add_argument("--capacity-unit", choices=[x.value for x in CapacityUnit], default="sentences",
                   help="what --capacity counts")
    g.add_argument("--flush-every", type=int, default=0, help="var-stream: expand all sentences every N steps")
    g.add_argument("--static-step", type=int, metavar="N",
                   help="the one-shape decoder step, captured once as a CUDA graph on a GPU and replayed, its "
                        "results read back every N steps (0: the dynamic step). Same outputs; on the CPU it only "
                        "costs. Default 0 on the CPU, 4 on a GPU")
    g.add_argument("--late-readback", action="store_true",
                   help="the static step's results read one step late, once the next step is queued, so the GPU "
                        "runs it while the host frees and refills slots (same outputs; slots refill a step later). "
                        "Only with the static step (--static-step N > 0, a GPU's default)")
    g = p.add_argument_group("shortlist vocabulary (Shi & Knight 2017); see raymt.jobs.build_shortlist")
    g.add_argument("--shortlist", help="lex.s2t (with its .freq) or CTranslate2 .vmap file")
    g.add_argument("--shortlist-m", type=int, default=10,
                   help="top translations kept per source token (10: the fastest within 0.3 BLEU, docs/results/shortlist-multi30k.md)")
    g.add_argument("--shortlist-n", type=int, default=100, help="most frequent target tokens always kept")
    precision = p.add_mutually_exclusive_group()  # alternatives: float32 (default), int8, bf16 or fp16
    precision.add_argument("--int8", action="store_true", help="int8 dynamic quantisation of the linear layers (CPU; "
                           "measured in docs/results/peers-*.md: faster, BLEU within quantisation noise)")
    precision.add_argument("--bf16", action="store_true", help="bfloat16 weights and activations (instead of --int8; "
                           "fast where the CPU has AVX512-BF16/AMX, BLEU within noise)")
    precision.add_argument("--fp16", action="store_true", help="float16 weights and activations (for GPUs without bf16: "
                           "T4, V100; log-softmax and scores stay float32)")
    p.add_argument("--no-speedups", action="store_true", help="plain torch layers: no fused QKV, no oneDNN packing")
    p.add_argument("--device", type=device_name, metavar="{auto,cpu,cuda,cuda:N}",
                   help="where each decoder decodes (default: cuda with --gpus-per-decoder, else cpu). A GPU that "
                        "is not there is an error, never a silent CPU fallback. On Ray, cuda reserves one GPU "
                        "per decoder actor unless --gpus-per-decoder says otherwise")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads per decoder (0: all cores "
                   "in-process, 2 per decoder actor on Ray)")
    g = p.add_argument_group("Ray pipeline")
    g.add_argument("--in-process", action="store_true", help="no Ray: decode in this process (same worker code)")
    g.add_argument("--local-rows", type=int, default=1000,
                   help="with no cluster address (RAY_ADDRESS), inputs of at most this many rows are decoded in "
                        "this process instead of starting Ray (0: always Ray)")
    g.add_argument("--restart", action="store_true",
                   help="the output was started by another plan (input, model, search, --unit-rows): discard its "
                        "parts and translate afresh instead of refusing")
    g.add_argument("--lease-ttl", type=float, default=60.0,
                   help="seconds this job's hold on the output outlives it if it is paused, cut off or killed on "
                        "another node; a job paused past it has lost the output and stops without writing")
    g.add_argument("--decoder-wait", type=float, default=600.0,
                   help="seconds the job waits with no decoder actor ready (cluster full, GPUs missing, actors "
                        "crashing) before it fails naming the units left; rerunning resumes")
    g.add_argument("--progress-every", type=float, default=10.0, help="seconds between progress lines")
    g.add_argument("--stall-timeout", type=float, default=1800.0,
                   help="a decoder actor with work that returns nothing for this many seconds is killed and "
                        "restarted; its units are sent again. An encoder stream that delivers nothing this long "
                        "while every decoder waits is given up: its units go to the decoders untokenised")
    g.add_argument("--text-column", default="text", help="the Parquet column to translate")
    g.add_argument("--id-column", help="default: 'id' when present, else the row number")
    g.add_argument("--reference-column", help="references for --evaluate")
    g.add_argument("--evaluate", action="store_true", help="sacreBLEU BLEU and chrF against --reference-column")
    g.add_argument("--unit-rows", type=int,
                   help="rows per work unit: the commit / resume grain, and the decoder sorts by length within it. "
                        "Default: what the output's plan used when resuming; else 2500 on the CPU, and on a GPU "
                        "1/64 of the input within 2500..50000 (a GPU's slots drain at each unit's end: "
                        "docs/results/occupancy.md)")
    g.add_argument("--decoders", type=int, default=0, help="decoder actors (0: as many as the cluster's cores allow)")
    g.add_argument("--min-decoders", type=int, help="autoscaling pool: at least this many decoder actors")
    g.add_argument("--max-decoders", type=int, help="autoscaling pool: at most this many decoder actors")
    g.add_argument("--encoders", type=int, default=1, help="encoder (tokeniser) actors; 0: decoders tokenise")
    g.add_argument("--cpus-per-decoder", type=float, default=0, help="CPUs reserved per decoder (0: --threads)")
    g.add_argument("--gpus-per-decoder", type=float, default=0,
                   help="GPUs reserved per decoder actor; each decodes on the GPU Ray assigns it (--device cuda)")
    g.add_argument("--skip-corrupt", action="store_true",
                   help="an unreadable Parquet file is skipped (reported) and a unit whose rows cannot be read "
                        "is written as rows with status 'unreadable', instead of failing the job")
    g.add_argument("--debug", action="store_true", help="on a job error, the full traceback instead of one line")
    g.add_argument("--report", action="store_true",
                   help="after the job, render the per-actor stats as <output>.report.png / .html (jobs/report.py)")
    return p


def search_config(args: argparse.Namespace) -> SearchConfig:
    pruning = PruningConfig(rp=args.rp, ap=args.ap, rpl=args.rpl, mc=args.mc, delta=args.delta,
                            early_stop=args.early_stop)
    if args.fast and not pruning.active:
        pruning = FAST_PRUNING
    return SearchConfig(beam_size=args.beam_size, num_hypotheses=args.nbest, length_penalty=args.length_penalty,
                        max_decoding_length=args.max_length, max_length_a=args.max_length_a,
                        max_length_b=args.max_length_b, pruning=pruning)


def batching_of(args: argparse.Namespace) -> str:
    """``--batching``, ``auto`` resolved: top-up, unless a shortlist (its candidate set is per batch, so
    batches decide the translations) or the batch-size tuner (it sizes batches) needs batches."""
    if args.batching != "auto":
        return args.batching
    return "batch" if args.shortlist or args.tune_batch else Policy.TOPUP.value


def batching_defaults(args: argparse.Namespace) -> BatchingDefaults:
    """``--max-batch-size``, ``--static-step`` and ``--refill-threshold`` as given, else the default
    of the device the decoders decode on (``workers/device.py``: the CPU's, or the GPU's)."""
    d = GPU_DEFAULTS if on_gpu(device_of(args), args.gpus_per_decoder) else CPU_DEFAULTS
    return BatchingDefaults(max_batch_size=args.max_batch_size or d.max_batch_size,
                            static_step=d.static_step if args.static_step is None else args.static_step,
                            refill_threshold=d.refill_threshold if args.refill_threshold is None else args.refill_threshold)


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig | None:
    if batching_of(args) == "batch":
        return None
    d = batching_defaults(args)
    return SchedulerConfig(policy=Policy(batching_of(args)), max_batch_sentences=d.max_batch_size,
                           capacity=args.capacity or d.max_batch_size, capacity_unit=CapacityUnit(args.capacity_unit),
                           beam_size=args.beam_size, epsilon=args.epsilon, refill_threshold=d.refill_threshold,
                           flush_every=args.flush_every)


def load_shortlist_for(args: argparse.Namespace, translator: Translator):
    if not args.shortlist:
        return None
    return load_shortlist(args.shortlist, translator.checkpoint.tokenizer, top_m=args.shortlist_m,
                          top_n=args.shortlist_n, special_ids=translator.special_target_ids())


def speedups_of(args: argparse.Namespace) -> CpuSpeedups:
    if args.no_speedups:
        return CpuSpeedups(int8=args.int8, bf16=args.bf16, fp16=args.fp16)
    return replace(EXACT, int8=args.int8, bf16=args.bf16, fp16=args.fp16)


def device_name(text: str) -> str:
    """``--device``'s form (whether the GPU is there is checked where it decodes)."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"{text!r}: expected auto, cpu, cuda or cuda:N")
    return text


def device_of(args: argparse.Namespace) -> str:
    """``--device`` as given, else cuda with ``--gpus-per-decoder``, else cpu; ``auto`` in this process
    is decided here (the GPU's defaults follow it)."""
    if args.device == "auto" and args.in_process:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return args.device or ("cuda" if args.gpus_per_decoder else "cpu")


def signature(args: argparse.Namespace, cfg: SearchConfig) -> str:
    """What decodes, in a line printed beside every output (and part of the plan): the model named as
    one path however it is spelled (``./m/`` and ``m`` are the same model), the search and speedups."""
    model = args.model.rstrip("/") if "://" in args.model else os.path.normpath(args.model)
    return f"model:{model}|{cfg.signature()}|batching:{batching_of(args)}" + (
        f"|shortlist:{args.shortlist}:{args.shortlist_m}:{args.shortlist_n}" if args.shortlist else "") + (
        "|int8" if args.int8 else "") + ("|bf16" if args.bf16 else "") + ("|fp16" if args.fp16 else "")


def single_file(url: str) -> bool:
    """Whether ``--output`` names one file (assembled from parts) rather than a directory of parts."""
    if url.endswith("/"):
        return False
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    if fs.isdir(path):
        return False
    return "." in path.rstrip("/").rsplit("/", 1)[-1].lstrip(".")


def pipeline_config(args: argparse.Namespace, cfg: SearchConfig) -> PipelineConfig:
    one_file = single_file(args.output)
    d = batching_defaults(args)
    settings = DecoderSettings(
        model=local_path(args.model), output=local_path(args.output + ".parts" if one_file else args.output),
        search=cfg, batching=scheduler_config(args), signature=signature(args, cfg), threads=args.threads,
        max_batch_size=d.max_batch_size, shortlist=args.shortlist and local_path(args.shortlist),
        shortlist_m=args.shortlist_m, shortlist_n=args.shortlist_n, evaluate=args.evaluate, tune_batch=args.tune_batch,
        speedups=speedups_of(args), device=device_of(args),
        static=StaticStep(readback_every=d.static_step, late=args.late_readback) if d.static_step else None)
    gpus = args.gpus_per_decoder or (1 if settings.device.startswith("cuda") and not args.in_process else 0)
    decoders = args.decoders
    if args.min_decoders is not None or args.max_decoders is not None:
        decoders = (args.min_decoders or 1, args.max_decoders or max(args.min_decoders or 1, 1))
    columns = Columns(args.text_column, args.id_column, args.reference_column)
    return PipelineConfig(input=local_path(args.input), columns=columns, decoder=settings, unit_rows=args.unit_rows,
                          decoders=decoders, encoders=args.encoders, cpus_per_decoder=args.cpus_per_decoder,
                          gpus_per_decoder=gpus, skip_corrupt=args.skip_corrupt,
                          restart=args.restart, local_rows=2**62 if args.in_process else args.local_rows,
                          in_process=args.in_process, progress_every_s=args.progress_every,
                          health=Health(decoder_wait_s=args.decoder_wait, stall_timeout_s=args.stall_timeout),
                          assemble_to=local_path(args.output) if one_file else None, lease_ttl_s=args.lease_ttl)


def local_path(url: str) -> str:
    """Absolute paths for local files, so actors find them whatever their working directory."""
    return url if "://" in url or os.environ.get("RAY_JOB_ID") or os.environ.get("RAYMT_KEEP_RELATIVE") \
        else os.path.abspath(url)


JOB_ERRORS = (InputError, ModelError, PlanMismatch, OutputBusy, DecodersUnavailable, UnitsFailed, ResourcesUnavailable,
              DeviceUnavailable, JobStopped, OutputRefused, MissingExtra)


def run(args: argparse.Namespace, cfg: SearchConfig) -> None:
    if args.evaluate and not args.reference_column:
        raise SystemExit("error: --evaluate needs --reference-column (a Parquet input with references)")
    start = time.perf_counter()
    try:
        if args.report:  # the report's package is checked before the job, not after it
            require("matplotlib", "plots", "the stats report (--report)")
        pc = pipeline_config(args, cfg)
        result = run_pipeline(pc)
    except JOB_ERRORS as e:
        if args.debug:
            raise
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        raise SystemExit("interrupted: every committed unit is kept; rerun the same command to resume") from None
    store = OutputStore(pc.decoder.output)
    decode = f"decoding {result.decode_tokens_per_second:.0f} target tokens/s per decoder, " if result.stats else ""
    print(f"translated {result.rows} rows in {result.units} units ({result.skipped_units} already committed) "
          f"-> {args.output} in {time.perf_counter() - start:.1f}s end to end, {result.where} ({decode}"
          f"{result.tokens_per_second:.0f} end to end) [{pc.decoder.signature}]")
    if set(result.statuses) - {"ok"}:  # rows translated other than as given, or not at all: say so
        print("rows by status: " + ", ".join(f"{k} {v}" for k, v in sorted(result.statuses.items()))
              + f" (the status and reason columns of the parts in {pc.decoder.output} say which and why)")
    for path, reason in result.skipped_files:
        print(f"skipped corrupt file {path}: {reason}")
    for unit, reason in result.unreadable.items():
        print(f"unreadable unit {unit} written with status 'unreadable': {reason}")
    stats = store.read_stats()
    if stats is not None:
        print(markdown_table(actor_table(stats)))
    if result.scores:
        print(result.scores)
    if args.report:
        from raymt.jobs.report import report
        report(pc.decoder.output, None if "://" not in args.output else "report")


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = search_config(args)
    except ValueError as e:  # e.g. --nbest above --beam-size: a usage error, not a traceback
        parser.error(str(e))
    run(args, cfg)


if __name__ == "__main__":
    main()
