"""Speed against the peers: ours (exact, best) vs CTranslate2 (float32, int8) vs HF generate.

    python -m benchmarks.bench --model models/demo-de-en --out docs/results/peers            # full (slow)
    python -m benchmarks.bench --sets multi30k --lines 64 --beams 2 --repeats 1 --out /tmp/peers   # smoke
    python -m benchmarks.bench --best-split --systems ours-exact,ours+int8,ct2-float32,ct2-int8 --profile ""  # splits
    python -m benchmarks.bench --model ../shared/models/base-de-en --pad-vocab 58101 --out /tmp/peers-58k  # OPUS-MT's V

Same model, input, beam, length penalty and thread count for every system, in one process,
interleaved; model loading and a warm-up batch are excluded. Reports target tokens/s (median and
spread), ours/CT2 and ours/HF ratios, sacreBLEU, peak-RSS growth, FLOPs per target token, achieved
GFLOP/s and its share of two peaks, and (``--profile``) where ours' time goes by phase
(``benchmarks/step_profile.py``). Writes ``<out>.md`` and ``<out>.json``.

``--pad-vocab N``: every system runs a copy of ``--model`` whose vocabulary is padded to N words that
are never chosen (``tools/pad_vocab.py``): the same translations at a realistic output-layer size.

``--best-split``: each peer also at every way to spend the ``--threads`` cores, workers x threads
(2 cores: 1x2 and 2x1), and the best of each. CTranslate2: ``inter_threads`` x ``intra_threads`` in
one process, at every ``--batch-sizes`` (its sub-batches run on the workers at once); ours: that
many decoder processes (as Ray actors are), each a translator on its threads and its share of the
lines (``benchmarks.peers.OursDecoders``), at the translator's batch size. Every split measured is
listed, interleaved like the main table, then the best per system and the ratios of the bests.

The peaks: the measured GEMM peak (``benchmarks.peers.gemm_probe``: the faster of torch's default
matmul and oneDNN's prepacked kernel, 1024^3, best of 5 windows) and the ISA's peak, cores
(``--threads``) x GHz x float32 FLOP/cycle (``raymt.workers.kernels.isa``: 2 FMA units x 16 lanes x 2 on
AVX-512, x 8 lanes on AVX2), measured by an FMA loop on registers (``benchmarks.fma_probe``): the
clock the cores really run, which /proc/cpuinfo under a hypervisor does not give (its nominal
2.6 GHz put the "peak" below the GEMM probe). Where the probe cannot be built, the clock read from
cpufreq or /proc/cpuinfo, named in the report.
An AVX2-only CPU is emulated on an AVX-512 one for every system alike (torch, oneDNN, MKL and
CTranslate2): ``CT2_FORCE_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 RAYMT_NATIVE_MARCH=x86-64-v3`` before the command.
"""
from __future__ import annotations

import argparse
import logging
import os
from dataclasses import replace
from typing import Callable

import torch

from benchmarks.peers import (
    OursDecoders,
    PeerRun,
    ctranslate2_system,
    gemm_probe,
    hf_system,
    ours,
    rows,
    run,
    splits,
    work_dir,
)
from benchmarks.reports import SETS, read_lines, write_report
from raymt.pipeline.reports.stats_tables import markdown_table
from raymt.pipeline.decoders.shortlist_files import load_shortlist
from benchmarks.step_profile import step_breakdown
from tools.pad_vocab import pad as pad_vocab
from raymt.workers.config import PruningConfig, SearchConfig
from raymt.workers.decoder.engine import DecodeStats
from benchmarks.flops import flops_per_target_token
from benchmarks.fma_probe import isa_peak
from raymt.workers.kernels.isa import bf16_refusal, theoretical_peak_gflops
from raymt.workers.kernels.isa import detect as detect_isa
from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
from raymt.workers.kernels.speedups import EXACT, CpuSpeedups
from raymt.workers.decoder.core_decoder import CoreDecoder

# The speed configuration's pruning: ap 2.5, the one within 0.2 BLEU of exact on the trained base model (int8:
# ap 2.5 42.26, rp 0.6 41.73, rp 0.8 41.36, none 42.24; docs/results/quality-base-speed-config.md).
BEST_PRUNING = PruningConfig(ap=2.5)
INT8 = replace(EXACT, int8=True)



