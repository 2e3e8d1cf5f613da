"""The checks ``benchmarks/gpu_check.py`` runs, one per subprocess (each under its own time limit).

Each takes a ``Sizes`` and returns rows: ``Row(check, figure, result)``. A figure that only a GPU
can give is computed on the CPU too (the dry run runs the same code at small sizes), and the
summary replaces it there by "not measured: no GPU". Only public entry points are used
(``CoreDecoder.load(..., device=)``, ``decode_ids``, ``StaticStep``), plus torch's own CUDA graph
class, whose replays are counted.
"""
from __future__ import annotations

import contextlib
import importlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import sacrebleu
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from benchmarks.bench_gpu import hf_runner, measure, ours_runner, rows_of
from benchmarks.reports import SETS, read_lines
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.device import GPU_DEFAULTS
from raymt.workers.kernels.isa import bf16_refusal, detect
from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
from raymt.workers.kernels.speedups import EXACT, CpuSpeedups
from raymt.workers.decoder.static_step import StaticStep
from raymt.workers.decoder.core_decoder import CoreDecoder

DEMO = "models/demo-de-en"
BLEU_TOLERANCE = 0.5  # |bf16 - fp32| BLEU points
SAME_SHARE = 0.97  # static vs dynamic step: other row counts per step may flip a rare near-tie


