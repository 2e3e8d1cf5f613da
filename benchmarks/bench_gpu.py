"""GPU throughput: ours vs HF ``generate`` on one device, same model and input, and the papers'
batching tables on our engine.

    python -m benchmarks.bench_gpu --data data-gpu --out docs/results/gpu-h100               # on a GPU machine
    python -m benchmarks.bench_gpu --lines 24 --beams 2 --hf-batches 8 --capacities 8 \\
        --tables peers --out /tmp/gpu-smoke                                        # smoke (CPU in CI)

Runs where only torch, transformers, sentencepiece, safetensors, sacrebleu and pyarrow are
installed (GPU machines without Ray, no CTranslate2). The device is ``--device`` (auto: the
first CUDA device, else the CPU) and is named in the report with torch's own description of it.
Per set and beam: HF at each ``--hf-batches`` (length-sorted batches) and ours (top-up, refilling
at the GPU's default threshold) at each ``--capacities``, dynamic and (on a GPU) static step, the
largest capacity's static step also read back every step and read a step late -> target tokens/s,
BLEU, peak device memory; the ratio ours-best / HF-best.
``--tables batching`` adds the papers' tables (benchmarks/bench_batching.py: FIXED / VAR-BATCH /
VAR-STREAM / VAR-STR-FIFO at k=5 and 50; mini-batch / maxi-batch / top-up) on the same device.
``--tables topup`` adds the top-up paper's mini-batch / maxi-batch / top-up table; ``--tables search``
the shortlist on/off x pruning on/off table at beam 14 (``--shortlist``: a lex.s2t or .vmap table,
built where eflomal runs, e.g. ``python -m raymt.jobs.build_shortlist``; without it, pruning only);
``--tables output`` the output step alone: ATen's log-softmax + top-k against the fused Triton
kernels (workers/kernels/triton_ops.py), each against the bytes-moved floor (reading the logits once at the
device's measured copy bandwidth); and one layer's self-attention step: ATen's gathered copy
against the Triton kernel reading through the ancestry in place, against its floor; and one
layer's cross-attention step: ATen over the step's longest source (a static step's: the cache's
whole capacity) against the Triton kernel reading each row's own source (``benchmarks/kernels.py``).
The output-step table runs at vocabularies 8k, 32k and 58k (``--output-vocabs``: OPUS-MT's sizes).
``--synthetic-base`` adds a randomly initialised transformer-base-shaped model (d 512, 6+6
layers, vocabulary 32k, seeded), loaded as a checkpoint is, so it runs the engine's operators for
the device (the Triton kernels on a GPU), dynamic and static step, for GEMM-bound throughput (ours
only: no reference outputs).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace

import sacrebleu
import torch

from benchmarks.bench_batching import Run, run_all, systems, table, targets, topup_systems, topup_table
from benchmarks.kernels import attention_rows, output_step_rows, source_attention_rows
from benchmarks.reports import SETS, read_lines, write_report
from raymt.pipeline.reports.stats_tables import markdown_table
from raymt.workers.config import ModelConfig, PruningConfig, SearchConfig
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.device import GPU_DEFAULTS, resolve_device
from raymt.workers.decoder.engine import StaticStep
from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
from raymt.workers.kernels.speedups import EXACT, CpuSpeedups
from raymt.workers.decoder.core_decoder import CoreDecoder

logger = logging.getLogger(__name__)


@dataclass
class Measured:
    system: str
    seconds: list[float] = field(default_factory=list)
    tokens: int = 0
    texts: list[str] = field(default_factory=list)
    peak_mb: float = 0.0
    steps: int = 0  # decoder steps of one run (ours; HF: 0, not counted)
    error: str = ""  # why it has no figures (out of memory at this size: a row that says so, not a crash)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn) -> tuple[float, object, float]:
    """(seconds, result, peak device memory in MB over the call; 0 on the CPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    return time.perf_counter() - start, out, peak


def hf_runner(model_dir: str, device: torch.device, dtype: torch.dtype):
    """HF ``MarianMTModel.generate`` on ``device``: (lines, beam, batch size) -> (texts, target tokens)."""
    import transformers

    tok = transformers.MarianTokenizer.from_pretrained(model_dir)
    model = transformers.MarianMTModel.from_pretrained(model_dir, dtype=dtype).to(device).eval()

    def translate(lines: list[str], beam: int, batch_size: int) -> tuple[list[str], int]:
        order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
        out, tokens = [""] * len(lines), 0
        for start in range(0, len(order), batch_size):
            idx = order[start: start + batch_size]
            batch = tok([lines[i] for i in idx], return_tensors="pt", padding=True).to(device)
            with torch.inference_mode():
                seqs = model.generate(**batch, num_beams=beam, max_new_tokens=256, do_sample=False,
                                      bad_words_ids=[[model.config.pad_token_id]])
            tokens += int((seqs[:, 1:] != model.config.pad_token_id).sum())  # generated, EOS included
            for i, text in zip(idx, tok.batch_decode(seqs, skip_special_tokens=True)):
                out[i] = text
        return out, tokens
    return translate


def ours_runner(translator: CoreDecoder, static: StaticStep | None = None, refill_threshold: float = 0.5):
    """Our engine, top-up batching at a capacity: (lines, beam, capacity) -> (texts, target tokens).
    ``static``: the one-shape step, captured as a CUDA graph on a GPU (``raymt.workers.decoder.engine.StaticStep``)."""
    tok = translator.checkpoint.tokenizer

    def translate(lines: list[str], beam: int, capacity: int) -> tuple[list[str], int]:
        batching = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=capacity, capacity=capacity,
                                   refill_threshold=refill_threshold)
        cfg = SearchConfig(beam_size=beam, max_length_a=0.0, max_length_b=256)  # HF's max_new_tokens=256
        decoded = translator.decode_ids(translator.encode(lines), DecodeRequest(cfg, schedule=batching, static=static))
        stats = decoded.stats
        return [tok.decode(list(h[0].tokens)) for h in decoded.hypotheses], stats.target_tokens, stats.steps
    return translate