def measured_isa_peak(threads: int, isa) -> tuple[float, str]:
    """``benchmarks.fma_probe.isa_peak``, or the theoretical peak at the reported clock where it cannot be built."""
    try:
        return isa_peak(threads, isa)
    except Exception as err:  # no compiler: the nominal clock, said so
        logging.getLogger(__name__).warning("FMA probe unavailable (%s): ISA peak at the reported clock", err)
        return theoretical_peak_gflops(threads, isa)


def add_flops(table: list[dict], translator: CoreDecoder, lines: list[str], beam: int, peak: float,
              fan_out: float, isa_peak: float = 0.0) -> None:
    tok = translator.checkpoint.tokenizer
    src_len = sum(len(tok.encode(x)) for x in lines) / len(lines)
    for row in table:
        tgt_len = row["target_tokens"] / len(lines) + 1
        fpt = flops_per_target_token(translator.checkpoint.model.config, source_length=src_len,
                                     target_length=tgt_len, fan_out=fan_out if row["system"] == "ours-best" else beam)
        row["mflop_per_token"] = round(fpt / 1e6, 2)
        row["gflop_per_s"] = round(fpt * row["tokens_per_s"] / 1e9, 2)
        row["share_of_gemm_peak"] = round(fpt * row["tokens_per_s"] / 1e9 / peak, 4)
        if isa_peak > 0:
            row["share_of_isa_peak"] = round(fpt * row["tokens_per_s"] / 1e9 / isa_peak, 4)


BASELINE = ("baseline: fp32 torch layers, per-sentence cached cross-attn K/V, growing time-major self-attn cache, "
            "warm heap (process-wide)")
SPEEDUP_STEPS = (("ours-plain", BASELINE),
                 ("ours+qkv", "+ fused QKV projection"), ("ours+onednn", "+ oneDNN-prepacked linear layers"),
                 ("ours-exact", "+ native fused log-softmax/top-k and attention operators (the default)"),
                 ("ours+int8", "+ int8 linear layers and output layer (per-channel weights)"),
                 ("ours+bf16", "+ bfloat16 weights and activations (instead of int8)"))


POLICIES = {"ours-topup": Policy.TOPUP, "ours-var-stream": Policy.VAR_STREAM, "ours-fifo": Policy.FIFO}
RATIOS = (("ours-topup", "ours-exact"), ("ours-var-stream", "ours-exact"), ("ours-fifo", "ours-exact"),
          ("ours-exact", "ct2-float32"), ("ours-exact-k", "ct2-float32"), ("ours+int8", "ct2-int8"),
          ("ours-best", "ct2-int8"), ("ours-best", "ct2-int8-vmap"), ("ours-exact", "hf"), ("ours-best", "hf"), ("ct2-float32", "hf"))
SAME_OUTPUT = (*((name, "ours-exact") for name in POLICIES), ("ours-exact", "hf"), ("ours-exact-k", "ct2-float32"),
               ("ours-plain", "ours-exact"), ("ours-unfused-head", "ours-exact"))


def identical_outputs(systems: list) -> dict[str, int]:
    """Lines translated identically by pairs that should agree (same search, float32)."""
    by_name = {s.name: s.outputs for s in systems}
    return {f"{a} = {b}": sum(x == y for x, y in zip(by_name[a], by_name[b]))
            for a, b in SAME_OUTPUT if a in by_name and b in by_name}


def loaded(args: argparse.Namespace, opts: CpuSpeedups) -> CoreDecoder:
    return CoreDecoder.load(args.model, threads=args.threads, speedups=opts)


def unfused_head(translator: CoreDecoder) -> CoreDecoder:
    """``translator`` with its output layer run as the product, then the row top (the (N, V) logits
    written and read again), instead of the fused pass: what the fused output layer gains."""
    head = translator.checkpoint.model.vocab_head  # (the full vocabulary's: this system runs no shortlist)
    if getattr(head, "top_kernel", None) is not None:
        head.top_kernel = None
    return translator


def int8_head(translator: CoreDecoder) -> CoreDecoder:
    """An int8 ``translator`` with its full output layer as the int8 product, then the row top, instead
    of the float32 product fused with the row top (``Int8Linear.float_top``): what the fused pass gains."""
    translator.checkpoint.model.vocab_head.float_top = None
    return translator


def speedup_rows(table: list[dict]) -> list[dict]:
    """The cumulative speed-up table from the systems that ran: tokens/s, speed-up, BLEU change."""
    by_name = {r["system"]: r for r in table}
    steps = [(name, label) for name, label in SPEEDUP_STEPS if name in by_name]
    if not steps or steps[0][0] != "ours-plain":
        return []
    base = by_name["ours-plain"]
    return [{"step": label, "tokens_per_s": by_name[n]["tokens_per_s"],
             "speedup": round(by_name[n]["tokens_per_s"] / base["tokens_per_s"], 3),
             "bleu": by_name[n]["bleu"], "bleu_change": round(by_name[n]["bleu"] - base["bleu"], 2)} for n, label in steps]


