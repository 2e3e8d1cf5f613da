"""The GPU check: tests, correctness and a short bench on a GPU machine, within a time budget
(``--budget-s``, 9 minutes by default). From the checkout's root:

    python -m benchmarks.gpu_data                                  # where ../shared is: data-gpu/ (carry it over)
    python -m benchmarks.gpu_check --out gpu-check                 # on the GPU machine (data-gpu/ in the checkout)
    python -m benchmarks.gpu_check --out gpu-check --data /path/to/data-gpu   # data-gpu/ kept elsewhere
    python -m benchmarks.gpu_check --out /tmp/check --device cpu   # the dry run, anywhere (small sizes)
    python -m benchmarks.gpu_check --out gpu-check --long batching # (or base) the long tables

Runs each part under its own time limit (shares of ``--budget-s``; every part, unpacking the base
model included, counts against it): the ``gpu``-marked tests and the Triton kernel tests; graph
replay = eager; bf16 vs fp32 BLEU; a decode on the last GPU index; the product end to end
(``raymt.jobs.translate --in-process``); tokens/s of ours against HF ``generate`` for the demo
model and base-de-en. Writes exactly two files into ``--out``, whatever happens (a part that
fails, raises or is interrupted is a FAIL row naming why): ``gpu_check.tar.gz`` (every log and
each part's rows as JSON) and ``summary.md`` (under 8 KB: the GPU, torch/CUDA, a table of figures
and pass/fail), and prints the summary last. ``--device cpu`` runs the same parts at small sizes and
writes the same table, each GPU-only figure "not measured: no GPU". What each figure means:
``docs/gpu.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data-gpu"  # where ``benchmarks.gpu_data`` writes, run from the checkout's root
SHARED = ROOT.parent / "shared"  # a folder beside the checkout holding data/ and models/, where there is one
SUMMARY_LIMIT = 8000  # bytes
NOT_MEASURED = "not measured: no GPU"
CRASHED = ("FAIL: exit", "FAIL: timed out", "FAIL: no time")  # a part that did not finish, on any device
# (part, its share of the budget, scaled to --budget-s): the tests' part runs pytest, the others
# benchmarks.gpu_check_steps; the environment's share covers a cold CUDA start
PARTS = (("environment", 25), ("base model", 15), ("tests", 200), ("replay", 55), ("bleu", 50), ("index", 35),
         ("job", 70), ("bench", 70), ("bench_base", 80))
LONG = {"batching": (["--sets", "multi30k", "--tables", "batching,topup,search"], 520),
        "base": (["--sets", "wmt22", "--beams", "5", "--tables", "peers", "--hf-batches", "128,512", "--repeats", "2",
                  "--synthetic-base", "--capacities", "128,512,1024"], 520)}


def first_existing(*paths: str) -> str | None:
    return next((p for p in paths if p and Path(p).exists()), None)


def run_limited(cmd: list[str], log: Path, seconds: float, env: dict | None = None) -> tuple[int | None, float]:
    """Run ``cmd`` (output to ``log``) for at most ``seconds``; (exit status or None when killed, wall s)."""
    start = time.perf_counter()
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            return proc.wait(timeout=max(1.0, seconds)), time.perf_counter() - start
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # (pytest's and the step's children too)
            proc.wait()
            out.write(f"\n[killed after {seconds:.0f} s]\n".encode())
            return None, time.perf_counter() - start


def child_env(args: argparse.Namespace) -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", RAYMT_SHARED_DATA=str(Path(args.data).resolve()))


def pytest_rows(args: argparse.Namespace, work: Path, seconds: float) -> list[dict]:
    """The ``gpu``-marked tests, then the Triton kernel tests (GPU only: on the CPU they run under the
    interpreter for minutes, and the regular test run covers them)."""
    on_gpu = args.device.startswith("cuda")
    suites = [("gpu tests (pytest -m gpu tests/workers)", ["-m", "gpu", "tests/workers"]),
              ("Triton kernel tests (tests/workers/test_triton_ops.py)", ["tests/workers/test_triton_ops.py"])]
    rows = []
    for i, (check, selection) in enumerate(suites):
        if i and not on_gpu:
            rows.append({"check": check, "figure": "-", "result": "skipped: dry run", "gpu_only": True, "seconds": 0})
            continue
        log = work / f"tests-{i}.log"
        rc, wall = run_limited([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", *selection],
                               log, seconds * (0.75 if i == 0 else 0.25), child_env(args))
        tail = log.read_text(errors="replace").strip().splitlines()
        counts = tail[-1].strip("= ") if tail else "no output"
        ran = rc == 0 and (" passed" in counts or not on_gpu)
        result = "FAIL: timed out" if rc is None else "pass" if ran else f"FAIL: exit {rc}"
        rows.append({"check": check, "figure": counts[:160], "result": result, "gpu_only": True,
                     "seconds": round(wall)})
    return rows


def job_rows(args: argparse.Namespace, work: Path, seconds: float, lines: int) -> list[dict]:
    """``raymt.jobs.translate --in-process`` on the device: the dynamic step at 256 slots, then the
    device's defaults (no batching flags), timed, outputs compared."""
    src = Path(args.data) / "multi30k" / "test_2016_flickr.de"
    if not src.exists():
        return [{"check": "translate job", "figure": "-", "result": f"skipped: no {src}", "gpu_only": True,
                 "seconds": 0}]
    head = work / "input.de"
    head.write_text("".join(src.read_text(encoding="utf-8").splitlines(keepends=True)[:lines]), encoding="utf-8")
    outputs, rows = {}, []
    for mode, flags in (("dynamic, 256 slots", ["--max-batch-size", "256", "--static-step", "0"]), ("defaults", [])):
        out = work / f"job-{len(outputs)}.en"
        cmd = [sys.executable, "-m", "raymt.jobs.translate", "--in-process", "--device", args.device, *flags,
               "--model", "models/demo-de-en", "--input", str(head), "--output", str(out)]
        rc, wall = run_limited(cmd, work / "job.log", seconds / 2, child_env(args))
        outputs[mode] = out.read_text(encoding="utf-8").splitlines() if rc == 0 and out.exists() else None
        rows.append({"check": f"translate job ({mode}), {lines} lines", "figure": f"{wall:.1f} s wall",
                     "result": "pass" if outputs[mode] is not None else f"FAIL: exit {rc}", "gpu_only": True,
                     "seconds": round(wall)})
    a, b = outputs.values()
    if a is not None and b is not None:
        same = sum(x == y for x, y in zip(a, b))
        rows.append({"check": "translate job: defaults = dynamic output", "figure": f"{same}/{len(a)} lines",
                     "result": "pass" if same >= 0.97 * len(a) else "FAIL", "gpu_only": True, "seconds": 0})
    return rows


