"""The translate command's flags, grouped as ``--help`` shows them: what a user sets first (model,
input, output, beam, n-best, device, decoders, threads), then input columns, search, precision,
shortlist, scheduling and batching, the Ray cluster and fault tolerance; research knobs (beam
pruning, VAR-STREAM's refill) last. Every decoding default is read from
``raymt.workers.decoder.decode_config``'s one table, the one ``Translator`` decodes with too, and every
cluster and fault default from the pipeline's configs (``PipelineConfig``, ``Health``), the ones
the driver runs with. The search flags (``--beam-size``, the length flags, ``--length-penalty``,
``--early-stopping``) default to None, so that a flag left out takes an M2M100 / NLLB model's own
generation setting (``raymt.workers.checkpoints.generation``) and a flag given wins.
"""
from __future__ import annotations

import argparse
import dataclasses
import re

from raymt.pipeline.orchestration.dispatch import Health
from raymt.pipeline.orchestration.settings import ACTOR_THREADS, PipelineConfig
from raymt.pipeline.orchestration.units import CPU_UNIT_ROWS, GPU_UNIT_ROWS, GPU_UNIT_SHARE, MIN_UNIT_ROWS
from raymt.pipeline.inputs.workunit import Columns
from raymt.workers.config import (FAST_PRUNING, MAX_BEAM_SIZE, MAX_SAMPLING_TEMPERATURE, MIN_SAMPLING_TEMPERATURE,
                                  NUM_SAMPLES, SamplingConfig)
from raymt.workers.decoder.decode_config import DEFAULTS, SCHEDULE, SHORTLIST
from raymt.workers.decoder.device import CPU_DEFAULTS, CPU_INT8_AMX_DEFAULTS, GPU_DEFAULTS
from raymt.workers.decoder.scheduler import CapacityUnit, Policy

SEARCH = DEFAULTS.search
SAMPLING = SamplingConfig()
GENERATION = "the model's generation_config.json (M2M100 / NLLB)"


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default in its help line (a flag without
    one, or whose default depends on the device, says so in its own words)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def default_of(config: type, name: str):
    """The default of field ``name`` of a config dataclass (``PipelineConfig``, ``Health``, ``Columns``):
    the cluster, fault and column flags read the pipeline's one table of defaults, as the search flags
    read ``DEFAULTS``."""
    return next(f.default for f in dataclasses.fields(config) if f.name == name)