SPLIT_SPEEDUPS = {"ours-exact": EXACT, "ours+int8": INT8, "ours-best": INT8}
SPLIT_RATIOS = (("ours-exact", "ct2-float32"), ("ours+int8", "ct2-int8"), ("ours+int8", "ct2-float32"),
                ("ours-best", "ct2-int8-vmap"), ("ours-best", "ct2-int8"))
CT2_SYSTEMS = {"ct2-float32": ("float32", False), "ct2-int8": ("int8", False), "ct2-int8-vmap": ("int8", True)}


def split_systems(args: argparse.Namespace, cfg: SearchConfig, translator: CoreDecoder, tmp: str) -> list[PeerRun]:
    """Every system named in ``--systems`` that has a split grid, at every split (and CT2 batch size);
    ours-best with ``--shortlist`` and its pruning, ct2-int8-vmap with the same table as a vocabulary map."""
    names = args.systems.split(",")
    best = (replace(cfg, pruning=BEST_PRUNING), (args.shortlist, args.shortlist_m, 100) if args.shortlist else None)
    out = []
    for split in splits(args.threads):
        out += [PeerRun(f"{name} {split}", OursDecoders(args.model, SPLIT_SPEEDUPS[name], split,
                                                        *(best if name == "ours-best" else (cfg,))))
                for name in names if name in SPLIT_SPEEDUPS]
        out += [PeerRun(f"{name} {split} b{batch}", ctranslate2_system(
                    args.model, CT2_SYSTEMS[name][0], split.threads, cfg, translator, tmp, max_batch_size=batch,
                    inter_threads=split.workers, vmap=vmap_of(args, tmp) if CT2_SYSTEMS[name][1] else None))
                for name in names if name in CT2_SYSTEMS
                for batch in map(int, args.batch_sizes.split(","))]
    return out


def vmap_of(args: argparse.Namespace, tmp: str) -> str:
    """``--shortlist`` as a CTranslate2 vocabulary map: the table itself when it is a ``.vmap``, else
    written once beside the converted models, cut at ``--shortlist-m`` translations per source piece
    and the 100 frequent pieces ours-best uses (the same candidate sets for both)."""
    if not args.shortlist:
        raise SystemExit("ct2-int8-vmap needs --shortlist (the table ours-best uses)")
    if args.shortlist.endswith(".vmap"):
        return args.shortlist
    from raymt.pipeline.decoders.shortlist_files import load_table, save_table

    tok = CoreDecoder.load(args.model).checkpoint.tokenizer
    path = os.path.join(tmp, f"shortlist-m{args.shortlist_m}.vmap")
    if not os.path.exists(path):
        save_table(path, load_table(args.shortlist, tok), tok, top_m=args.shortlist_m, top_n=100)
    return path