def step_rows(name: str, args: argparse.Namespace, work: Path, seconds: float) -> list[dict]:
    result = work / f"{name}.json"
    cmd = [sys.executable, "-m", "benchmarks.gpu_check", "--step", name, "--device", args.device, "--data", args.data,
           "--base-model", args.base_model or "", "--result", str(result)]
    rc, wall = run_limited(cmd, work / f"{name}.log", seconds, child_env(args))
    if rc == 0 and result.exists():
        return [dict(r, seconds=round(wall)) for r in json.loads(result.read_text())]
    why = f"timed out after {seconds:.0f} s" if rc is None else f"exit {rc} (see {name}.log)"
    return [{"check": name, "figure": "-", "result": f"FAIL: {why}", "gpu_only": True, "seconds": round(wall)}]


def long_rows(args: argparse.Namespace, work: Path, left: float) -> list[dict]:
    """The long tables (``--long``) in ``benchmarks.bench_gpu``, within what is ``left`` of the budget."""
    flags, seconds = LONG[args.long]
    small = ["--lines", "8", "--repeats", "1", "--capacities", "4", "--hf-batches", "4", "--batching-beams", "2",
             "--batch-sentences", "4", "--search-beam", "3"] if not args.device.startswith("cuda") else []
    shortlist = first_existing(str(Path(args.data) / "lex.s2t"))
    cmd = [sys.executable, "-m", "benchmarks.bench_gpu", "--data", args.data, "--device", args.device,
           "--out", str(work / f"long-{args.long}"), *flags, *small, *(["--shortlist", shortlist] if shortlist else [])]
    rc, wall = run_limited(cmd, work / f"long-{args.long}.log", min(seconds, left), child_env(args))
    report = work / f"long-{args.long}.json"
    tables = list(json.loads(report.read_text())["tables"]) if report.exists() else []
    result = "pass" if rc == 0 else "FAIL: timed out (the tables it finished are in the tar)" if rc is None \
        else f"FAIL: exit {rc}"
    return [{"check": f"long tables ({args.long}): bench_gpu", "figure": f"{len(tables)} tables: {', '.join(tables)}",
             "result": result, "gpu_only": True, "seconds": round(wall)}]


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def shown(row: dict, on_gpu: bool) -> tuple[str, str]:
    """(figure, result) as the summary shows them: in the dry run a figure is the CPU's, so it is
    marked as not measured, and the result says whether the part ran."""
    figure, result = row["figure"], row["result"]
    if not on_gpu and figure != "-":
        return NOT_MEASURED, result if result.startswith(CRASHED) else "ran (dry run)"
    return figure, result