def device_name(text: str) -> str:
    """``--device``'s form (whether the GPU is there is checked where it decodes)."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"{text!r}: expected auto, cpu, cuda or cuda:N")
    return text


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)
    add_user_flags(p)
    add_input_flags(p.add_argument_group("input and output columns"))
    add_search_flags(p.add_argument_group("search"))
    add_sampling_flags(p.add_argument_group("sampling instead of beam search (e.g. back-translation data); any of these "
                                            "but --sampling-seed turns it on"))
    add_precision_flags(p.add_argument_group("precision and CPU speed-ups"))
    add_shortlist_flags(p.add_argument_group("shortlist vocabulary (Shi & Knight 2017); see raymt.jobs.build_shortlist"))
    add_batching_flags(p.add_argument_group("scheduling and batching (every policy gives the same translations)"))
    add_cluster_flags(p.add_argument_group("Ray cluster"))
    add_fault_flags(p.add_argument_group("fault tolerance and resume"))
    add_research_flags(p.add_argument_group("research: beam pruning (Freitag & Al-Onaizan 2017; Yang et al. 2020) "
                                            "and VAR-STREAM refilling; all off by default"))
    return p


def add_user_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory, fsspec URL or hub id (org/name[@revision])")
    p.add_argument("--input", required=True, help="a text file (a sentence a line), .tsv, .csv (a header row), "
                   ".jsonl, each also .gz/.bz2/.xz/.zst, a .parquet file, or a directory / prefix of them (local or "
                   "URL); '-': standard input, translated in this process without Ray")
    p.add_argument("--output", required=True, help="a directory (ends in '/', exists, or has no extension) or one "
                   "file: .parquet, .jsonl, .tsv, else text (Marian n-best lines with --nbest > 1), the text ones "
                   "also .gz/.bz2/.xz/.zst; .csv, .json, .xlsx, ... are refused; '-': standard output (text)")
    p.add_argument("--source-lang", help="M2M100 / NLLB-200 models (required there): the source language code, "
                   "e.g. deu_Latn (NLLB) or de (M2M100)")
    p.add_argument("--target-lang", help="M2M100 / NLLB-200 models (required there): the target language code, "
                   "forced as each translation's first token, e.g. fra_Latn (NLLB) or fr (M2M100)")
    p.add_argument("--beam-size", type=int, help=f"beam width, 1 to {MAX_BEAM_SIZE} (1: greedy); default: "
                   f"{GENERATION}, else {SEARCH.beam_size}")
    p.add_argument("--nbest", type=int, help="hypotheses kept per sentence (<= beam size; sampling: <= --num-samples): "
                   "a list column in .parquet / .jsonl, 'K ||| hypothesis ||| F0= score ||| score' lines in text; "
                   f"default {SEARCH.num_hypotheses}, with sampling --num-samples")
    p.add_argument("--device", type=device_name, metavar="{auto,cpu,cuda,cuda:N}",
                   help="where each decoder decodes (default: cuda with --gpus-per-decoder, else cpu). A GPU that "
                        "is not there is an error, never a silent CPU fallback. On Ray, cuda reserves one GPU "
                        "per decoder actor unless --gpus-per-decoder says otherwise")
    p.add_argument("--decoders", type=int, default=default_of(PipelineConfig, "decoders"),
                   help="decoder actors (0: as many as the cluster's cores allow)")
    p.add_argument("--threads", type=int, default=DEFAULTS.runtime.threads, help="torch intra-op threads per decoder "
                   f"(0: all cores in-process, {ACTOR_THREADS} per decoder actor on Ray)")


def add_input_flags(g) -> None:
    g.add_argument("--text-column", "--text-field", dest="text_column", default=default_of(Columns, "text"),
                   help="the Parquet / CSV column or JSONL field to translate")
    g.add_argument("--id-column", "--id-field", dest="id_column",
                   help="the Parquet / CSV column or JSONL field of ids; default: 'id' when present, else the row "
                        "number (a row without its own id in an input with ids: 'row:<row number>')")
    g.add_argument("--max-row-chars", type=int, default=DEFAULTS.max_row_chars, metavar="N",
                   help="a row of more characters is not translated: an empty translation with status too_long and "
                        "its length as the reason (a document or data blob, not a sentence or paragraph, would hold "
                        "its decoder for minutes to hours); 0: no limit")
    g.add_argument("--split-sentences", action=argparse.BooleanOptionalAction, default=None,
                   help="a row of several sentences (a paragraph, a post) is cut into them by the source language's "
                        "rules, each translated on its own and rejoined with the whitespace between them, status "
                        "'split' (a one-sentence row is unchanged); default: on for translate, off for distill "
                        "(a bitext row is one training pair)")
    g.add_argument("--source-lang-column", "--source-lang-field", dest="source_lang_column",
                   help="M2M100 / NLLB: a Parquet column or JSONL field of per-row source languages (an empty one: "
                        "--source-lang)")
    g.add_argument("--target-lang-column", "--target-lang-field", dest="target_lang_column",
                   help="M2M100 / NLLB: a Parquet column or JSONL field of per-row target languages (an empty one: "
                        "--target-lang); rows of different languages are decoded together")
    g.add_argument("--column", dest="tsv_column", type=int, default=default_of(Columns, "tsv_column"), metavar="N",
                   help="a .tsv input's column to translate, 1-based as in cut -f (Mozilla-style src<TAB>trg: 1)")
    g.add_argument("--no-passthrough", action="store_true",
                   help="leave the input's other columns (Parquet, CSV) or fields (JSONL) out of the output; by default "
                        "they are kept beside the translation (one renamed input_<name> where the output has the name)")
    g.add_argument("--reference-column", help="references for --evaluate")
    g.add_argument("--evaluate", action="store_true", help="sacreBLEU BLEU and chrF against --reference-column")
    g.add_argument("--report", action="store_true",
                   help="after the job, render the per-actor stats as <output>.report.png / .html (jobs/report.py)")


def add_search_flags(g) -> None:
    """Every search flag left out takes the model's own generation setting (an M2M100 / NLLB directory's
    generation_config.json, ``workers/checkpoints/generation.py``), else the product's default (None: not given)."""
    g.add_argument("--length-penalty", type=float,
                   help=f"score / length ** penalty (HF semantics); default: {GENERATION}, else "
                        f"{SEARCH.length_penalty}")
    g.add_argument("--max-length", type=int, help=f"absolute cap on generated tokens; default: {GENERATION}: "
                   f"max_length - 1 or max_new_tokens, else {SEARCH.max_decoding_length}")
    g.add_argument("--max-length-a", type=float, help=f"per-sentence cap a * source_length + b; default "
                   f"{SEARCH.max_length_a} (0 where {GENERATION} gives a length)")
    g.add_argument("--max-length-b", type=int, help=f"see --max-length-a; default {SEARCH.max_length_b} (the cap "
                   f"where {GENERATION} gives a length)")
    g.add_argument("--early-stopping", action=argparse.BooleanOptionalAction,
                   help="HF's early_stopping: a sentence is done once it holds --beam-size finished hypotheses, "
                        f"not once none of its running beams can beat them; default: {GENERATION}, else off")


