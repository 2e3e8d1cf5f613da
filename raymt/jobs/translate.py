"""Translate a corpus with a Marian / OPUS-MT checkpoint, on Ray.

    python -m raymt.jobs.translate --model models/demo-de-en --input examples/sample.de.txt --output out.en.txt
    ray job submit --working-dir . -- python -m raymt.jobs.translate --model models/demo-de-en \
        --input s3://bucket/corpus/ --output s3://bucket/out/ --evaluate --reference-column ref

Runs on the cluster at ``RAY_ADDRESS`` (or the job's cluster under ``ray job submit``), else on a
local one; a small job (at most ``--local-rows`` rows) with no cluster address, or any job with
``--in-process``, runs the same worker code in this process without starting Ray.

``--model``: a model directory, an fsspec URL, or a Hugging Face hub id (``org/name[@revision]``, fetched
into the hub cache and pinned to its commit; ``HF_HOME``, ``HF_TOKEN``, ``HF_HUB_OFFLINE`` as in every HF tool).
``--input``: text (one sentence a line), ``.tsv`` (``--column N``), ``.jsonl`` (``--text-field``), ``.csv``
(a header row naming the columns), each also ``.gz`` / ``.bz2`` / ``.xz`` / ``.zst``, a ``.parquet`` file
(CSV and Parquet: columns ``--text-column``, optional ``--id-column`` / ``--reference-column``), or a
directory of them. A row over ``--max-row-chars`` characters is not decoded (status ``too_long``); a
row of several sentences is translated a sentence at a time and rejoined (``--no-split-sentences``: whole).
``--output``: a directory (one
Parquet part per work unit: id, row, source, translation, score, nbest, status, reason, signature,
the input's other columns unless ``--no-passthrough``; ``_manifest/``, ``_stats/``, ``_PLAN.json``,
``_SUCCESS``) when the path ends in ``/``, is an existing directory or has no file extension;
otherwise one file assembled from the parts kept in ``<output>.parts/``: Parquet for ``.parquet``,
JSON lines for ``.jsonl``, TSV for ``.tsv``, text (a line per input row; Marian n-best lines with
``--nbest`` > 1) for any other extension, compressed as named; ``.csv``, ``.json``, ... are refused.
``-`` as input or output streams standard input / output through this process, without Ray.
Rerunning the same command resumes: committed units are skipped; a rerun with another input, model, search or ``--unit-rows`` is refused (``--restart``
discards the old output; a rerun that leaves ``--unit-rows`` out keeps the output's). Paths may be
local or fsspec URLs (``s3://``; endpoint and credentials from the AWS environment variables).

Decoding on a GPU (``--gpus-per-decoder 1`` or ``--device cuda``), the batching flags left out take
the GPU's defaults (``workers/decoder/device.py``; each flag's help gives both): more slots, fitted to free
memory, the static step, an earlier refill, larger work units.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import replace

import fsspec
import torch

from raymt.jobs.translate_flags import build_parser as _build_parser
from raymt.jobs.translate_flags import device_name  # noqa: F401  (the --device type, re-exported)
from raymt.pipeline.orchestration.dispatch import Health
from raymt.pipeline.errors import JobStopped, os_error_line
from raymt.pipeline.extras import MissingExtra, require
from raymt.pipeline.outputs.guards import OutputRefused
from raymt.pipeline.hub import HubError, hub_id
from raymt.pipeline.orchestration.driver import DecodersUnavailable, ResourcesUnavailable
from raymt.pipeline.outputs.ledger import OutputBusy, PlanMismatch
from raymt.pipeline.decoders.model_check import ModelError
from raymt.pipeline.orchestration.ray_session import stop_ray
from raymt.pipeline.orchestration.run import PipelineConfig, PipelineResult, UnitsFailed, run_pipeline
from raymt.pipeline.orchestration.settings import DecoderSettings, PartColumns
from raymt.pipeline.decoders.shortlist_files import shortlist_for
from raymt.pipeline.outputs.sink import OutputStore
from raymt.pipeline.reports.stats_tables import actor_table, markdown_table
from raymt.pipeline.storage import model_reader, storage_options
from raymt.pipeline.orchestration.stream import STDIO, translate_stream
from raymt.pipeline.orchestration.units import Columns, InputError
from raymt.workers.config import FAST_PRUNING, NUM_SAMPLES, PruningConfig, SamplingConfig, SearchConfig
from raymt.workers.decoder.decode_config import (DEFAULTS, BatchingConfig, DecodeConfig, RuntimeConfig, ShortlistSource,
                                         batching_for)
from raymt.workers.decoder.device import DeviceUnavailable, on_gpu
from raymt.workers.checkpoints.generation import (GenerationDefaults, UnsupportedGeneration, effective_search, language_code,
                                      read_generation)
from raymt.workers.kernels.isa import bf16_refusal, detect as detect_isa
from raymt.workers.text.lang_tokenizer import LanguageError, load_language_tokenizer
from raymt.workers.kernels.native import kernels_summary
from raymt.workers.decoder.scheduler import CapacityUnit, Policy, SchedulerConfig
from raymt.workers.kernels.speedups import EXACT, CpuSpeedups, precision_refusal
from raymt.workers.decoder.static_step import StaticStep

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The flags, grouped (``raymt.jobs.translate_flags``), under this module's docstring."""
    return _build_parser(__doc__)