def summary(rows: list[dict], args: argparse.Namespace, wall: float) -> str:
    env = {r["check"]: r["figure"] for r in rows if not r["gpu_only"]}
    on_gpu = args.device.startswith("cuda")
    checks = [(r, *shown(r, on_gpu)) for r in rows if r["gpu_only"]]
    tally = {w: sum(result.startswith(w) for _, _, result in checks) for w in ("pass", "ran", "FAIL", "skipped")}
    lines = [f"# GPU check on {env.get('gpu', 'unknown')}" + ("" if on_gpu else " (dry run on the CPU)"), "",
             f"torch {env.get('torch')}, CUDA {env.get('cuda')}, triton {env.get('triton')}, transformers "
             f"{env.get('transformers')}; device {args.device}; {wall:.0f} s of a {args.budget_s:.0f} s budget; "
             + ", ".join(f"{n} {w}" for w, n in tally.items() if n), "",
             "| check | figure | result | s |", "|---|---|---|---|"]
    for width in (220, 160, 110, 70, 40, 20):  # (narrower cells until it fits)
        body = [f"| {r['check'][:width]} | {cut(figure, width)} | {cut(result, width // 2)} | {r['seconds']} |"
                for r, figure, result in checks]
        text = "\n".join(lines + body + ["", "Logs: gpu_check.tar.gz. Figures explained in docs/gpu.md."]) + "\n"
        if len(text.encode()) <= SUMMARY_LIMIT:
            break
    return text


def failed(check: str, error: BaseException, seconds: float = 0) -> dict:
    """A FAIL row naming what ``check`` raised (its first line)."""
    why = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return {"check": check, "figure": "-", "result": f"FAIL: {type(error).__name__}{': ' + why if why else ''}",
            "gpu_only": True, "seconds": round(seconds)}


def guarded(name: str, work: Path, part: Callable[[], list[dict]]) -> list[dict]:
    """``part()``'s rows, or one FAIL row naming what it raised (its traceback in ``<name>.log``)."""
    start = time.perf_counter()
    try:
        return part()
    except Exception as e:  # (an interruption is not caught here: ``check`` records it and stops)
        with open(work / f"{name.replace(' ', '_')}.log", "a", encoding="utf-8") as log:
            traceback.print_exc(file=log)
        return [failed(name, e, time.perf_counter() - start)]


def base_model_rows(args: argparse.Namespace) -> list[dict]:
    """base-de-en for ``bench_base``, in ``args.base_model``: as given, else ``../shared/models``'s,
    else unpacked from ``<data>/base-de-en.int8`` (in the budget: it takes a while)."""
    start = time.perf_counter()
    if args.base_model is None:
        args.base_model = base_model(args)
    if not args.base_model:
        result = f"skipped: no base-de-en in {SHARED / 'models'} or {Path(args.data) / 'base-de-en.int8'}"
    else:
        result = "pass" if Path(args.base_model).is_dir() else f"FAIL: {args.base_model} is not a directory"
    return [{"check": "base model", "figure": args.base_model or "-", "result": result, "gpu_only": True,
             "seconds": round(time.perf_counter() - start)}]


def part_rows(name: str, args: argparse.Namespace, work: Path, seconds: float) -> list[dict]:
    if name == "base model":
        return base_model_rows(args)
    if name == "tests":
        return pytest_rows(args, work, seconds)
    if name == "job":
        return job_rows(args, work, seconds, 1000 if args.device.startswith("cuda") else 12)
    return step_rows(name, args, work, seconds)


