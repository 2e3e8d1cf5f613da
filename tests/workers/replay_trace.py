"""What a CUDA graph replay of the static step would do, checked on the CPU (no GPU is needed).

``workers/model/graphs.GraphedStep`` captures ``Engine._device_step`` once (after its warm-up steps) and replays
it every step after: the replay runs the captured kernels on the same memory with the same
arguments, and runs no Python. So a replay equals the eager step if, at every step it stands for:

1. the eager step runs the same operators, in the same order, with the same shapes, strides,
   dtypes and Python arguments (a per-step Python value, e.g. a length, would be baked into the
   graph);
2. every tensor it reads that it did not create itself is the same memory as at capture (the
   cache, the search state, the index buffer, the weights: a persistent tensor reassigned between
   steps, or a tensor the host builds anew each step, would be read stale);
3. it changes no Python state (attributes of the engine, its search state, cache and indices): a
   replay would not.

``trace_static_decode`` runs a static decode eagerly with ``Engine._device_step`` watched by a
torch dispatch mode (every ATen operator) plus the Triton entry points (black boxes: their tensor
arguments and scalars), and returns each step's trace and Python side effects; a test asserts that
every step after the capture repeats the captured one. This proves the engine's side of "a CUDA
graph replay equals eager"; ``tests/workers/test_gpu.py`` checks the replay itself on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

from raymt.workers.decoder.engine import Engine
from raymt.workers.model.graphs import WARMUP_STEPS

KERNELS = ("ancestry_attention", "source_attention", "row_top_log_softmax")  # workers/kernels/triton_ops.py's launches
CAPTURED = WARMUP_STEPS  # the step GraphedStep captures (0-based): the ones before run eagerly to warm up


def _storage(x: Tensor) -> int:
    return x.untyped_storage().data_ptr()


class StepTrace(TorchDispatchMode):
    """One step's operators. A tensor argument is named by what made its memory: ``("made", j)``,
    allocated by the step's operator j (a view or in-place result keeps its input's name), or
    ``("held", address)``, memory the step found (it must be the same at every replay)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []
        self.made: dict[int, int] = {}  # storage address -> the operator that allocated it this step

    def name(self, x) -> object:
        if not isinstance(x, Tensor):
            return repr(x)
        at = _storage(x)
        origin = ("made", self.made[at]) if at in self.made else ("held", at)
        return (*origin, x.storage_offset(), tuple(x.shape), x.stride(), x.dtype, x.device.type)

    def record(self, op: str, inputs: list, out) -> None:
        self.ops.append((op, tuple(self.name(x) for x in inputs)))
        taken = {_storage(x) for x in inputs if isinstance(x, Tensor)}
        for y in tree_leaves(out):
            if isinstance(y, Tensor) and _storage(y) not in taken:
                self.made[_storage(y)] = len(self.ops) - 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.lift_fresh.default:  # a Python number as a tensor (``x[i] = -inf``): the
            self.ops.append((str(func), (args[0].item(),)))  # graph keeps its value from the capture
            self.made[_storage(out)] = len(self.ops) - 1
        elif func.namespace != "profiler":  # (record_function's scopes: not kernels)
            self.record(str(func), tree_leaves((args, kwargs or {})), out)
        return out

    def black_box(self, name: str, fn):
        """``fn`` (a Triton launch) recorded as one operator: a kernel reads its arguments' memory
        directly, past the dispatcher, so its arguments are what a graph captures."""
        def run(*args, **kwargs):
            with _disable_current_modes():  # (the interpreter's own tensor traffic is not the kernel's)
                out = fn(*args, **kwargs)
            self.record(name, tree_leaves((args, kwargs)), out)
            return out
        return run


def _python_state(engine: Engine) -> dict[str, object]:
    """The Python attributes a step could change: scalars by value, objects (tensors included) by identity."""
    state = {}
    for owner in ("", "state", "cache", "_static"):
        obj = getattr(engine, owner) if owner else engine
        names = list(getattr(obj, "__dict__", {}))
        names += [s for c in type(obj).__mro__ for s in getattr(c, "__slots__", ())]
        for n in names:
            if hasattr(obj, n):
                v = getattr(obj, n)
                state[f"{owner}.{n}"] = v if isinstance(v, (int, float, bool, str, type(None))) else id(v)
    return state


@dataclass
class DecodeTrace:
    steps: list[list[tuple]] = field(default_factory=list)  # each step's operators
    side_effects: list[dict[str, tuple]] = field(default_factory=list)  # each step's changed Python attributes
    admitted_after: list[int] = field(default_factory=list)  # the steps admissions came before
    hypotheses: list = field(default_factory=list)


def trace_static_decode(monkeypatch, decode, triton_module=None) -> DecodeTrace:
    """Run ``decode()`` (a static decode) with every ``Engine._device_step`` traced (and the Triton
    entry points of ``triton_module``, when given, as black boxes)."""
    trace = DecodeTrace()
    step, admit = Engine._device_step, Engine._admit
    kernels = {name: getattr(triton_module, name) for name in KERNELS} if triton_module is not None else {}

    def traced(engine, ix):
        before = _python_state(engine)
        watch = StepTrace()
        for name, kernel in kernels.items():
            monkeypatch.setattr(triton_module, name, watch.black_box(name, kernel))
        with watch:
            out = step(engine, ix)
        after = _python_state(engine)
        trace.steps.append(watch.ops)
        trace.side_effects.append({k: (before.get(k), v) for k, v in after.items() if before.get(k) != v})
        return out

    def admitting(engine, *args):
        trace.admitted_after.append(len(trace.steps))
        return admit(engine, *args)

    monkeypatch.setattr(Engine, "_device_step", traced)
    monkeypatch.setattr(Engine, "_admit", admitting)
    trace.hypotheses = decode()
    monkeypatch.undo()
    return trace


def replay_mismatches(trace: DecodeTrace) -> list[str]:
    """Where a replay of the captured step would differ from the eager step (empty: nowhere)."""
    captured = trace.steps[CAPTURED]
    found = []
    for n, ops in enumerate(trace.steps[CAPTURED + 1:], CAPTURED + 1):
        first = next((j for j, (got, want) in enumerate(zip(ops, captured)) if got != want), None)
        if first is not None:
            found.append(f"step {n}, operator {first} {ops[first][0]}: {_difference(ops[first], captured[first])}")
        elif len(ops) != len(captured):
            found.append(f"step {n}: {len(ops)} operators, captured {len(captured)}")
        if trace.side_effects[n]:
            found.append(f"step {n} changes Python state a replay would not: {sorted(trace.side_effects[n])}")
    return found


def _difference(got: tuple, want: tuple) -> str:
    if got[0] != want[0]:
        return f"operator {got[0]} where the capture ran {want[0]}"
    for i, (a, b) in enumerate(zip(got[1], want[1])):
        if a != b:
            return f"argument {i} is {a}, at capture {b}"
    return "argument count differs"