def measure(name: str, device: torch.device, run, lines: list[str], repeats: int) -> Measured:
    m = Measured(name)
    try:
        run(lines[:16])  # warm-up (allocator, kernels), excluded
        for _ in range(repeats):
            seconds, result, peak = timed(device, lambda: run(lines))
            m.texts, m.tokens, m.steps = (*result, 0)[:3]
            m.seconds.append(seconds)
            m.peak_mb = max(m.peak_mb, peak)
    except torch.OutOfMemoryError as e:
        logging.warning("%s: out of memory (%s)", name, str(e).splitlines()[0])
        m.error = "out of memory"
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return m


def rows_of(measured: list[Measured], refs: list[str] | None) -> list[dict]:
    """One row per system; one that ran out of memory keeps its row, its figures None."""
    return [{"system": m.system + (f" ({m.error})" if m.error else ""),
             "tokens_per_s": round(m.tokens / statistics.median(m.seconds), 1) if m.seconds else None,
             "target_tokens": m.tokens,
             "bleu": round(sacrebleu.corpus_bleu(m.texts, [refs]).score, 2) if refs and m.texts else None,
             "peak_device_mb": round(m.peak_mb, 1), "median_s": round(statistics.median(m.seconds), 3) if m.seconds else None,
             "ms_per_step": round(1e3 * statistics.median(m.seconds) / m.steps, 3) if m.steps and m.seconds else None}
            for m in measured]


def synthetic_translator(model_dir: str, device: torch.device, speedups: CpuSpeedups, directory: str,
                         vocab: int = 32000) -> CoreDecoder:
    """A seeded, randomly initialised transformer-base-shaped model (d 512, 6+6 layers, ``vocab``
    target ids) written to ``directory`` with ``model_dir``'s tokenizer files and loaded as any
    checkpoint is (``CoreDecoder.load``): on a GPU it runs the engine's GPU operators (the Triton
    kernels), as the product does."""
    from raymt.workers.checkpoints.checkpoint import config_from_hf, save_checkpoint
    from raymt.workers.model.model import MarianModel

    with open(os.path.join(model_dir, "config.json")) as f:
        mc = config_from_hf(json.load(f))
    torch.manual_seed(0)
    model = MarianModel(ModelConfig(vocab_size=vocab, decoder_vocab_size=vocab, d_model=512,
                                    pad_token_id=mc.pad_token_id, eos_token_id=mc.eos_token_id,
                                    decoder_start_token_id=mc.decoder_start_token_id))
    files = {}
    for name in ("source.spm", "target.spm", "vocab.json"):
        with open(os.path.join(model_dir, name), "rb") as f:
            files[name] = f.read()
    save_checkpoint(directory, model, files, dtype=torch.float16)
    return CoreDecoder.load(directory, device=device, speedups=speedups)


