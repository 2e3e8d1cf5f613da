"""Soak benchmark: each decoder's resident memory over a long translate job.

    python -m benchmarks.bench_soak                                   # 50,000 lines, 2 decoders, beam 2
    python -m benchmarks.bench_soak --lines 600 --unit-rows 100 --csv /tmp/soak.csv    # smoke
    python -m benchmarks.bench_soak --in-process                      # the same job decoded in this process

Builds a corpus of ``--lines`` German lines (Multi30k train shuffled and repeated, from
``../shared/data``; ``examples/sample.de.txt`` repeated where that is absent) and runs the translate
job on it as ``python -m raymt.jobs.translate --decoders 2 --threads 1 --beam-size 2 --unit-rows 2500``
does, on Ray (``--local-rows 0``: never in-process) or, with ``--in-process``, in this process.
Every ``--every-s`` seconds it reads each live decoder actor's resident memory (its pid from Ray's
state API; this process's in-process), split into private memory and the object store's shared
pages (``memory_mb``), and the rows committed so far (the output's commit markers). "RSS" below is
the private part: the shared pages are the object store's, budgeted by Ray on its own.

Measured (demo model, 2 cores, the defaults above): without ``trim_heap`` after each unit the
decoders' private RSS rose 12-15% after the warm-up and was still rising at the end (glibc heap
fragmentation, ``pipeline/decoders/heap.py``); with it the level is ~70 MB lower and the rest of the rise is
oneDNN's primitive cache filling: with ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=8`` in the environment the
curve is flat (+2%) but decoding ~13% slower, so the default capacity stays.

Prints the curve, per tenth of the rows, each decoder's highest RSS while the job was in that
tenth, and the verdict per decoder: flat when its RSS in the last tenth is within ``--tolerance`` of
its RSS in the first tenth after ``--warmup``. ``--csv`` writes every sample (seconds, rows done,
decoder, private and shared MB). One decoder's column per process: a restarted actor gets a column of its own.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from raymt.pipeline.reports.stats_tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RAYMT_SHARED_DATA", ROOT.parent / "shared" / "data"))
MULTI30K = SHARED_DATA / "multi30k" / "train.de"
SAMPLE = ROOT / "examples" / "sample.de.txt"


@dataclass(frozen=True, slots=True)
class Sample:
    seconds: float  # since the job started
    rows: int  # rows committed so far (all decoders)
    rss_mb: dict[str, float]  # decoder -> private resident memory (RSS less the object store's shared pages)
    shared_mb: dict[str, float] = field(default_factory=dict)  # decoder -> the object store's pages it holds


@dataclass(frozen=True, slots=True)
class Verdict:
    decoder: str
    warm_mb: float  # highest RSS in the first tenth after the warm-up
    end_mb: float  # highest RSS in the last tenth the decoder was seen in
    growth: float  # end / warm - 1
    flat: bool


def build_corpus(path: Path, lines: int, seed: int = 0) -> Path:
    """``lines`` source lines at ``path``: Multi30k's German training side, shuffled anew each pass."""
    base = (MULTI30K if MULTI30K.exists() else SAMPLE).read_text(encoding="utf-8").splitlines()
    rng, out = random.Random(seed), []
    while len(out) < lines:
        rng.shuffle(base)
        out += base[: lines - len(out)]
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


def memory_mb(pid: int) -> tuple[float, float] | None:
    """The process's (private resident memory, resident shared memory) in MB, from ``/proc``; None
    when it is gone (or on another node). Shared: the pages of Ray's object store the process has
    mapped and touched (the encoded units it reads zero-copy). They count in its RSS, grow as the
    store fills and wraps, and are the store's memory, which Ray budgets on its own; a leak or heap
    creep shows in the private part."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        rss, shared = (int(fields.get(k, "0 kB").split()[0]) / 1024 for k in ("VmRSS", "RssShmem"))
    except (OSError, ValueError):
        return None
    return rss - shared, shared


def decoder_pids() -> list[int]:
    """The pids of the live decoder actors on this cluster."""
    from ray.util.state import list_actors
    actors = list_actors(filters=[("class_name", "=", "DecoderActor"), ("state", "=", "ALIVE")], raise_on_missing_output=False)
    return sorted(a.pid for a in actors if a.pid)


def committed_rows(manifests: Path, seen: dict[str, int]) -> int:
    """Rows in the committed units' markers under ``manifests`` (``seen``: markers read before, by name)."""
    if manifests.is_dir():
        for p in manifests.glob("*.json"):
            if p.name not in seen:
                try:
                    seen[p.name] = int(json.loads(p.read_text()).get("rows", 0))
                except (OSError, ValueError):
                    continue  # appeared between the listing and the read: counted next time
    return sum(seen.values())


class Probe:
    """A daemon thread sampling the decoders' RSS and the rows done every ``every_s`` seconds."""

    def __init__(self, output: Path, in_process: bool, every_s: float) -> None:
        self.manifests, self.in_process, self.every_s = output / "_manifest", in_process, every_s
        self.samples: list[Sample] = []
        self._seen: dict[str, int] = {}
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raymt-soak-probe", daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a cluster shutting down: the next sample, or none
                continue

    def sample(self) -> None:
        pids = [os.getpid()] if self.in_process else decoder_pids()
        got = {f"pid {pid}": mb for pid in pids if (mb := memory_mb(pid)) is not None}
        if got:
            self.samples.append(Sample(time.monotonic() - self._start, committed_rows(self.manifests, self._seen),
                                       {d: private for d, (private, _) in got.items()},
                                       {d: shared for d, (_, shared) in got.items()}))