def run_parts(args: argparse.Namespace, work: Path, rows: list[dict], start: float) -> None:
    """Every part in turn into ``rows``, each within its share of what is left of the budget."""
    scale, on_gpu = args.budget_s / sum(s for _, s in PARTS), args.device.startswith("cuda")
    parts = [("environment", 25)] if args.long else PARTS
    for name, share in parts:
        left = args.budget_s - (time.perf_counter() - start)
        seconds = min(share * scale if on_gpu else max(share * scale, 150), left)  # (a CPU is slow even at small sizes)
        if seconds < 5:
            rows.append({"check": name, "figure": "-", "result": "FAIL: no time left in the budget", "gpu_only": True,
                         "seconds": 0})
        else:
            rows += guarded(name, work, lambda: part_rows(name, args, work, seconds))
    if args.long:
        left = args.budget_s - (time.perf_counter() - start)
        rows += guarded(f"long tables ({args.long})", work, lambda: long_rows(args, work, left))


def write_outputs(rows: list[dict], args: argparse.Namespace, work: Path, wall: float) -> str:
    """``summary.md`` into ``--out`` (first: the one file that must come back), then the tarball of
    ``work`` with the rows and the summary in it; ``work`` removed."""
    out = Path(args.out)
    text = summary(rows, args, wall)
    (out / "summary.md").write_text(text)
    (work / "rows.json").write_text(json.dumps(rows, indent=1))
    (work / "summary.md").write_text(text)
    with tarfile.open(out / "gpu_check.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="gpu_check")
    shutil.rmtree(work, ignore_errors=True)
    return text


def check(args: argparse.Namespace) -> str:
    """Every part, then the two files, always: a part that raises is a FAIL row naming the error and
    the parts after it still run; an interruption (or an error outside the parts) is a FAIL row too,
    the files are written, and it is raised again. Prints the summary and returns it."""
    start = time.perf_counter()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    rows: list[dict] = []
    try:
        run_parts(args, work, rows, start)
    except BaseException as e:
        rows.append(failed("gpu check (stopped)", e, time.perf_counter() - start))
        raise
    finally:
        text = write_outputs(rows, args, work, time.perf_counter() - start)
        print(text)
    return text


def run_one_step(args: argparse.Namespace) -> None:
    """One part in this process (the parent gives it its time limit): rows as JSON to ``--result``."""
    from benchmarks.gpu_check_steps import Sizes, run_step

    base = args.base_model or None
    sizes = Sizes(args.device, args.data, base) if args.device.startswith("cuda") else Sizes.dry_run(args.data, base)
    print(f"{args.step}: {sizes.as_dict()}", flush=True)
    rows, seconds = run_step(args.step, sizes)
    for r in rows:
        print(f"{r.check}: {r.figure} [{r.result}]", flush=True)
    print(f"{args.step}: {seconds:.1f} s", flush=True)
    Path(args.result).write_text(json.dumps([asdict(r) for r in rows]))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="the folder gpu_check.tar.gz and summary.md are written to (made if missing)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: the dry run at small sizes")
    p.add_argument("--budget-s", type=float, default=540.0, help="wall-clock seconds for everything")
    p.add_argument("--long", choices=sorted(LONG), help="instead of the check: the long tables (batching: the batching, "
                   "top-up and search tables on Multi30k; base: WMT22 and the synthetic base-size model)")
    p.add_argument("--data", default=first_existing(str(DATA), str(SHARED / "data")) or str(DATA),
                   help="the folder benchmarks.gpu_data prepared (multi30k/, wmt22/, base-de-en.int8/, lex.s2t), "
                   "wherever it was copied to (default: data-gpu/ in the checkout, else ../shared/data)")
    p.add_argument("--base-model", default=None, help="base-de-en's directory (default: ../shared/models/base-de-en, "
                   "else unpacked from the data folder's base-de-en.int8/)")
    p.add_argument("--step", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.step and not args.out:
        p.error("--out is required")
    return args


def base_model(args: argparse.Namespace) -> str | None:
    shared = SHARED / "models" / "base-de-en"
    if shared.exists():
        return str(shared)
    packed = Path(args.data) / "base-de-en.int8"
    if not packed.exists():
        return None
    from benchmarks.gpu_data import unpack_model
    return str(unpack_model(packed, Path(tempfile.gettempdir()) / "raymt-base-de-en"))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.step:
        run_one_step(args)
        return
    check(args)


if __name__ == "__main__":
    main()
