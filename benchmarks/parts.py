"""Where each system's decoding time goes, by part, measured alike for ours and CTranslate2.

    python -m benchmarks.parts --shape opus-mt-de-en --lines 64 --threads 1 --out docs/results/parts-58k

A profiler sees only its own system's scopes, and CTranslate2 has none in its wheel, so the parts are
measured by construction, the same way for every system: whole timed runs of random-weight shapes
(``benchmarks.shapes``: EOS unreachable, every sentence decoded to ``--max-tokens``) that differ from
the full shape in one part only:

- ``vocab-8k``: the vocabulary cut to 8,001 words. Output layer (product, log-softmax, top-k: each
  linear in the vocabulary) = (t_full - t_8k) x V / (V - 8001).
- ``decoder-half``: half the decoder layers. Decoder layers = (t_full - t_half) x L / (L - L/2).
- ``encoder-half``: half the encoder layers, likewise.
- the rest = t_full - the three: embeddings, search and beam bookkeeping, the framework.

t is seconds per generated target token (``--lines`` x ``--max-tokens`` of them), the fastest of
``--repeats`` interleaved runs (the medians' figures beside it show the noise). Each part's
FLOPs per token (``benchmarks.flops.flops_by_part``) over its time gives the GFLOP/s each system
reaches in it, and its share of the ISA's measured float32 peak (``benchmarks.fma_probe``) at
``--threads``. The differences carry the runs' noise: the spread columns bound it.

Then each product of a decoder step timed alone at ``--kernel-rows`` rows in float32 and int8
(``kernel_rates``): the ratio int8 can reach on this CPU, part by part.

``--perf``: also one ``perf record`` of each system's full-shape run (its own processes only, the
timed translation only), its samples grouped by the symbol they land in (``PERF_GROUPS``): the
split of the parts above into matrix products, the row top, bookkeeping, memory traffic.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import statistics
import subprocess
import tempfile
from dataclasses import replace

import torch

from benchmarks.bench import INT8
from benchmarks.flops import flops_by_part
from benchmarks.fma_probe import isa_peak
from benchmarks.peers import OursDecoders, PeerRun, Split, ctranslate2_system, run
from benchmarks.shapes import SHAPES, Shape, build
from benchmarks.reports import SETS, read_lines, write_report
from raymt.pipeline.reports.stats_tables import markdown_table
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.core_decoder import CoreDecoder
from raymt.workers.kernels.isa import detect as detect_isa
from raymt.workers.kernels.speedups import EXACT

SYSTEMS = ("ours-exact", "ours+int8", "ct2-float32", "ct2-int8")
SMALL_VOCAB = 8001
PARTS = ("encoder", "decoder layers", "output layer")

# perf samples by the symbol (library and function) they land in; the first pattern that matches wins.
PERF_GROUPS = (
    ("output layer, fused product + row top", r"head_top|HeadTop|row_top_fused"),
    ("log-softmax, softmax, top-k", r"softmax|topk|TopK|row_top|log_softmax"),
    ("attention over the K/V caches", r"attend|self_attention|cross_attention|dot_scores|dot_product_attention"),
    ("int8: activations quantised, products dequantised", r"quantize|Quantize|requantize"),
    ("matrix products (GEMM kernels)", r"\[JIT\]|gemm|Gemm|GEMM|sgemm|fbgemm|dnnl|mkl_|small_linear|raymt_tiles|jit_|brgemm|PackB"),
    ("beam search bookkeeping", r"BeamSearch|beam_step|Beam|gather|index_select|take_along"),
    ("memory: copies, allocation, page faults", r"memmove|memcpy|memset|malloc|free|\[kernel|clear_page|_int_"),
    ("attention, norms, activations, other math", r"attention|Attention|norm|Norm|silu|swish|relu|gelu|exp|add|mul"
                                                  r"|cpu::|at::vec|native::"),
    ("Python and framework", r"python|Py|c10::|at::_ops|torch::|dispatch|libgomp|omp"),
)


def variants(shape: Shape) -> dict[str, Shape]:
    return {"full": shape, "vocab-8k": replace(shape, vocab=SMALL_VOCAB),
            "decoder-half": replace(shape, decoder_layers=shape.decoder_layers // 2),
            "encoder-half": replace(shape, encoder_layers=shape.encoder_layers // 2)}


def system(name: str, model_dir: str, threads: int, cfg: SearchConfig, translator: CoreDecoder, tmp: str,
           ct2_batch: int):
    """One system on one thread budget, one worker: ours in a decoder process, CTranslate2 in its own."""
    if name.startswith("ct2-"):
        return ctranslate2_system(model_dir, name.removeprefix("ct2-"), threads, cfg, translator, tmp,
                                  max_batch_size=ct2_batch)
    return OursDecoders(model_dir, {"ours-exact": EXACT, "ours+int8": INT8}[name], Split(1, threads), cfg)


def seconds_per_token(run_: PeerRun, tokens: int) -> tuple[float, float]:
    """(fastest, median) seconds per generated target token over the repeats: a shared machine's noise
    only ever slows a run, so the fastest is the estimate and the median shows the noise."""
    return min(run_.seconds) / tokens, statistics.median(run_.seconds) / tokens


def part_table(times: dict[tuple[str, str], tuple[float, float]], shape: Shape, flops: dict[str, float],
               peak: float, systems: list[str]) -> list[dict]:
    """Per system and part: ms per 1,000 tokens (from the fastest runs; from the medians beside it),
    share of the step, GFLOP/s and share of the peak."""
    scale = {"output layer": ("vocab-8k", shape.vocab / (shape.vocab - SMALL_VOCAB)),
             "decoder layers": ("decoder-half", shape.decoder_layers / (shape.decoder_layers - shape.decoder_layers // 2)),
             "encoder": ("encoder-half", shape.encoder_layers / (shape.encoder_layers - shape.encoder_layers // 2))}
    out = []
    for name in systems:
        full, full_median = times[(name, "full")]
        parts = {}
        for part, (variant, k) in scale.items():
            v, v_median = times[(name, variant)]
            parts[part] = ((full - v) * k, (full_median - v_median) * k)
        parts["the rest"] = (full - sum(p[0] for p in parts.values()),
                             full_median - sum(p[1] for p in parts.values()))
        for part, (sec, sec_median) in parts.items():
            row = {"system": name, "part": part, "ms_per_1k_tokens": round(sec * 1e6, 1),
                   "from_medians": round(sec_median * 1e6, 1), "share": round(sec / full, 3)}
            if part in flops:
                row["gflop_per_s"] = round(flops[part] / sec / 1e9, 1) if sec > 0 else None
                row["share_of_isa_peak"] = round(flops[part] / sec / 1e9 / peak, 3) if sec > 0 else None
            else:
                row["gflop_per_s"] = row["share_of_isa_peak"] = None
            out.append(row)
        out.append({"system": name, "part": "whole step", "ms_per_1k_tokens": round(full * 1e6, 1),
                    "from_medians": round(full_median * 1e6, 1), "share": 1.0,
                    "gflop_per_s": round(sum(flops.values()) / full / 1e9, 1),
                    "share_of_isa_peak": round(sum(flops.values()) / full / 1e9 / peak, 3)})
    return out


def step_products(shape: Shape) -> dict[str, tuple[int, int]]:
    """A decoder step's matrix products, (in, out): one of each per layer, the output layer once."""
    e = shape.d_model
    return {"self-attention q, k, v (fused)": (e, 3 * e), "attention output, cross q and o (each)": (e, e),
            "FFN in": (e, shape.ffn), "FFN out": (shape.ffn, e), "output layer": (e, shape.vocab)}