def tenth(rows: int, total: int, windows: int = 10) -> int:
    return min(rows * windows // max(total, 1), windows - 1)


def decoders_of(samples: list[Sample]) -> list[str]:
    return list(dict.fromkeys(d for s in samples for d in s.rss_mb))


def curve(samples: list[Sample], total: int, windows: int = 10) -> list[dict]:
    """One row per tenth of the rows that has samples: rows done, seconds, each decoder's highest RSS."""
    names, rows = decoders_of(samples), []
    for w in range(windows):
        mine = [s for s in samples if tenth(s.rows, total, windows) == w]
        if not mine:
            continue
        row = {"rows done": f"{w * 100 // windows}-{(w + 1) * 100 // windows}%", "up to row": max(s.rows for s in mine),
               "seconds": round(mine[-1].seconds, 1)}
        for d in names:
            got = [s.rss_mb[d] for s in mine if d in s.rss_mb]
            row[f"{d} MB"] = round(max(got)) if got else ""
        rows.append(row)
    return rows


def verdicts(samples: list[Sample], total: int, warmup: float = 0.2, tolerance: float = 0.05,
             windows: int = 10) -> list[Verdict]:
    """Per decoder seen after the warm-up: its highest RSS in its first tenth at or after ``warmup``
    against that in its last tenth."""
    first, out = tenth(int(warmup * total), total, windows), []
    for d in decoders_of(samples):
        levels: dict[int, float] = {}
        for s in samples:
            if d in s.rss_mb and (w := tenth(s.rows, total, windows)) >= first:
                levels[w] = max(levels.get(w, 0.0), s.rss_mb[d])
        if not levels:
            continue
        warm, end = levels[min(levels)], levels[max(levels)]
        growth = end / warm - 1
        out.append(Verdict(d, round(warm, 1), round(end, 1), round(growth, 4), growth < tolerance))
    return out


def write_csv(samples: list[Sample], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seconds", "rows_done", "decoder", "private_mb", "shared_mb"])
        for s in samples:
            for d, mb in s.rss_mb.items():
                w.writerow([round(s.seconds, 2), s.rows, d, round(mb, 1), round(s.shared_mb.get(d, 0.0), 1)])


def job_argv(args: argparse.Namespace, corpus: Path, output: Path) -> list[str]:
    """The translate job's command line for this soak."""
    argv = ["--model", args.model, "--input", str(corpus), "--output", f"{output}/", "--decoders", str(args.decoders),
            "--threads", str(args.threads), "--beam-size", str(args.beam_size), "--unit-rows", str(args.unit_rows),
            "--progress-every", str(args.progress_every)]
    return argv + (["--in-process"] if args.in_process else ["--local-rows", "0"])


def run_job(argv: list[str]):
    from raymt.jobs.translate import build_parser, decode_config, pipeline_config
    from raymt.pipeline.orchestration.run import run_pipeline
    args = build_parser().parse_args(argv)
    return run_pipeline(pipeline_config(args, decode_config(args)))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "models" / "demo-de-en"))
    p.add_argument("--lines", type=int, default=50_000)
    p.add_argument("--decoders", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--beam-size", type=int, default=2)
    p.add_argument("--unit-rows", type=int, default=2500)
    p.add_argument("--in-process", action="store_true", help="decode in this process (no Ray) and sample it")
    p.add_argument("--every-s", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=0.2, help="share of the rows before the reference tenth")
    p.add_argument("--tolerance", type=float, default=0.05, help="RSS growth allowed after the warm-up")
    p.add_argument("--progress-every", type=float, default=30.0)
    p.add_argument("--csv", default="", help="write every sample here")
    args = p.parse_args(argv)
    import ray
    started_ray = not ray.is_initialized()
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        corpus, output = build_corpus(Path(tmp) / "corpus.de", args.lines), Path(tmp) / "out"
        start = time.perf_counter()
        with Probe(output, args.in_process, args.every_s) as probe:
            result = run_job(job_argv(args, corpus, output))
        seconds = time.perf_counter() - start
    if started_ray and ray.is_initialized():
        ray.shutdown()
    samples = probe.samples
    table, verdict = curve(samples, args.lines), verdicts(samples, args.lines, args.warmup, args.tolerance)
    route = "in-process" if args.in_process else f"Ray, {args.decoders} decoder actors"
    print(f"\nsoak: {args.lines} lines, {route}, beam {args.beam_size}, {args.threads} thread(s), units of "
          f"{args.unit_rows} rows: {seconds:.0f} s, {len(samples)} samples ({result.where})")
    print("highest private RSS (MB; the object store's shared pages apart) per decoder while the rows done were in each tenth:\n" + markdown_table(table))
    shared = {d: max((s.shared_mb.get(d, 0.0) for s in samples), default=0.0) for d in decoders_of(samples)}
    print(markdown_table([{"decoder": v.decoder, "MB after warm-up": v.warm_mb, "MB at the end": v.end_mb,
                           "growth": f"{v.growth:+.1%}", "flat": v.flat,
                           "object store pages, MB (most)": round(shared.get(v.decoder, 0.0))} for v in verdict]))
    flat = bool(verdict) and all(v.flat for v in verdict)
    print(f"verdict: {'FLAT' if flat else 'GROWING' if verdict else 'too few samples'} "
          f"(tolerance {args.tolerance:.0%} after {args.warmup:.0%} of the rows)")
    if args.csv:
        write_csv(samples, args.csv)
    return {"seconds": seconds, "where": result.where, "samples": samples, "curve": table, "verdicts": verdict,
            "flat": flat}


if __name__ == "__main__":
    main()