def search_config(args: argparse.Namespace, model: GenerationDefaults | None = None) -> SearchConfig:
    """The search flags over the model's generation settings (``model_generation``; None: the product's
    defaults), merged once (``generation.effective_search``): a flag given wins, one left out (None)
    keeps the model's or the product's value. Sampling flags (``sampling_config``) make each row's
    ``--num-samples`` lanes draw instead of searching."""
    pruning = PruningConfig(rp=args.rp, ap=args.ap, rpl=args.rpl, mc=args.mc, delta=args.delta,
                            early_stop=args.early_stop)
    if args.fast and not pruning.active:
        pruning = FAST_PRUNING
    flags = {"beam_size": args.beam_size, "length_penalty": args.length_penalty, "max_decoding_length": args.max_length,
             "max_length_a": args.max_length_a, "max_length_b": args.max_length_b,
             "early_stopping": args.early_stopping}
    sampling = sampling_config(args)
    if sampling is not None:
        if args.beam_size is not None:
            raise ValueError("--beam-size is beam search's width; with sampling flags give --num-samples")
        samples = NUM_SAMPLES if args.num_samples is None else args.num_samples
        flags |= {"beam_size": samples, "num_hypotheses": samples if args.nbest is None else args.nbest, "sampling": sampling}
    else:
        flags["num_hypotheses"] = DEFAULTS.search.num_hypotheses if args.nbest is None else args.nbest
    try:
        return effective_search(model, **flags, pruning=pruning)
    except ValueError as e:
        if args.beam_size is None and sampling is None and model is not None:  # (the beam size came from the model)
            raise ValueError(f"{e} (the model's generation_config.json asks for num_beams {model.num_beams}; "
                             "give --beam-size)") from None
        raise


def sampling_config(args: argparse.Namespace) -> SamplingConfig | None:
    """The sampling flags' ``SamplingConfig``, or None where none of them (but the seed) is given."""
    given = {"temperature": args.sampling_temperature, "topk": args.sampling_topk, "topp": args.sampling_topp}
    if all(v is None for v in given.values()) and args.num_samples is None:
        return None
    return SamplingConfig(**{k: v for k, v in given.items() if v is not None}, seed=args.sampling_seed)


def model_generation(args: argparse.Namespace) -> GenerationDefaults | None:
    """The generation settings the search flags apply over: an M2M100 / NLLB model's own
    (``raymt.workers.checkpoints.generation``: what HF ``generate`` runs on that directory), else None: the
    product's (a Marian model, or one that cannot be read here: the job names what is wrong with it).
    A target language the model's settings force (``forced_bos_token_id``) becomes ``--target-lang``'s
    default. Settings the decoder does not implement raise ``UnsupportedGeneration``."""
    try:
        read = model_reader(model_arg(args.model))
        defaults = read_generation(read)
        if defaults is not None and args.target_lang is None and defaults.forced_bos_token_id is not None:
            args.target_lang = language_code(load_language_tokenizer(read), defaults.forced_bos_token_id)
    except (UnsupportedGeneration, HubError):  # (a hub id that cannot be fetched now will not be later)
        raise
    except (OSError, ValueError, ImportError) as e:  # (OSError: also a missing file)
        logger.debug("the model's generation settings not read (%s): the product's search defaults", e)
        return None
    return defaults