def kernel_rates(shape: Shape, rows: int, threads: int, seconds: float = 0.5) -> list[dict]:
    """GFLOP/s of each step product at ``rows`` rows, in the kernels each precision decodes with:
    float32 ``PackedLinear`` (the native ``small_linear`` where it is built) and ``Int8Linear``
    (FBGEMM; activations quantised per call, the output dequantised): what int8 can gain per product."""
    from benchmarks.peers import _best_rate
    from raymt.workers.kernels.native import load
    from raymt.workers.model.packed_linear import PackedLinear
    from raymt.workers.kernels.speedups import Int8Linear

    kernels, previous = load(), torch.get_num_threads()
    torch.set_num_threads(threads)
    out = []
    try:
        for name, (k, n) in step_products(shape).items():
            weight, x = torch.randn(n, k) * 0.02, torch.randn(rows, k)
            fp32, int8 = PackedLinear(weight, None), Int8Linear.from_weight(weight, None)
            if kernels is not None:
                fp32.use_small_kernel(kernels)
            flops = 2.0 * rows * k * n
            rate32 = _best_rate(lambda: fp32(x), flops, seconds)
            rate8 = _best_rate(lambda: int8(x), flops, seconds)
            out.append({"product": name, "rows_in_out": f"{rows} x {k} x {n}", "float32_gflop_per_s": round(rate32, 1),
                        "int8_gflop_per_s": round(rate8, 1), "int8_over_float32": round(rate8 / rate32, 2)})
    finally:
        torch.set_num_threads(previous)
    return out