@dataclass(frozen=True, slots=True)
class Row:
    check: str
    figure: str
    result: str  # "pass", "FAIL: why", "skipped: why", or "-" for a plain figure
    gpu_only: bool = True


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much each check does: the GPU's sizes, or the CPU dry run's."""

    device: str
    data: str
    base_model: str | None
    replay_lines: int = 96
    bleu_lines: int = 300
    index_lines: int = 64
    bench_lines: int = 1000
    beam: int = 5
    slots: int = GPU_DEFAULTS.max_batch_size
    hf_batch: int = 128
    repeats: int = 2

    @classmethod
    def dry_run(cls, data: str, base_model: str | None) -> "Sizes":
        return cls("cpu", data, base_model, replay_lines=6, bleu_lines=8, index_lines=4, bench_lines=6, beam=2,
                   slots=4, hf_batch=4, repeats=1)

    def as_dict(self) -> dict:
        return asdict(self)


def multi30k(sizes: Sizes, n: int) -> tuple[list[str], list[str]] | None:
    src, ref = (Path(sizes.data) / p for p in SETS["multi30k"])
    if not src.exists():
        return None
    return read_lines(str(src), n), read_lines(str(ref), n)


def no_data(check: str, sizes: Sizes) -> list[Row]:
    return [Row(check, "-", f"skipped: no Multi30k test set under {sizes.data}")]


def topup(slots: int) -> SchedulerConfig:
    return SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=slots, capacity=slots,
                           refill_threshold=GPU_DEFAULTS.refill_threshold)


class _EagerStep:
    """Stands in for the CUDA graph wrapper: every static step runs eagerly (the attributes its
    owner sets on a graph are kept and unused)."""

    graph = None

    def run(self, step):
        return step()


@contextlib.contextmanager
def eager_static_step():
    """The static step run eagerly on a GPU: every ``raymt.workers`` module's graph wrapper (the
    class named ``GraphedStep``) swapped for one that runs each step. Yields how many were swapped
    (0: this version has none, and the comparison cannot be made)."""
    swapped = []
    for name in ("engine", "runner", "graphs"):
        try:
            module = importlib.import_module(f"raymt.workers.{name}")
        except ImportError:
            continue
        if hasattr(module, "GraphedStep"):
            swapped.append((module, module.GraphedStep))
            module.GraphedStep = _EagerStep
    try:
        yield len(swapped)
    finally:
        for module, original in swapped:
            module.GraphedStep = original


@contextlib.contextmanager
def counted_replays():
    """Counts ``torch.cuda.CUDAGraph.replay`` calls (a list holding the count)."""
    count = [0]
    if not torch.cuda.is_available():
        yield count
        return
    original = torch.cuda.CUDAGraph.replay

    def replay(self, *args, **kwargs):
        count[0] += 1
        return original(self, *args, **kwargs)

    torch.cuda.CUDAGraph.replay = replay
    try:
        yield count
    finally:
        torch.cuda.CUDAGraph.replay = original


def tokens(decoded) -> list[tuple[int, ...]]:
    return [tuple(h[0].tokens) for h in decoded.hypotheses]


def replay(sizes: Sizes) -> list[Row]:
    """The static step replayed from its CUDA graph against the same step run eagerly (token for
    token), and against the dynamic step (all but rare near-ties)."""
    check = "graph replay = eager (static step)"
    data = multi30k(sizes, sizes.replay_lines)
    if data is None:
        return no_data(check, sizes)
    translator = CoreDecoder.load(DEMO, device=sizes.device)
    with eager_static_step() as swapped:  # (a translator keeps its captured steps: the eager one is its own)
        eager_translator = CoreDecoder.load(DEMO, device=sizes.device)
    sources, cfg = translator.encode(data[0]), SearchConfig(beam_size=sizes.beam)
    batching = topup(min(32, sizes.slots))
    dynamic = tokens(translator.decode_ids(sources, DecodeRequest(cfg, schedule=batching)))
    rows = []
    for every, late in ((1, False), (4, False), (4, True)):
        static = StaticStep(readback_every=every, late=late)
        with counted_replays() as replays:
            graphed = tokens(translator.decode_ids(sources, DecodeRequest(cfg, schedule=batching, static=static)))
        with eager_static_step():
            eager = tokens(eager_translator.decode_ids(sources, DecodeRequest(cfg, schedule=batching, static=static)))
        same, near = sum(a == b for a, b in zip(graphed, eager)), sum(a == b for a, b in zip(graphed, dynamic))
        name = f"{check}, read back every {every}{', late' if late else ''}"
        on_gpu = sizes.device.startswith("cuda")
        if on_gpu and not swapped:
            result = "FAIL: no graph wrapper found to run the static step eagerly"
        elif on_gpu and replays[0] == 0:
            result = "FAIL: the static step was never replayed from a graph"
        else:
            result = "pass" if same == len(sources) and near >= SAME_SHARE * len(sources) else "FAIL"
        rows.append(Row(name, f"{same}/{len(sources)} = eager, {near}/{len(sources)} = dynamic, "
                              f"{replays[0]} replays", result))
    return rows


def bleu_bf16(sizes: Sizes) -> list[Row]:
    check = "bf16 vs fp32 BLEU (demo, Multi30k)"
    data = multi30k(sizes, sizes.bleu_lines)
    if data is None:
        return no_data(check, sizes)
    if sizes.device == "cpu" and (why := bf16_refusal(detect())):  # (the dry run on a CPU without bf16 GEMMs)
        return [Row(check, "-", f"skipped: {why.split(':')[0]}")]
    cfg, scores = SearchConfig(beam_size=sizes.beam), []
    for speedups in (EXACT, CpuSpeedups(bf16=True)):
        translator = CoreDecoder.load(DEMO, device=sizes.device, speedups=speedups)
        texts = [t.text for t in translator.translate(data[0], cfg)]
        scores.append(sacrebleu.corpus_bleu(texts, [data[1]]).score)
    delta = scores[1] - scores[0]
    return [Row(check, f"{scores[1]:.2f} vs {scores[0]:.2f} (delta {delta:+.2f}), {len(data[0])} lines, "
                       f"beam {sizes.beam}", "pass" if abs(delta) <= BLEU_TOLERANCE else "FAIL")]


class TensorDevices(TorchDispatchMode):
    """The devices of every tensor an operator returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.devices[str(t.device)] = self.devices.get(str(t.device), 0) + 1
        return out