def batching_of(args: argparse.Namespace) -> str:
    """``--batching``, ``auto`` resolved: top-up, unless a shortlist (its candidate set is per batch, so
    batches decide the translations) or the batch-size tuner (it sizes batches) needs batches."""
    if args.batching != "auto":
        return args.batching
    return "batch" if args.shortlist or args.tune_batch else Policy.TOPUP.value


def device_batching(args: argparse.Namespace) -> BatchingConfig:
    """The batching of the device the decoders decode on (``decode_config.batching_for``: its batch
    size, refill threshold and static step, the CPU's or the GPU's), which a batching flag left out keeps."""
    return batching_for(on_gpu(device_of(args), args.gpus_per_decoder), precision=speedups_of(args).precision)


def scheduler_config(args: argparse.Namespace, device: BatchingConfig | None = None) -> SchedulerConfig | None:
    """``--batching``'s streaming schedule (None: length-sorted batches): the flags given over the
    ``device``'s schedule (``device_batching``)."""
    if batching_of(args) == "batch":
        return None
    device = device or device_batching(args)
    size = args.max_batch_size or device.max_batch_size
    refill = device.schedule.refill_threshold if args.refill_threshold is None else args.refill_threshold
    return replace(device.schedule, policy=Policy(batching_of(args)), max_batch_sentences=size,
                   capacity=args.capacity or size, capacity_unit=CapacityUnit(args.capacity_unit),
                   epsilon=args.epsilon, refill_threshold=refill, flush_every=args.flush_every)


def batching_config(args: argparse.Namespace) -> BatchingConfig:
    """The batching flags over the device's batching (``device_batching``): a flag given wins."""
    device = device_batching(args)
    readback = (device.static.readback_every if device.static else 0) if args.static_step is None else args.static_step
    return BatchingConfig(max_batch_size=args.max_batch_size or device.max_batch_size,
                          schedule=scheduler_config(args, device), tune=args.tune_batch,
                          static=StaticStep(readback_every=readback, late=args.late_readback) if readback else None)


def decode_config(args: argparse.Namespace, model: GenerationDefaults | None = None) -> DecodeConfig:
    """The flags' one ``DecodeConfig``: search (the flags over ``model``'s generation settings,
    ``model_generation``'s), batching, runtime, shortlist (its path as given: ``decoder_settings``
    makes it absolute for the decoders) and the row limit."""
    shortlist = ShortlistSource(args.shortlist, top_m=args.shortlist_m, top_n=args.shortlist_n) \
        if args.shortlist else None
    return DecodeConfig(search=search_config(args, model), batching=batching_config(args),
                        runtime=RuntimeConfig(device=device_of(args), threads=args.threads, speedups=speedups_of(args)),
                        shortlist=shortlist, max_row_chars=args.max_row_chars,
                        split_sentences=DEFAULTS.split_sentences if args.split_sentences is None else args.split_sentences)


def speedups_of(args: argparse.Namespace) -> CpuSpeedups:
    if args.no_speedups:
        return CpuSpeedups(int8=args.int8, bf16=args.bf16, fp16=args.fp16)
    return replace(EXACT, int8=args.int8, bf16=args.bf16, fp16=args.fp16)


def device_of(args: argparse.Namespace) -> str:
    """``--device`` as given, else cuda with ``--gpus-per-decoder``, else cpu; ``auto`` in this process
    is decided here (the GPU's defaults follow it)."""
    if args.device == "auto" and args.in_process:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return args.device or ("cuda" if args.gpus_per_decoder else "cpu")


def precision_check(args: argparse.Namespace) -> None:
    """``--int8`` where the decoders decode on a GPU (``--device cuda``, or GPUs per decoder): refused
    in one line before any work, since it would decode in float32 there."""
    device = device_of(args)
    if on_gpu(device, args.gpus_per_decoder) and not device.startswith("cuda"):
        device = "cuda"  # (auto, given GPUs: the decoders decode on theirs)
    if why := precision_refusal(speedups_of(args), device):
        raise SystemExit(f"error: {why}")