def best_split_table(systems: list[PeerRun], lines: list[str], refs: list[str], repeats: int,
                     count: Callable[[str], int]) -> tuple[dict, list[str]]:
    """Time every split (interleaved), then the best per system and the ratios of the bests."""
    run(systems, lines, repeats)
    table = []
    for row in rows(systems, refs, count):
        row.pop("peak_rss_growth_mb")  # (every split runs in child processes: the bench's own RSS says nothing)
        system, split, *batch = row.pop("system").split(" ")
        table.append({"system": system, "split": split, "batch": batch[0].removeprefix("b") if batch else "-", **row})
    best: dict[str, dict] = {}
    for row in table:
        if row["system"] not in best or row["tokens_per_s"] > best[row["system"]]["tokens_per_s"]:
            best[row["system"]] = row
    ratios = {f"best {a} / best {b}": round(best[a]["tokens_per_s"] / best[b]["tokens_per_s"], 3)
              for a, b in SPLIT_RATIOS if a in best and b in best}
    md = ["#### Every split (workers x threads; CTranslate2: inter x intra threads, batch)\n", markdown_table(table), "",
          "#### Best split per system\n", markdown_table(list(best.values())), "",
          "Ratios of the bests: " + ", ".join(f"{k} = {v}" for k, v in ratios.items()), ""]
    return {"rows": table, "best": list(best.values()), "ratios": ratios}, md


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/demo-de-en")
    p.add_argument("--data", default="../shared/data")
    p.add_argument("--sets", default="multi30k,wmt22")
    p.add_argument("--lines", type=int, default=0)
    p.add_argument("--beams", default="1,5")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--shortlist", help="table for ours-best (lex.s2t or .vmap); none: pruning only")
    p.add_argument("--shortlist-m", type=int, default=50, help="ours-best's translations per source token: with "
                   "rp 0.6 and int8 together, M=10 cost 0.41 BLEU on Multi30k beam 5, M=50 0.13")
    p.add_argument("--systems", default="ours-plain,ours+qkv,ours+onednn,ours-exact,ours-exact-k,ours+int8,ours+bf16,ours-best,"
                   "ct2-float32,ct2-int8,hf", help="ours-plain, ours+qkv, ours+onednn, ours-exact, ours+int8: the cumulative CPU speed-ups "
                   "(workers/kernels/speedups.py); ours-unfused-head: ours-exact with its output layer's product and log-softmax + top-k "
                   "as two passes; ours+int8-int8-head: ours+int8 with its output layer's int8 product, then the top-k (not fused in float32); ours+bf16: bfloat16 instead of int8; ours-exact-k: ours-exact stopping "
                   "at K finished hypotheses, CTranslate2's rule (HF early_stopping=True); ours-best: int8 + ap 2.5 "
                   "pruning + --shortlist; ours-topup, ours-var-stream, ours-fifo: ours-exact under that streaming "
                   "policy over the length-sorted input (32 sentences), against batch decoding (ours-exact)")
    p.add_argument("--profile", default="ours-exact,ours-best",
                   help="systems (ours-*) whose run is profiled by phase after the timing (empty: none)")
    p.add_argument("--best-split", action="store_true", help="also run ours-exact, ours+int8, ct2-float32 and "
                   "ct2-int8 (those of --systems) at every workers x threads split of --threads, and report the best of each")
    p.add_argument("--batch-sizes", default="32,64,128", help="CTranslate2's max_batch_size values under --best-split")
    p.add_argument("--max-tokens", type=int, default=256, help="every system's cap on generated tokens per sentence "
                   "(a shape checkpoint of benchmarks.shapes, whose EOS is unreachable, decodes every sentence to it)")
    p.add_argument("--pad-vocab", type=int, default=0, help="benchmark a copy of --model padded to this many words "
                   "that are never chosen (tools/pad_vocab.py; 58101: opus-mt-de-en's vocabulary)")
    p.add_argument("--out", default="docs/results/peers")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    tmp, source_model = work_dir(), args.model
    padded = f" padded to {args.pad_vocab} words" if args.pad_vocab else ""
    if args.pad_vocab:
        args.model = pad_vocab(args.model, os.path.join(tmp, f"padded-{args.pad_vocab}"), args.pad_vocab)
    torch.set_num_threads(args.threads)
    translator = loaded(args, EXACT)
    best_translator, best_stats = loaded(args, INT8), DecodeStats()  # its own stats: the fan-out of ours-best
    shortlist = None
    if args.shortlist:
        shortlist = load_shortlist(args.shortlist, translator.checkpoint.tokenizer, top_m=args.shortlist_m, top_n=100,
                                   special_ids=translator.special_target_ids())
    probe, isa = gemm_probe(args.threads), detect_isa()
    peak, (isa_peak, isa_how) = probe.peak, measured_isa_peak(args.threads, isa)
    report = {"model": source_model + padded, "threads": args.threads, "repeats": args.repeats, "gemm_peak_gflops": round(peak, 1),
              "gemm_probe": {"torch_matmul": round(probe.torch_matmul, 1), "onednn": round(probe.onednn, 1)},
              "isa": isa.describe(), "isa_peak_gflops": round(isa_peak, 1), "isa_peak": isa_how,
              "best": {"pruning": BEST_PRUNING.signature(), "shortlist": args.shortlist}, "tables": {}}
    md = [f"# Peer benchmark\n\nmodel `{source_model}`{padded}, {args.threads} threads, median of {args.repeats} interleaved "
          f"runs; {isa.describe()}; GEMM probe {peak:.0f} GFLOP/s (torch matmul {probe.torch_matmul:.0f}, oneDNN "
          f"{probe.onednn:.0f}); ISA peak {isa_peak:.0f} GFLOP/s = {isa_how}. Ratios are within one run.\n"]
    count = lambda text: len(translator.checkpoint.tokenizer.target_spm.encode(text))  # noqa: E731
    for beam in map(int, args.beams.split(",")):
        cfg = SearchConfig(beam_size=beam, max_length_a=0.0, max_length_b=args.max_tokens,
                           max_decoding_length=args.max_tokens)
        best = replace(cfg, pruning=BEST_PRUNING)
        factories = {"ours-exact": lambda: ours(translator, cfg), "ours-best": lambda: ours(best_translator, best, shortlist, best_stats),
                     "ours-unfused-head": lambda: ours(unfused_head(loaded(args, EXACT)), cfg),
                     "ours+int8-int8-head": lambda: ours(int8_head(loaded(args, INT8)), cfg),
                     "ours-exact-k": lambda: ours(translator, replace(cfg, early_stopping=True)),
                     "ours-plain": lambda: ours(loaded(args, CpuSpeedups()), cfg),
                     "ours+qkv": lambda: ours(loaded(args, CpuSpeedups(fused_qkv=True)), cfg),
                     "ours+onednn": lambda: ours(loaded(args, replace(EXACT, native=False)), cfg),
                     "ours+int8": lambda: ours(loaded(args, INT8), cfg),
                     "ours+bf16": lambda: ours(loaded(args, replace(EXACT, bf16=True)), cfg),
                     "ct2-float32": lambda: ctranslate2_system(args.model, "float32", args.threads, cfg, translator, tmp),
                     "ct2-int8": lambda: ctranslate2_system(args.model, "int8", args.threads, cfg, translator, tmp),
                     "ct2-int8-vmap": lambda: ctranslate2_system(args.model, "int8", args.threads, cfg, translator, tmp,
                                                                 vmap=vmap_of(args, tmp)),
                     "hf": lambda: hf_system(args.model, cfg),
                     **{name: (lambda p=policy: ours(translator, cfg, batching=SchedulerConfig(
                         policy=p, max_batch_sentences=translator.max_batch_size,
                         capacity=translator.max_batch_size))) for name, policy in POLICIES.items()}}
        names = args.systems.split(",")
        if "ours+bf16" in names and (why := bf16_refusal(detect_isa())):  # AVX2-only CPUs: no bf16 GEMMs
            print(f"skipping ours+bf16: {why}")
            names.remove("ours+bf16")
        systems = [PeerRun(name, factories[name]()) for name in names]
        for name in args.sets.split(","):
            lines = read_lines(os.path.join(args.data, SETS[name][0]), args.lines)
            refs = read_lines(os.path.join(args.data, SETS[name][1]), args.lines)
            for s in systems:
                s.seconds.clear()
            rows_before, tokens_before = best_stats.row_steps, best_stats.target_tokens
            run(systems, lines, args.repeats)
            fan_out = (best_stats.row_steps - rows_before) / max(best_stats.target_tokens - tokens_before, 1)
            table = rows(systems, refs, count)
            add_flops(table, translator, lines, beam, peak, fan_out, isa_peak)
            by_name = {r["system"]: r["tokens_per_s"] for r in table}
            ratios = {f"{a} / {b}": round(by_name[a] / by_name[b], 3) for a, b in RATIOS
                      if a in by_name and b in by_name}
            same = identical_outputs(systems)
            report["tables"][f"{name}/beam{beam}"] = {"rows": table, "ratios": ratios, "identical_outputs": same}
            md += [f"## {name}, beam {beam}\n", markdown_table(table), "",
                   "Ratios: " + ", ".join(f"{k} = {v}" for k, v in ratios.items()), "",
                   "Identical outputs (lines): " + ", ".join(f"{k} {v}/{len(lines)}" for k, v in same.items()), ""]
            for system in [s for s in systems if s.name in args.profile.split(",")]:
                phases = step_breakdown(system.translate, lines)
                report["tables"][f"{name}/beam{beam}/profile/{system.name}"] = phases
                md += [f"### Where the time goes: {system.name}, {name}, beam {beam} (shares of one profiled run)\n",
                       markdown_table(phases), ""]
            if args.best_split:
                report["tables"][f"{name}/beam{beam}/splits"], split_md = best_split_table(
                    split_systems(args, cfg, translator, tmp), lines, refs, args.repeats, count)
                md += [f"### Thread splits, {name}, beam {beam}\n", *split_md]
            steps = speedup_rows(table)
            if len(steps) > 1:
                report["tables"][f"{name}/beam{beam}/speedups"] = steps
                md += [f"### CPU speed-ups, cumulative (Devlin Table 1 form), {name}, beam {beam}\n",
                       markdown_table(steps), ""]
    write_report(args.out, report, md)


if __name__ == "__main__":
    main()