def synthetic_runner(demo: CoreDecoder, base: CoreDecoder, static: StaticStep | None = None):
    """The synthetic base model fed the demo tokenizer's ids (mod its vocabulary); outputs are capped
    at 1.5 x source + 10 tokens (a random model rarely ends by itself) and only counted, never
    detokenised. ``static``: the one-shape step (a CUDA graph on a GPU)."""
    vocab = base.checkpoint.model.config.decoder_vocab_size

    def translate(lines: list[str], beam: int, capacity: int) -> tuple[list[str], int, int]:
        sources = sorted(([i % vocab for i in ids] for ids in demo.encode(lines)), key=len)
        cfg = SearchConfig(beam_size=beam, max_length_a=1.5, max_length_b=10)
        batching = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=capacity, capacity=capacity)
        stats = base.decode_ids(sources, DecodeRequest(cfg, schedule=batching, static=static)).stats
        return [""] * len(lines), stats.target_tokens, stats.steps
    return translate


def search_runs(translator: CoreDecoder, beam: int, n: int, shortlist_path: str | None) -> list[Run]:
    """Shortlist on/off x pruning on/off, top-up batching, beam ``beam``: the papers' GPU search table."""
    exact = SearchConfig(beam_size=beam, max_length_a=1.5, max_length_b=10, max_decoding_length=256)
    pruned = replace(exact, pruning=PruningConfig(delta=1.5, mc=min(5, beam)))
    topup = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=n, capacity=n)
    runs = [Run("exact", exact, topup), Run("pruning", pruned, topup)]
    if shortlist_path:
        from raymt.pipeline.decoders.shortlist_files import load_shortlist  # (fsspec: installed beside transformers)
        short = load_shortlist(shortlist_path, translator.checkpoint.tokenizer, top_m=10, top_n=100,
                               special_ids=translator.special_target_ids())
        runs += [Run("shortlist", exact, topup, shortlist=short), Run("shortlist + pruning", pruned, topup, shortlist=short)]
    return runs