def single_file(url: str) -> bool:
    """Whether ``--output`` names one file (assembled from parts) rather than a directory of parts."""
    if url == STDIO:
        return False
    if url.endswith("/"):
        return False
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    if fs.isdir(path):
        return False
    return "." in path.rstrip("/").rsplit("/", 1)[-1].lstrip(".")


def decoder_settings(args: argparse.Namespace, decode: DecodeConfig, one_file: bool) -> DecoderSettings:
    """What the decoders are built from: the model, the output and the shortlist as absolute paths
    (``local_path``), and the signature (``DecodeConfig.signature``) naming them as given."""
    shortlist = None if decode.shortlist is None else replace(decode.shortlist, path=local_path(decode.shortlist.path))
    return DecoderSettings(model=model_arg(args.model),
                           output=local_path(args.output + ".parts" if one_file else args.output),
                           decode=replace(decode, shortlist=shortlist),
                           signature=decode.signature(args.model, source_lang=args.source_lang,
                                                      target_lang=args.target_lang),
                           parts=PartColumns(evaluate=args.evaluate, passthrough=not args.no_passthrough),
                           source_lang=args.source_lang, target_lang=args.target_lang)


def pipeline_config(args: argparse.Namespace, decode: DecodeConfig) -> PipelineConfig:
    one_file = single_file(args.output)
    settings = decoder_settings(args, decode, one_file)
    gpus = args.gpus_per_decoder or (1 if settings.decode.runtime.device.startswith("cuda") and not args.in_process else 0)
    decoders = args.decoders
    if args.min_decoders is not None or args.max_decoders is not None:
        decoders = (args.min_decoders or 1, args.max_decoders or max(args.min_decoders or 1, 1))
    columns = columns_of(args)
    return PipelineConfig(input=local_path(args.input), columns=columns, decoder=settings, unit_rows=args.unit_rows,
                          decoders=decoders, encoders=args.encoders, cpus_per_decoder=args.cpus_per_decoder,
                          gpus_per_decoder=gpus, skip_corrupt=args.skip_corrupt,
                          restart=args.restart, overwrite=args.overwrite, local_rows=2**62 if args.in_process else args.local_rows,
                          in_process=args.in_process, progress_every_s=args.progress_every,
                          health=Health(decoder_wait_s=args.decoder_wait, stall_timeout_s=args.stall_timeout),
                          assemble_to=local_path(args.output) if one_file else None, lease_ttl_s=args.lease_ttl)


def columns_of(args: argparse.Namespace) -> Columns:
    return Columns(args.text_column, args.id_column, args.reference_column, tsv_column=args.tsv_column,
                   source_lang=args.source_lang_column, target_lang=args.target_lang_column)


def model_arg(model: str) -> str:
    """``--model`` as the job takes it: a Hugging Face hub id as it is (fetched by the job,
    ``pipeline/hub.py``), a local path absolute (``local_path``)."""
    return model if hub_id(model) else local_path(model)


def local_path(url: str) -> str:
    """Absolute paths for local files, so actors find them whatever their working directory."""
    return url if url == STDIO or "://" in url or os.environ.get("RAY_JOB_ID") or os.environ.get("RAYMT_KEEP_RELATIVE") \
        else os.path.abspath(url)


JOB_ERRORS = (InputError, ModelError, PlanMismatch, OutputBusy, DecodersUnavailable, UnitsFailed, ResourcesUnavailable,
              DeviceUnavailable, JobStopped, OutputRefused, MissingExtra, LanguageError, HubError)


def run(args: argparse.Namespace, decode: DecodeConfig) -> None:
    if args.evaluate and not args.reference_column:
        raise SystemExit("error: --evaluate needs --reference-column (a Parquet input with references)")
    if args.bf16 and device_of(args) == "cpu" and bf16_refusal(detect_isa()):  # before any work
        raise SystemExit(f"error: {bf16_refusal(detect_isa())}")
    start = time.perf_counter()
    if STDIO in (args.input, args.output):
        return run_stream(args, decode, start)
    pc, result = execute(args, decode)
    print_summary(args, pc, result, time.perf_counter() - start)
    if args.report:
        from raymt.jobs.report import report
        report(pc.decoder.output, None if "://" not in args.output else "report")