def device_index(sizes: Sizes) -> list[Row]:
    """A decoder on the last visible GPU (a per-GPU actor's index): its weights and every tensor a
    decode makes on that device, no memory taken on the others; then the static step there."""
    data = multi30k(sizes, sizes.index_lines)
    if data is None:
        return no_data("translation on the last GPU index", sizes)
    name = f"cuda:{torch.cuda.device_count() - 1}" if sizes.device.startswith("cuda") else sizes.device
    device = torch.device(name)
    others = [i for i in range(torch.cuda.device_count()) if torch.device("cuda", i) != device]
    before = {i: torch.cuda.memory_allocated(i) for i in others}
    translator = CoreDecoder.load(DEMO, device=device)
    params = {str(p.device) for p in translator.checkpoint.model.parameters()}
    sources, cfg, batching = translator.encode(data[0]), SearchConfig(beam_size=sizes.beam), topup(min(32, sizes.slots))
    with TensorDevices() as seen:
        dynamic = tokens(translator.decode_ids(sources, DecodeRequest(cfg, schedule=batching)))
    static = tokens(translator.decode_ids(sources, DecodeRequest(cfg, schedule=batching,
                                                                       static=StaticStep(readback_every=4))))
    grown = {i: torch.cuda.memory_allocated(i) - b for i, b in before.items() if torch.cuda.memory_allocated(i) != b}
    same = sum(a == b for a, b in zip(static, dynamic))
    ok = params == {str(device)} and set(seen.devices) <= {str(device), "cpu"} and not grown \
        and same >= SAME_SHARE * len(sources)
    where = ", ".join(f"{n} on {d}" for d, n in sorted(seen.devices.items()))
    return [Row(f"translation on {name} (the last GPU index)",
                f"weights on {sorted(params)}; decode tensors: {where}; other GPUs grew {grown or 'none'}; "
                f"static = dynamic {same}/{len(sources)}", "pass" if ok else "FAIL")]


def bench_model(sizes: Sizes, label: str, model: str) -> list[Row]:
    """Target tokens/s on Multi30k: HF ``generate`` (length-sorted batches) against ours (top-up at
    the GPU's default slots, the static step, and the dynamic step at 256), same beam, same lines."""
    data = multi30k(sizes, sizes.bench_lines)
    if data is None:
        return no_data(f"tokens/s, {label}", sizes)
    device = torch.device(sizes.device)
    translator = CoreDecoder.load(model, device=device)
    hf, beam = hf_runner(model, device, torch.float32), sizes.beam
    dynamic = ours_runner(translator, refill_threshold=GPU_DEFAULTS.refill_threshold)
    static = ours_runner(translator, static=StaticStep(readback_every=GPU_DEFAULTS.static_step),
                         refill_threshold=GPU_DEFAULTS.refill_threshold)
    slots = sizes.slots
    measured = [measure(f"HF generate, batch {sizes.hf_batch}", device, lambda x: hf(x, beam, sizes.hf_batch),
                        data[0], sizes.repeats),
                measure(f"ours, {min(256, slots)} slots", device, lambda x: dynamic(x, beam, min(256, slots)),
                        data[0], sizes.repeats),
                measure(f"ours, static step, {slots} slots", device, lambda x: static(x, beam, slots), data[0],
                        sizes.repeats)]
    rows = rows_of(measured, data[1])
    hf_rate = rows[0]["tokens_per_s"]
    out = []
    for r in rows:
        ratio = f", {r['tokens_per_s'] / hf_rate:.2f}x HF" if r["tokens_per_s"] and hf_rate else ""
        figure = f"{r['tokens_per_s']} tok/s, BLEU {r['bleu']}, peak {r['peak_device_mb']} MB{ratio}"
        out.append(Row(f"tokens/s, {label}, {r['system']}, beam {beam}, {len(data[0])} lines", figure,
                       "-" if r["tokens_per_s"] else "FAIL: " + r["system"]))
    return out


def bench(sizes: Sizes) -> list[Row]:
    return bench_model(sizes, "demo", DEMO)


def bench_base(sizes: Sizes) -> list[Row]:
    if not sizes.base_model:
        return [Row("tokens/s, base-de-en", "-", "skipped: no base-de-en (../shared/models or data-gpu)")]
    return bench_model(sizes, "base-de-en", sizes.base_model)


def environment(sizes: Sizes) -> list[Row]:
    """The machine, for the summary's header (never a pass/fail)."""
    gpu = torch.cuda.get_device_name(torch.device(sizes.device)) if sizes.device.startswith("cuda") else "none"
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    import transformers
    return [Row("gpu", gpu, "-", False), Row("torch", torch.__version__, "-", False),
            Row("cuda", str(torch.version.cuda), "-", False), Row("triton", triton_version, "-", False),
            Row("transformers", transformers.__version__, "-", False)]


STEPS = {"environment": environment, "replay": replay, "bleu": bleu_bf16, "index": device_index, "bench": bench,
         "bench_base": bench_base}


def run_step(name: str, sizes: Sizes) -> tuple[list[Row], float]:
    start = time.perf_counter()
    rows = STEPS[name](sizes)
    return rows, time.perf_counter() - start