def add_sampling_flags(g) -> None:
    """Random sampling (``SamplingConfig``), as CTranslate2's ``sampling_*`` and Marian's
    ``--output-sampling`` offer; None: not given."""
    g.add_argument("--sampling-temperature", type=float, metavar="T",
                   help=f"sample from softmax(log-probs / T), T in [{MIN_SAMPLING_TEMPERATURE:g}, "
                   f"{MAX_SAMPLING_TEMPERATURE:g}]: colder is greedy, hotter uniform (default {SAMPLING.temperature:g} "
                   "once sampling is on)")
    g.add_argument("--sampling-topk", type=int, metavar="K", help="sample among each step's K most likely tokens, "
                   f"an integer >= 0 (default {SAMPLING.topk}; 0: all, 1: greedy)")
    g.add_argument("--sampling-topp", type=float, metavar="P", help="then among the fewest most likely tokens holding "
                   f"P of the probability, P in (0, 1] (nucleus sampling; default {SAMPLING.topp:g}; 1: all)")
    g.add_argument("--num-samples", type=int, metavar="N", help=f"samples drawn per row, 1 to {MAX_BEAM_SIZE} "
                   f"(default {NUM_SAMPLES}; each holds decoder memory as a beam does), all kept as its n-best list "
                   "unless --nbest keeps fewer, best first; the translation is the best of them")
    g.add_argument("--sampling-seed", type=int, default=SAMPLING.seed, help="a row's samples are a function of the seed, its "
                   "source text and target language: the same however rows are batched, split into units or resumed")


def add_precision_flags(g) -> None:
    precision = g.add_mutually_exclusive_group()  # alternatives: float32 (default), int8, bf16 or fp16
    precision.add_argument("--int8", action="store_true", help="int8 dynamic quantisation of the linear layers (CPU; "
                           "measured in docs/results/peers-*.md: faster, BLEU within quantisation noise)")
    precision.add_argument("--bf16", action="store_true", help="bfloat16 weights and activations (instead of --int8; "
                           "fast where the CPU has AVX512-BF16/AMX, BLEU within noise). On a CPU without bf16 GEMMs "
                           "(AVX2-only: AMD Zen 2/3, older Intel) it is refused with one line before any work)")
    precision.add_argument("--fp16", action="store_true", help="float16 weights and activations (for GPUs without bf16: "
                           "T4, V100; log-softmax and scores stay float32)")
    g.add_argument("--no-speedups", action="store_true", help="plain torch layers: no fused QKV, no oneDNN packing")


