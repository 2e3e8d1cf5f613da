"""End to end on Ray, as a Ray user runs it: our job, our Ray Data operator, and Ray Data with
CTranslate2 or HF generate, on one corpus, one model, one beam, one machine.

    python -m benchmarks.bench_ray_e2e --model ../shared/models/base-de-en --lines 3000 --ct2-batch 64 \\
        --out docs/results/ray-e2e                                         # full (minutes, quiet machine)
    python -m benchmarks.bench_ray_e2e --lines 40 --small 4 --systems job-float32,ct2-int8 --out /tmp/e2e   # smoke

Every run is a fresh process, timed from its start to its output written, so Ray's start-up,
actor start and model load are inside it, as a user waits for them:

* ``job-*``: ``python -m raymt.jobs.translate --local-rows 0`` (on Ray even when small), ``--decoders
  W --threads T``, int8 with ``--int8``;
* ``op-*``: ``ray.data.read_parquet -> repartition -> map_batches(raymt.ray_data.Translate) -> write_parquet``
  (the repartition into ``--batch``-row blocks, at least two per actor, spreads a one-file corpus over
  every actor);
* ``ct2-*``: the same Ray Data pipeline with a class holding ``ctranslate2.Translator`` (inter 1,
  intra T threads per actor, ``--ct2-batch`` sentences per batch), sentencepiece pieces in and out;
* ``hf-float32``: the same with HF ``MarianMTModel.generate`` (``--hf-lines`` lines: it is slow).

Each system runs twice, on ``--small`` lines and on the corpus: the small job's wall time is its
start-up (what a 10-line job costs), and the steady state is the difference of the two,
``(tokens_big - tokens_small) / (seconds_big - seconds_small)``, which cancels start-up and model
load. Target tokens are counted the same way for every system (the target sentencepiece model's
pieces + EOS of each output line); BLEU is sacreBLEU against the corpus' references. Every system
gets the same split of the cores: ``--split WxT`` (W actors of T threads; CTranslate2's best on two
cores is 2x1).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.reports import SETS, read_lines, write_report
from raymt.pipeline.reports.stats_tables import markdown_table

CAP = 256  # CTranslate2's and HF's cap on generated tokens unless --max-tokens
SYSTEMS = ("job-float32", "job-int8", "op-float32", "op-int8", "ct2-float32", "ct2-int8", "hf-float32")


class Ct2Translate:
    """Ray Data callable: ``text`` -> ``translation`` with CTranslate2 (pieces + ``</s>`` in, as its docs do)."""

    def __init__(self, ct2_dir: str, model_dir: str, threads: int, beam: int, batch: int, max_tokens: int = CAP) -> None:
        import ctranslate2
        import sentencepiece as spm
        self.src = spm.SentencePieceProcessor(model_file=os.path.join(model_dir, "source.spm"))
        self.tgt = spm.SentencePieceProcessor(model_file=os.path.join(model_dir, "target.spm"))
        self.ct2 = ctranslate2.Translator(ct2_dir, device="cpu", inter_threads=1, intra_threads=threads)
        self.beam, self.batch, self.max_tokens = beam, batch, max_tokens

    def __call__(self, batch: pa.Table) -> pa.Table:
        pieces = [self.src.encode(t, out_type=str) + ["</s>"] for t in batch.column("text").to_pylist()]
        results = self.ct2.translate_batch(pieces, beam_size=self.beam, max_batch_size=self.batch,
                                           max_decoding_length=self.max_tokens)
        return batch.append_column("translation", pa.array([self.tgt.decode(r.hypotheses[0]) for r in results]))


class HfTranslate:
    """Ray Data callable: ``text`` -> ``translation`` with HF transformers' ``generate``."""

    def __init__(self, model_dir: str, threads: int, beam: int, max_tokens: int = CAP) -> None:
        import torch
        from transformers import MarianMTModel, MarianTokenizer
        torch.set_num_threads(threads)
        self.tok = MarianTokenizer.from_pretrained(model_dir)
        self.model = MarianMTModel.from_pretrained(model_dir).eval()
        self.beam, self.max_tokens = beam, max_tokens

    def __call__(self, batch: pa.Table) -> pa.Table:
        import torch
        enc = self.tok(batch.column("text").to_pylist(), return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = self.model.generate(**enc, num_beams=self.beam, max_new_tokens=self.max_tokens)
        return batch.append_column("translation", pa.array(self.tok.batch_decode(out, skip_special_tokens=True)))


def ray_data_run(args: argparse.Namespace) -> None:
    """A child process: one Ray Data pipeline over ``--input`` into ``--output``."""
    import ray
    from raymt.ray_data import Translate
    workers, threads = map(int, args.split.split("x"))
    ray.init(num_cpus=os.cpu_count(), logging_level="ERROR", include_dashboard=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    kind, compute = args.child.split("-")
    if kind == "op":
        fn, kwargs = Translate, {"model": args.model, "threads": threads, "compute_type": compute}
    elif kind == "ct2":
        fn, kwargs = Ct2Translate, {"ct2_dir": f"{args.work}/ct2-{compute}", "model_dir": args.model,
                                    "threads": threads, "beam": args.beam, "batch": args.ct2_batch,
                                    "max_tokens": args.max_tokens}
    else:
        fn, kwargs = HfTranslate, {"model_dir": args.model, "threads": threads, "beam": args.beam,
                                   "max_tokens": args.max_tokens}
    if kind == "op":
        from raymt.workers.config import SearchConfig
        kwargs["search"] = SearchConfig(beam_size=args.beam, **({} if args.max_tokens == CAP else dict(
            max_length_a=0.0, max_length_b=args.max_tokens, max_decoding_length=args.max_tokens)))
    # One Parquet file reads as one block, and Ray Data hands a block's batches to one actor: without
    # the repartition one actor translated all 3000 rows while the other idled (CTranslate2 float32
    # 543 target tokens/s end to end against 970 for the same two 1-thread translators in one process).
    rows = pq.ParquetFile(args.input).metadata.num_rows
    blocks = max(2 * workers, -(-rows // args.batch))
    # actors take half a CPU each, so Ray Data's read and write tasks always find one
    ray.data.read_parquet(args.input).repartition(blocks) \
        .map_batches(fn, fn_constructor_kwargs=kwargs, concurrency=workers, num_cpus=0.5, batch_size=args.batch,
                     batch_format="pyarrow") \
        .write_parquet(args.output)


def run_system(system: str, args: argparse.Namespace, src: str, out: str) -> float:
    """Wall seconds of one fresh process translating ``src`` into ``out``."""
    workers, threads = map(int, args.split.split("x"))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "RAY_DEDUP_LOGS": "0"}
    if system.startswith("job-"):
        cmd = [sys.executable, "-m", "raymt.jobs.translate", "--model", args.model, "--input", src, "--output", out,
               "--local-rows", "0", "--decoders", str(workers), "--threads", str(threads), "--beam-size",
               str(args.beam), *(["--int8"] if system == "job-int8" else []),
               *([] if args.max_tokens == CAP else ["--max-length", str(args.max_tokens), "--max-length-a", "0",
                                                    "--max-length-b", str(args.max_tokens)])]
    else:
        cmd = [sys.executable, "-m", "benchmarks.bench_ray_e2e", "--child", system, "--input", src, "--output", out,
               "--model", args.model, "--work", args.work, "--split", args.split, "--beam", str(args.beam),
               "--batch", str(args.batch), "--ct2-batch", str(args.ct2_batch), "--max-tokens", str(args.max_tokens)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"{system} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def read_output(out: str, job: bool) -> list[str]:
    table = pq.read_table(out)
    if job:
        return table.sort_by("row").column("translation").to_pylist()
    return table.sort_by("id").column("translation").to_pylist()


def write_corpus(path: str, texts: list[str]) -> None:
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), path, row_group_size=500)


def convert_ct2(model: str, work: str) -> None:
    for compute in ("float32", "int8"):
        subprocess.run([sys.executable, "-m", "ctranslate2.converters.transformers", "--model", model,
                        "--output_dir", f"{work}/ct2-{compute}", "--quantization", compute, "--force"],
                       check=True, capture_output=True)


def measure(system: str, args: argparse.Namespace, texts: list[str], refs: list[str], count) -> dict:
    import sacrebleu
    lines = texts[: args.hf_lines] if system.startswith("hf") else texts
    runs = {}
    for name, part in (("small", lines[: args.small]), ("big", lines)):
        src, out = f"{args.work}/{system}-{name}.parquet", f"{args.work}/out-{system}-{name}"
        write_corpus(src, part)
        seconds = run_system(system, args, src, out)
        hyps = read_output(out, system.startswith("job"))
        assert len(hyps) == len(part), f"{system}: {len(hyps)} rows out of {len(part)}"
        runs[name] = (seconds, sum(count(h) for h in hyps), hyps)
    (s_small, t_small, _), (s_big, t_big, hyps) = runs["small"], runs["big"]
    steady = (t_big - t_small) / max(s_big - s_small, 1e-9)
    bleu = sacrebleu.corpus_bleu(hyps, [refs[: len(hyps)]]).score
    return {"system": system, "lines": len(lines), "small_job_s": round(s_small, 1), "job_s": round(s_big, 1),
            "target_tokens": t_big, "steady_tokens_per_s": round(steady, 1), "bleu": round(bleu, 2)}


def ray_start_seconds() -> float:
    code = "import time, ray; t = time.perf_counter(); ray.init(num_cpus=2, include_dashboard=False); " \
           "print(time.perf_counter() - t); ray.shutdown()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/demo-de-en")
    p.add_argument("--data", default="../shared/data")
    p.add_argument("--set", default="multi30k", choices=sorted(SETS))
    p.add_argument("--lines", type=int, default=4000)
    p.add_argument("--small", type=int, default=10, help="lines of the small job (start-up)")
    p.add_argument("--hf-lines", type=int, default=400)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--split", default="2x1", help="W actors x T threads, the same for every system")
    p.add_argument("--batch", type=int, default=256, help="Ray Data batch size (rows per call)")
    p.add_argument("--ct2-batch", type=int, default=32, help="CTranslate2's max_batch_size")
    p.add_argument("--max-tokens", type=int, default=CAP, help="every system's cap on generated tokens per sentence "
                   "(a shape checkpoint of benchmarks.shapes, whose EOS is unreachable, decodes every sentence to it); "
                   f"at {CAP}, ours keeps the job's own caps, as a user runs it")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--out", default="docs/results/ray-e2e")
    p.add_argument("--work", default="")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--input", default="", help=argparse.SUPPRESS)
    p.add_argument("--output", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return ray_data_run(args)
    import sentencepiece as spm
    args.model = os.path.abspath(args.model)
    args.work = args.work or tempfile.mkdtemp(prefix="bench-ray-e2e-")
    src_file, ref_file = SETS[args.set]
    base, base_refs = read_lines(os.path.join(args.data, src_file)), read_lines(os.path.join(args.data, ref_file))
    reps = args.lines // len(base) + 1
    texts, refs = (base * reps)[: args.lines], (base_refs * reps)[: args.lines]
    systems = args.systems.split(",")
    if any(s.startswith("ct2") for s in systems):
        convert_ct2(args.model, args.work)
    tgt = spm.SentencePieceProcessor(model_file=os.path.join(args.model, "target.spm"))
    rows = [measure(s, args, texts, refs, lambda h: len(tgt.encode(h)) + 1) for s in systems]
    ray_s = ray_start_seconds()
    by = {r["system"]: r["steady_tokens_per_s"] for r in rows}
    ratios = {f"{a} / {b}": round(by[a] / by[b], 3) for a, b in
              (("job-float32", "ct2-float32"), ("job-int8", "ct2-int8"), ("op-float32", "job-float32"),
               ("op-int8", "job-int8"), ("job-float32", "hf-float32")) if a in by and b in by}
    report = {"model": args.model, "set": args.set, "lines": args.lines, "beam": args.beam, "split": args.split,
              "ct2_batch": args.ct2_batch, "max_tokens": args.max_tokens, "ray_data_batch": args.batch, "ray_start_s": round(ray_s, 2),
              "runs": rows, "ratios": ratios}
    md = [f"# End to end on Ray: {args.set} repeated to {args.lines} lines\n",
          f"model `{os.path.relpath(args.model)}`, beam {args.beam}"
          f"{'' if args.max_tokens == CAP else f', every sentence to {args.max_tokens} tokens'}, split {args.split} (actors x threads) for every "
          f"system, CTranslate2 batch {args.ct2_batch}, Ray Data batches of {args.batch} rows. Each run is a fresh "
          f"process; `small_job_s` is the wall time of a {args.small}-line job (start-up: Ray, actors, model load), "
          "`steady_tokens_per_s` the difference of the corpus run and the small run.\n",
          markdown_table(rows), "", f"Ray alone (`ray.init`, 2 CPUs): {ray_s:.1f} s.\n",
          "Ratios of steady-state tokens/s: " + ", ".join(f"{k} = {v}" for k, v in ratios.items()), ""]
    write_report(args.out, report, md)


if __name__ == "__main__":
    main()