def perf_groups(run_: PeerRun, lines: list[str], tmp: str, frequency: int = 999) -> list[dict]:
    """Share of ``perf record`` samples per ``PERF_GROUPS`` group over one timed translation."""
    run_.load(lines[:16])
    data = os.path.join(tmp, f"perf-{run_.name}.data")
    perf = subprocess.Popen(["perf", "record", "-q", "-F", str(frequency), "-o", data, "-p",
                             ",".join(map(str, run_.translate.pids()))], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        run_.translate(lines)
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait()
        run_.unload()
    report = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,sym", "--stdio",
                             "--percent-limit", "0"], capture_output=True, text=True).stdout
    shares: dict[str, float] = {}
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(.+?)\s+\[[.k]\]\s+(.*)", line)
        if not m:
            continue
        where = f"{m.group(2)} {m.group(3)}"
        group = next((g for g, pattern in PERF_GROUPS if re.search(pattern, where)), "other")
        shares[group] = shares.get(group, 0.0) + float(m.group(1)) / 100
    return [{"system": run_.name, "group": g, "share_of_samples": round(s, 3)}
            for g, s in sorted(shares.items(), key=lambda kv: -kv[1])]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="opus-mt-de-en", choices=sorted(SHAPES))
    p.add_argument("--data", default="../shared/data")
    p.add_argument("--set", default="multi30k", choices=sorted(SETS))
    p.add_argument("--lines", type=int, default=64)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="each system's threads (one worker)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--ct2-batch", type=int, default=64, help="CTranslate2's max_batch_size (ours: its default)")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "raymt-parts"),
                   help="where the shape checkpoints are built (once) and kept")
    p.add_argument("--kernel-rows", type=int, default=160, help="rows of the products timed alone (32 sentences "
                   "x beam 5: a full step's)")
    p.add_argument("--perf", action="store_true", help="also group perf samples of each full-shape run by symbol")
    p.add_argument("--out", default="docs/results/parts-58k")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    names, shape = args.systems.split(","), SHAPES[args.shape]
    cfg = SearchConfig(beam_size=args.beam, max_length_a=0.0, max_length_b=args.max_tokens,
                       max_decoding_length=args.max_tokens)
    lines = read_lines(os.path.join(args.data, SETS[args.set][0]), args.lines)
    runs, dirs = {}, {}
    for variant, s in variants(shape).items():
        dirs[variant] = build(s, os.path.join(args.work, f"{args.shape}-{variant}"))
        translator = CoreDecoder.load(dirs[variant], threads=args.threads)
        tmp = os.path.join(dirs[variant], "converted")
        os.makedirs(tmp, exist_ok=True)
        for name in names:
            runs[(name, variant)] = PeerRun(f"{name} {variant}", system(name, dirs[variant], args.threads, cfg,
                                                                        translator, tmp, args.ct2_batch))
    full = CoreDecoder.load(dirs["full"], threads=args.threads)
    run(list(runs.values()), lines, args.repeats)
    tokens = len(lines) * args.max_tokens  # EOS unreachable: every sentence to the cap, in every variant
    times = {key: seconds_per_token(r, tokens) for key, r in runs.items()}
    tok = full.checkpoint.tokenizer
    src_len = sum(len(tok.encode(x)) for x in lines) / len(lines)
    tgt_len = args.max_tokens + 1
    flops = flops_by_part(full.checkpoint.model.config, source_length=src_len, target_length=tgt_len,
                          fan_out=args.beam)
    peak, peak_how = isa_peak(args.threads, detect_isa())
    table = part_table(times, shape, flops, peak, names)
    report = {"shape": args.shape, "threads": args.threads, "lines": len(lines), "beam": args.beam,
              "ct2_batch": args.ct2_batch, "isa_peak_gflops": round(peak, 1), "isa_peak": peak_how,
              "mflop_per_token": {k: round(v / 1e6, 2) for k, v in flops.items()},
              "runs": [{"system": n, "variant": v, "ms_per_1k_tokens": round(t[0] * 1e6, 1),
                        "median": round(t[1] * 1e6, 1)} for (n, v), t in times.items()], "parts": table}
    md = [f"# Where the time goes, by part: {args.shape} shape\n",
          f"{len(lines)} {args.set} lines, beam {args.beam}, every sentence to {args.max_tokens} tokens; each system "
          f"on {args.threads} thread(s), one worker (CTranslate2 at max_batch_size {args.ct2_batch}, ours at its "
          f"default); the fastest of {args.repeats} interleaved runs (the median beside it). ISA peak {peak:.0f} GFLOP/s = {peak_how}. "
          "Method: `benchmarks/parts.py` (shape variants that differ in one part).\n",
          "MFLOP per target token: " + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in flops.items()) + "\n",
          "## Each variant's time\n", markdown_table(report["runs"]), "",
          "## Parts\n", markdown_table(table), ""]
    kernels = kernel_rates(shape, args.kernel_rows, args.threads)
    report["kernels"] = kernels
    md += [f"## The step's products, alone ({args.kernel_rows} rows, {args.threads} thread(s))\n",
           markdown_table(kernels), ""]
    if args.perf:
        groups = [row for name in names for row in perf_groups(runs[(name, "full")], lines, args.work)]
        report["perf"] = groups
        md += ["## perf samples by symbol group (full shape, one run each)\n", markdown_table(groups), ""]
    write_report(args.out, report, md)


if __name__ == "__main__":
    main()
