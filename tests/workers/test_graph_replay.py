"""The static step is safe to capture once and replay (``tests/workers/replay_trace.py``): after the
captured step, every step runs the same operators on the same memory with the same arguments and
changes no Python state, through refills, readbacks every few steps, caps and pruning. On the CPU,
with the operators a GPU runs (ATen's; ``test_triton_ops.py`` repeats this with the Triton kernels
under the interpreter). And the check can fail: a refill that reassigns the search state instead of
writing it in place is caught."""
from __future__ import annotations

import pytest
import torch

from tests.workers.replay_trace import CAPTURED, replay_mismatches, trace_static_decode
from raymt.workers.kernels.isa import bf16_refusal, detect
from raymt.workers.search.beams import SlotState
from raymt.workers.config import PruningConfig, SearchConfig
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
from raymt.workers.kernels.speedups import CpuSpeedups
from raymt.workers.decoder.static_step import StaticStep
from raymt.workers.model.step_ops import ATEN, AtenOps
from raymt.workers.decoder.core_decoder import CoreDecoder

TEXTS = ["Ein Hund rennt über die Wiese.", "Zwei Männer spielen Fußball im Park.", "Eine Frau liest.",
         "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.", "Zwei Hunde.", "Ein Mann schläft."]


class OnDevice(AtenOps):
    """ATen's operators answering ``may_any`` as on a GPU (never reading the device mid-step)."""

    def may_any(self, mask: torch.Tensor) -> bool:
        return True


def on_device(demo_model_dir, speedups: CpuSpeedups):
    translator = CoreDecoder.load(str(demo_model_dir), speedups=speedups)  # (no CPU-only rewrites, as on a GPU)
    translator.checkpoint.model.model.decoder.ops = OnDevice()
    yield translator
    translator.checkpoint.model.model.decoder.ops = ATEN


@pytest.fixture(scope="module")
def translator(demo_model_dir) -> CoreDecoder:
    yield from on_device(demo_model_dir, CpuSpeedups())


@pytest.fixture(scope="module")
def bf16(demo_model_dir) -> CoreDecoder:
    if why := bf16_refusal(detect()):
        pytest.skip(why)
    yield from on_device(demo_model_dir, CpuSpeedups(bf16=True))


def static_decode(translator: CoreDecoder, beam: int, readback: int, policy: Policy = Policy.TOPUP,
                  pruning: PruningConfig | None = None, late: bool = False):
    sources = translator.encode(TEXTS)
    cfg = SearchConfig(beam_size=beam, num_hypotheses=1, max_length_a=0.0, max_length_b=9,
                       pruning=pruning or PruningConfig())
    batching = SchedulerConfig(policy=policy, max_batch_sentences=2, capacity=2)
    return lambda: translator.decode_ids(sources, DecodeRequest(
        cfg, schedule=batching, static=StaticStep(readback_every=readback, late=late))).hypotheses


@pytest.mark.parametrize("beam, readback, policy, pruning, late", [
    (3, 1, Policy.TOPUP, None, False), (3, 4, Policy.TOPUP, None, False), (1, 2, Policy.TOPUP, None, False),
    (3, 2, Policy.VAR_STREAM, None, False), (4, 1, Policy.TOPUP, PruningConfig(rp=0.6, mc=2), False),
    (3, 4, Policy.TOPUP, None, True)])
def test_every_step_after_the_capture_repeats_it(translator, monkeypatch, beam, readback, policy, pruning, late):
    trace = trace_static_decode(monkeypatch, static_decode(translator, beam, readback, policy, pruning, late))
    assert len(trace.steps) > 12 and len(trace.steps[CAPTURED]) > 100
    assert [n for n in trace.admitted_after if n > CAPTURED + 1], "no refill between replays: nothing tested"
    assert replay_mismatches(trace) == []


def test_the_bf16_step_repeats_it_too(bf16, monkeypatch):
    trace = trace_static_decode(monkeypatch, static_decode(bf16, 3, 2))
    dtypes = {a[5] for _, args in trace.steps[CAPTURED] for a in args if isinstance(a, tuple)}  # (tensor arguments)
    assert torch.bfloat16 in dtypes
    assert replay_mismatches(trace) == []


def test_a_refill_that_reassigns_the_search_state_is_caught(translator, monkeypatch):
    """The check's negative control: a replay would keep reading the old tensor."""
    admit = SlotState.admit

    def reassigning(self, slots, start, keys=None):
        self.last = self.last.clone()
        admit(self, slots, start, keys)

    monkeypatch.setattr(SlotState, "admit", reassigning)
    trace = trace_static_decode(monkeypatch, static_decode(translator, 3, 1))
    found = replay_mismatches(trace)
    assert found and "held" in found[0], found


def test_a_per_step_python_value_in_the_step_is_caught(translator, monkeypatch):
    """The other negative control: a value the host changes each step, passed into the step, would be
    frozen at its captured value by a replay."""
    from raymt.workers.model.cache import KVCache
    step_at, calls = KVCache.step_at, []

    def with_a_changing_t(self, *args, t, **kwargs):
        calls.append(t)  # (kept outside the engine: a changed attribute would be caught for another reason)
        return step_at(self, *args, t=t - len(calls) % 2, **kwargs)

    monkeypatch.setattr(KVCache, "step_at", with_a_changing_t)
    found = replay_mismatches(trace_static_decode(monkeypatch, static_decode(translator, 3, 1)))
    assert found and "Python state" not in " ".join(found), found