def add_shortlist_flags(g) -> None:
    g.add_argument("--shortlist", help="lex.s2t (with its .freq) or CTranslate2 .vmap file (M2M100 / NLLB: or a "
                   "directory of per-target-language <code>.s2t tables, raymt build-shortlist --target-lang); "
                   "default: the lex.s2t of a "
                   "Marian model directory, when it has one (none: decode without a shortlist)")
    g.add_argument("--shortlist-m", type=int, default=SHORTLIST.top_m, help="top translations kept per source token "
                   f"({SHORTLIST.top_m}: the fastest within 0.3 BLEU, docs/results/search.md)")
    g.add_argument("--shortlist-n", type=int, default=SHORTLIST.top_n, help="most frequent target tokens always kept")


def add_batching_flags(g) -> None:
    g.add_argument("--max-batch-size", type=int, help="sentences per decoding batch (the streaming slots); default "
                   f"{CPU_DEFAULTS.max_batch_size} on the CPU ({CPU_INT8_AMX_DEFAULTS.max_batch_size} for --int8 on "
                   f"AMX tiles), {GPU_DEFAULTS.max_batch_size} on a GPU, fitted there to free memory "
                   "(workers/decoder/device.py)")
    g.add_argument("--batching", choices=["auto", "batch", *[x.value for x in Policy]], default="auto",
                   help="batch: length-sorted batches decoded to the end; otherwise that streaming policy. auto: "
                        "topup (1.2x batch on WMT22's long-tailed lengths), or batch with --shortlist or "
                        "--tune-batch, which work per batch")
    g.add_argument("--refill-threshold", type=float,
                   help=f"topup: refill once this share is empty (default {CPU_DEFAULTS.refill_threshold:g} on the CPU, "
                        f"{GPU_DEFAULTS.refill_threshold:g} on a GPU)")
    g.add_argument("--capacity", type=int, default=0, help="streaming capacity (0: --max-batch-size sentences)")
    g.add_argument("--capacity-unit", choices=[x.value for x in CapacityUnit], default=SCHEDULE.capacity_unit.value,
                   help="what --capacity counts")
    g.add_argument("--tune-batch", action="store_true",
                   help="closed-loop batch size from measured throughput and free memory, starting at "
                        "--max-batch-size; a batch that runs out of memory is split and retried")
    g.add_argument("--static-step", type=int, metavar="N",
                   help="the one-shape decoder step, captured once as a CUDA graph on a GPU and replayed, its "
                        "results read back every N steps (0: the dynamic step). Same outputs; on the CPU it only "
                        f"costs. Default {CPU_DEFAULTS.static_step} on the CPU, {GPU_DEFAULTS.static_step} on a GPU")
    g.add_argument("--late-readback", action="store_true",
                   help="the static step's results read one step late, once the next step is queued, so the GPU "
                        "runs it while the host frees and refills slots (same outputs; slots refill a step later). "
                        "Only with the static step (--static-step N > 0, a GPU's default)")
    g.add_argument("--unit-rows", type=int,
                   help="rows per work unit: the commit / resume grain, and the decoder sorts by length within it. "
                        f"Default: what the output's plan used when resuming; else at most {CPU_UNIT_ROWS} on the CPU, "
                        f"and on a GPU 1/{GPU_UNIT_SHARE} of the input within {GPU_UNIT_ROWS[0]}..{GPU_UNIT_ROWS[1]} "
                        "(a GPU's slots drain at each unit's end: docs/results/occupancy.md); units are cut equal, at "
                        f"least one per decoder where the input has {MIN_UNIT_ROWS} rows for each")