def output_tables(args: argparse.Namespace, device: torch.device, translator: CoreDecoder, report: dict,
                  md: list[str]) -> None:
    """The output step alone at each ``--output-vocabs`` (OPUS-MT's sizes: where the fused top-k
    matters), then one layer's self- and cross-attention step alone; each table written as it ends."""
    counts = [int(n) for n in args.output_rows.split(",")]
    bandwidth = 0.0
    for vocab in map(int, args.output_vocabs.split(",")):
        rows, bandwidth = output_step_rows(device, vocab, counts)
        report["tables"][f"output-step/vocab{vocab}"] = {"rows": rows, "copy_bytes_per_s": bandwidth}
        md += [f"## The output step alone: log-softmax + top-10 over {vocab} columns (copy bandwidth "
               f"{bandwidth / 1e9:.0f} GB/s; floor = the logits read once)\n", markdown_table(rows), ""]
        write_report(args.out, report, md, echo=False)
    rows = attention_rows(device, translator.checkpoint.model, counts, [16, 64], 257, bandwidth)
    report["tables"]["self-attention-step"] = {"rows": rows}
    md += ["## One layer's self-attention step alone: each row over its history, through the ancestry "
           "(t = 257: a static step's capacity; floor = each row's K/V prefix read once)\n", markdown_table(rows), ""]
    write_report(args.out, report, md, echo=False)
    rows = source_attention_rows(device, translator.checkpoint.model, [max(1, n // 5) for n in counts],
                                 [24, 64], 256, 5, bandwidth)
    report["tables"]["cross-attention-step"] = {"rows": rows}
    md += ["## One layer's cross-attention step alone: 5 rows a slot over a source of `length` tokens in a cache of "
           "256 (s: the positions ATen reads; floor = each slot's K/V read once)\n", markdown_table(rows), ""]
    write_report(args.out, report, md, echo=False)


def synthetic_table(args: argparse.Namespace, device: torch.device, translator: CoreDecoder, speedups: CpuSpeedups,
                    report: dict, md: list[str]) -> None:
    """The synthetic base-size model on WMT22, beam 5, through the engine's real operators for
    ``device``: the dynamic step and the static step (a CUDA graph on a GPU) at each capacity."""
    lines = read_lines(os.path.join(args.data, SETS["wmt22"][0]), args.synthetic_lines or args.lines)
    with tempfile.TemporaryDirectory(prefix="synthetic-base-") as directory:
        base = synthetic_translator(args.model, device, speedups, directory)
    kernels = type(base.checkpoint.model.ops).__name__
    runners = {"": synthetic_runner(translator, base),
               "static ": synthetic_runner(translator, base, StaticStep(readback_every=args.readback_every))}
    measured = [measure(f"ours synthetic-base {kind}top-up {c}", device, lambda x, c=c, r=run: r(x, 5, c), lines,
                        args.repeats)
                for kind, run in runners.items() for c in map(int, args.capacities.split(","))]
    report["tables"]["synthetic-base/beam5"] = {"rows": rows_of(measured, None), "step_ops": kernels}
    md += [f"## synthetic transformer-base (d 512, 6+6, vocab 32k), WMT22, beam 5, step operators {kernels}; "
           f"static: read back every {args.readback_every}\n", markdown_table(rows_of(measured, None)), ""]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/demo-de-en")
    p.add_argument("--data", default="../shared/data", help="holds multi30k/ and wmt22/ as ../shared/data does")
    p.add_argument("--sets", default="multi30k,wmt22")
    p.add_argument("--lines", type=int, default=0)
    p.add_argument("--beams", default="5,1")
    p.add_argument("--hf-batches", default="32,128,512")
    p.add_argument("--capacities", default="128,512,1024", help="ours: top-up capacities in sentences")
    p.add_argument("--device", default="auto")
    half = p.add_mutually_exclusive_group()
    half.add_argument("--bf16", action="store_true", help="ours and HF in bfloat16 (log-softmax and scores stay float32)")
    half.add_argument("--fp16", action="store_true", help="ours and HF in float16 (log-softmax and scores stay float32)")
    p.add_argument("--tables", default="peers,batching,topup,search,output",
                   help="peers (ours vs HF); the papers' tables: batching, topup, search; output (the output step alone)")
    p.add_argument("--batching-beams", default="5,50", help="beams of the papers' batching tables")
    p.add_argument("--batch-sentences", type=int, default=32, help="n of the papers' batching tables")
    p.add_argument("--search-beam", type=int, default=14, help="beam of the shortlist x pruning table")
    p.add_argument("--shortlist", help="lex.s2t / .vmap table for the search table (M=10, N=100); none: pruning only")
    p.add_argument("--output-rows", default="160,640,2560", help="rows of the output-step table")
    p.add_argument("--output-vocabs", default="8000,32000,58101",
                   help="vocabularies of the output-step table (the demo's 8k; 32k; OPUS-MT de-en's 58k)")
    p.add_argument("--synthetic-base", action="store_true")
    p.add_argument("--synthetic-lines", type=int, default=0, help="WMT22 lines of the synthetic table (0: --lines)")
    p.add_argument("--static", action="store_true", help="also the static step where there is no GPU (eager)")
    p.add_argument("--readback-every", type=int, default=GPU_DEFAULTS.static_step,
                   help="the static step's outcome read back every N steps (also every step, at the largest capacity)")
    p.add_argument("--refill-threshold", type=float, default=GPU_DEFAULTS.refill_threshold,
                   help="ours: top-up refills once this share of the slots is empty (the GPU's default)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="docs/results/gpu")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    device = resolve_device(args.device)
    half = CpuSpeedups(bf16=args.bf16, fp16=args.fp16)
    dtype = half.dtype
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    speedups = half if device.type == "cuda" else replace(EXACT, bf16=args.bf16, fp16=args.fp16)
    translator = CoreDecoder.load(args.model, device=device, speedups=speedups)
    refill = args.refill_threshold
    ours, hf = ours_runner(translator, refill_threshold=refill), hf_runner(args.model, device, dtype)
    graphed = ours_runner(translator, static=StaticStep(readback_every=args.readback_every), refill_threshold=refill)
    every_step = ours_runner(translator, static=StaticStep(readback_every=1), refill_threshold=refill)
    late = ours_runner(translator, static=StaticStep(readback_every=args.readback_every, late=True),
                       refill_threshold=refill)
    report = {"device": name, "torch": torch.__version__, "dtype": str(dtype), "model": args.model, "tables": {}}
    md = [f"# GPU benchmark on {name} (torch {torch.__version__}, {dtype}), model `{args.model}`\n"]
    for set_name in args.sets.split(","):
        lines = read_lines(os.path.join(args.data, SETS[set_name][0]), args.lines)
        refs = read_lines(os.path.join(args.data, SETS[set_name][1]), args.lines)
        for beam in map(int, args.beams.split(",")):
            if "peers" not in args.tables:
                break
            measured = [measure(f"hf batch {b}", device, lambda x, b=b: hf(x, beam, b), lines, args.repeats)
                        for b in map(int, args.hf_batches.split(","))]
            measured += [measure(f"ours top-up {c}", device, lambda x, c=c: ours(x, beam, c), lines, args.repeats)
                         for c in map(int, args.capacities.split(","))]
            if device.type == "cuda" or args.static:  # the static step: a CUDA graph replayed on a GPU
                every = args.readback_every
                measured += [measure(f"ours static top-up {c} (read back every {every})", device,
                                     lambda x, c=c: graphed(x, beam, c), lines, args.repeats)
                             for c in map(int, args.capacities.split(","))]
                c = max(map(int, args.capacities.split(",")))
                if every != 1:
                    measured.append(measure(f"ours static top-up {c} (read back every step)", device,
                                            lambda x: every_step(x, beam, c), lines, args.repeats))
                measured.append(measure(f"ours static top-up {c} (read back every {every}, a step late)", device,
                                        lambda x: late(x, beam, c), lines, args.repeats))
            rows = rows_of(measured, refs)
            best = {who: max((r for r in rows if r["system"].startswith(who) and r["tokens_per_s"]),
                             key=lambda r: r["tokens_per_s"], default={"system": "none", "tokens_per_s": None})
                    for who in ("hf", "ours")}
            ratio = round(best["ours"]["tokens_per_s"] / best["hf"]["tokens_per_s"], 2) \
                if best["ours"]["tokens_per_s"] and best["hf"]["tokens_per_s"] else None
            report["tables"][f"{set_name}/beam{beam}"] = {"rows": rows, "ours_best_over_hf_best": ratio}
            md += [f"## {set_name}, beam {beam}, {len(lines)} lines\n", markdown_table(rows), "",
                   f"ours best / HF best = {ratio} ({best['ours']['system']} vs {best['hf']['system']})", ""]
            write_report(args.out, report, md, echo=False)  # each table as it ends: a timed-out run keeps them
        batched = replace(translator, max_batch_size=args.batch_sentences)  # FIXED / mini / maxi-batch: n sentences
        if "batching" in args.tables:
            for beam in map(int, args.batching_beams.split(",")):
                runs = systems(beam, args.batch_sentences, 1 / 6, 256)
                subset = lines if beam < 20 else lines[:100]
                run_all(batched, subset, runs, args.repeats)
                rows = table(runs, refs[:len(subset)], "FIXED")
                report["tables"][f"{set_name}/batching/beam{beam}"] = {"rows": rows, "targets": targets(rows)}
                md += [f"## {set_name}, papers' batching table, k={beam}, {len(subset)} lines\n", markdown_table(rows), ""]
                write_report(args.out, report, md, echo=False)
        if "topup" in args.tables:
            beam = int(args.batching_beams.split(",")[0])
            runs = topup_systems(beam, args.batch_sentences, 256)
            run_all(batched, lines, runs, args.repeats)
            rows = topup_table(runs, refs)
            report["tables"][f"{set_name}/topup/beam{beam}"] = {"rows": rows}
            md += [f"## {set_name}, top-up paper's table, k={beam}, n={args.batch_sentences}, {len(lines)} lines\n",
                   markdown_table(rows), ""]
            write_report(args.out, report, md, echo=False)
        if "search" in args.tables:
            runs = search_runs(translator, args.search_beam, args.batch_sentences, args.shortlist)
            run_all(batched, lines, runs, args.repeats)
            rows = table(runs, refs, "exact")
            report["tables"][f"{set_name}/search/beam{args.search_beam}"] = {"rows": rows, "shortlist": args.shortlist}
            md += [f"## {set_name}, shortlist x pruning, k={args.search_beam}, top-up n={args.batch_sentences}, "
                   f"{len(lines)} lines (shortlist: {args.shortlist or 'none given'})\n", markdown_table(rows), ""]
            write_report(args.out, report, md, echo=False)
    if "output" in args.tables:
        output_tables(args, device, translator, report, md)
    if args.synthetic_base:
        synthetic_table(args, device, translator, speedups, report, md)
    write_report(args.out, report, md)


if __name__ == "__main__":
    main()