def run_stream(args: argparse.Namespace, decode: DecodeConfig, start: float) -> None:
    """``--input -`` / ``--output -``: the lines translated in this process, no Ray (``pipeline/orchestration/stream.py``);
    standard output carries only translations, the summary goes to standard error."""
    if args.evaluate or args.report:
        raise SystemExit("error: --evaluate and --report need a file or directory --output, not a stream ('-')")
    with one_line_errors(args.debug):
        settings = decoder_settings(args, decode, one_file=False)
        result = translate_stream(args.input, args.output, settings.with_threads(args.threads or os.cpu_count() or 1),
                                  columns_of(args), stdin=sys.stdin.buffer, stdout=sys.stdout.buffer,
                                  overwrite=args.overwrite)
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(result.statuses.items()))
    print(f"translated {result.rows} rows ({statuses}) from {args.input} to {args.output} in "
          f"{time.perf_counter() - start:.1f}s in this process [{settings.signature}]", file=sys.stderr)


@contextlib.contextmanager
def one_line_errors(debug: bool) -> Iterator[None]:
    """A job error or a path that cannot be opened, read or written: one line, not a traceback
    (the traceback with ``--debug``)."""
    try:
        yield
    except JOB_ERRORS as e:
        if debug:
            raise
        raise SystemExit(f"error: {e}") from None
    except OSError as e:
        if debug:
            raise
        raise SystemExit(f"error: {os_error_line(e)}") from None


def execute(args: argparse.Namespace, decode: DecodeConfig) -> tuple[PipelineConfig, PipelineResult]:
    """The job itself; a job error is one line (the traceback with ``--debug``)."""
    try:
        with one_line_errors(args.debug):
            if args.report:  # the report's package is checked before the job, not after it
                require("matplotlib", "plots", "the stats report (--report)")
            pc = pipeline_config(args, decode)
            return pc, run_pipeline(pc)
    except KeyboardInterrupt:
        raise interrupted() from None


def interrupted() -> SystemExit:
    """Ctrl-C: Ray stopped here, then one line; the process is ending, so a second Ctrl-C is ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("interrupted: stopping (Ctrl-C again is ignored while Ray stops)", file=sys.stderr, flush=True)
    stop_ray()
    return SystemExit("interrupted: every committed unit is kept; rerun the same command to resume")


def print_summary(args: argparse.Namespace, pc: PipelineConfig, result: PipelineResult, seconds: float) -> None:
    """What was translated, how fast, rows not translated as given, the per-actor table and scores."""
    decode = f"decoding {result.decode_tokens_per_second:.0f} target tokens/s per decoder, " if result.stats else ""
    kernels = kernels_summary([s.kernels for s in result.stats])  # ATen where the native operators were wanted: said
    print(f"translated {result.rows} rows in {result.units} units ({result.skipped_units} already committed) "
          f"-> {args.output} in {seconds:.1f}s end to end, {result.where} ({decode}"
          f"{result.tokens_per_second:.0f} end to end){', ' + kernels if kernels else ''} [{pc.decoder.signature}]")
    if set(result.statuses) - {"ok"}:  # rows translated other than as given, or not at all: say so
        print("rows by status: " + ", ".join(f"{k} {v}" for k, v in sorted(result.statuses.items()))
              + f" (the status and reason columns of the parts in {pc.decoder.output} say which and why)")
    for path, reason in result.skipped_files:
        print(f"skipped corrupt file {path}: {reason}")
    for unit, reason in result.unreadable.items():
        print(f"unreadable unit {unit} written with status 'unreadable': {reason}")
    stats = OutputStore(pc.decoder.output).read_stats()
    if stats is not None:
        print(markdown_table(actor_table(stats)))
    if result.scores:
        print(result.scores)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.shortlist = shortlist_for(args.shortlist, args.model)  # a Marian directory's lex.s2t by default
    precision_check(args)
    try:
        model = model_generation(args)
    except (UnsupportedGeneration, HubError) as e:
        raise SystemExit(f"error: {e}") from None
    try:
        decode = decode_config(args, model)
    except ValueError as e:  # e.g. --nbest above --beam-size: a usage error in one line, not a traceback
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.tsv_column < 1:
        parser.error(f"--column {args.tsv_column}: columns are counted from 1 (as cut -f)")
    run(args, decode)


if __name__ == "__main__":
    main()