def add_cluster_flags(g) -> None:
    g.add_argument("--in-process", action="store_true", help="no Ray: decode in this process (same worker code)")
    g.add_argument("--local-rows", type=int, default=default_of(PipelineConfig, "local_rows"),
                   help="with no cluster address (RAY_ADDRESS), inputs of at most this many rows are decoded in "
                        "this process instead of starting Ray (0: always Ray)")
    g.add_argument("--min-decoders", type=int, help="autoscaling pool: at least this many decoder actors")
    g.add_argument("--max-decoders", type=int, help="autoscaling pool: at most this many decoder actors")
    g.add_argument("--encoders", type=int, default=default_of(PipelineConfig, "encoders"), help="encoder (tokeniser) actors; 0: decoders tokenise")
    g.add_argument("--cpus-per-decoder", type=float, default=default_of(PipelineConfig, "cpus_per_decoder"),
                   help="CPUs reserved per decoder (0: --threads)")
    g.add_argument("--gpus-per-decoder", type=float, default=default_of(PipelineConfig, "gpus_per_decoder"),
                   help="GPUs reserved per decoder actor; each decodes on the GPU Ray assigns it (--device cuda)")
    g.add_argument("--progress-every", type=float, default=default_of(PipelineConfig, "progress_every_s"), help="seconds between progress lines")


def add_fault_flags(g) -> None:
    g.add_argument("--restart", action="store_true",
                   help="the output was started by another plan (input, model, search, --unit-rows): discard its "
                        "parts and translate afresh instead of refusing")
    g.add_argument("--overwrite", action="store_true",
                   help="replace an existing --output file that raymt did not write (its parts folder holds no "
                        "record of it), or write into a non-empty folder holding no raymt output (its files are "
                        "kept); without it both are refused")
    g.add_argument("--skip-corrupt", action="store_true",
                   help="an unreadable Parquet file is skipped (reported) and a unit whose rows cannot be read "
                        "is written as rows with status 'unreadable', instead of failing the job")
    g.add_argument("--lease-ttl", type=float, default=default_of(PipelineConfig, "lease_ttl_s"),
                   help="seconds this job's hold on the output outlives it if it is paused, cut off or killed on "
                        "another node; a job paused past it has lost the output and stops without writing")
    g.add_argument("--decoder-wait", type=float, default=default_of(Health, "decoder_wait_s"),
                   help="seconds the job waits with no decoder actor ready (cluster full, GPUs missing, actors "
                        "crashing) before it fails naming the units left; rerunning resumes")
    g.add_argument("--stall-timeout", type=float, default=default_of(Health, "stall_timeout_s"),
                   help="a decoder actor with work that returns nothing for this many seconds is killed and "
                        "restarted; its units are sent again. An encoder stream that delivers nothing this long "
                        "while every decoder waits is given up: its units go to the decoders untokenised")
    g.add_argument("--debug", action="store_true", help="on a job error, the full traceback instead of one line")


def add_research_flags(g) -> None:
    g.add_argument("--rp", type=float, help="relative threshold: drop p(cand) <= rp * p(best)")
    g.add_argument("--ap", type=float, help="absolute threshold: drop log p(cand) <= log p(best) - ap")
    g.add_argument("--rpl", type=float, help="relative local threshold on the last word's probability")
    g.add_argument("--mc", type=int, help="max candidates per node (same history)")
    g.add_argument("--delta", type=float, help="absolute threshold against the best candidate, finished ones included")
    g.add_argument("--early-stop", action="store_true", help="drop beams below the best finished hypothesis")
    g.add_argument("--fast", action="store_true", help="the measured fast pruning (raymt.workers.config.FAST_PRUNING: "
                   f"{FAST_PRUNING.signature()}) unless heuristics are given explicitly; see docs/results/search.md")
    g.add_argument("--epsilon", type=float, default=SCHEDULE.epsilon, help="var-stream refill threshold")
    g.add_argument("--flush-every", type=int, default=SCHEDULE.flush_every,
                   help="var-stream: expand all sentences every N steps")
