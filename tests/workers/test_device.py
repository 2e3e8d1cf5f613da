"""Every tensor a decode creates follows the model's device.

Decoding runs here with torch's default device set to ``meta`` while the model stays on the CPU:
a tensor created without ``device=`` lands on ``meta`` and the decode fails (or its output changes),
so equal outputs prove no creation on the decode path assumes the CPU. The same code then runs
with the model on any device (``CoreDecoder.load(..., device=)``).
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from raymt.workers.config import PruningConfig, SamplingConfig, SearchConfig
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
from raymt.workers.search.shortlist import LexicalTable, Shortlist
from raymt.workers.model.step_ops import ATEN
from raymt.workers.decoder.core_decoder import CoreDecoder

TEXTS = ["Ein Hund rennt über die Wiese.", "Zwei Männer spielen Fußball im Park.", "", "Eine Frau liest."]


@pytest.fixture(scope="module")
def translator(demo_model_dir):
    return CoreDecoder.load(str(demo_model_dir), max_batch_size=2)


def decode(translator: CoreDecoder, beam: int, batching=None, shortlist=None) -> list[str]:
    return [t.text for t in translator.translate(TEXTS, SearchConfig(beam_size=beam, num_hypotheses=1), shortlist,
                                                 batching)]


@pytest.mark.parametrize("beam, policy", [(1, None), (3, None), (3, Policy.VAR_STREAM), (3, Policy.TOPUP),
                                          (1, Policy.FIXED)])
def test_decoding_creates_every_tensor_on_the_models_device(translator, beam, policy):
    batching = None if policy is None else SchedulerConfig(policy=policy, max_batch_sentences=2, capacity=2)
    expected = decode(translator, beam, batching)
    with torch.device("meta"):  # anything created without device= would be a meta tensor
        assert decode(translator, beam, batching) == expected


def test_a_shortlisted_decode_moves_its_candidates_to_the_model(translator):
    vocab = translator.checkpoint.model.config.decoder_vocab_size
    shortlist = Shortlist(LexicalTable({}, list(range(vocab))), top_m=0, top_n=vocab,
                          special_ids=translator.special_target_ids())
    expected = decode(translator, 2, shortlist=shortlist)
    with torch.device("meta"):
        assert decode(translator, 2, shortlist=shortlist) == expected
    assert translator.checkpoint.model.device == torch.device("cpu")


def test_load_places_the_model_and_keeps_the_cpu_rewrites_to_the_cpu(demo_model_dir):
    from raymt.workers.kernels.speedups import onednn_available
    plain = CoreDecoder.load(str(demo_model_dir), device=torch.device("cpu"))
    assert plain.checkpoint.model.device == torch.device("cpu")
    assert (plain.checkpoint.model.vocab_head is not None) == onednn_available()  # the CPU rewrites applied
    meta = CoreDecoder.load(str(demo_model_dir), device="meta")  # shapes only: a second device type on any machine
    model = meta.checkpoint.model
    assert model.device == torch.device("meta") and model.ops is ATEN and model.vocab_head is None
    assert all(p.device.type == "meta" for p in model.parameters())


def test_the_static_step_creates_every_tensor_on_the_models_device(translator):
    from raymt.workers.decoder.engine import Engine, StaticStep

    sources = translator.encode(TEXTS[:2] + TEXTS[3:])
    sched = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=2, capacity=2)
    engine = Engine(translator.checkpoint.model, SearchConfig(beam_size=3), sched, static=StaticStep())
    expected = [h[0].tokens for h in engine.decode(sources)]
    with torch.device("meta"):
        assert [h[0].tokens for h in engine.decode(sources)] == expected


def test_batch_decoding_with_the_static_step_runs_its_batches_on_one_engine(translator, monkeypatch):
    """A static step is captured once per engine on a GPU, so batch decoding with it runs every batch
    (max_batch_size = 2 here: three batches) on one engine, and decodes exactly as batch decoding."""
    from raymt.workers.decoder.engine import StaticStep

    sources = translator.encode(TEXTS[:2] + TEXTS[3:] + ["Ein Mann fährt Fahrrad.", "Kinder spielen."])
    cfg = SearchConfig(beam_size=3, num_hypotheses=2)
    expected = translator.decode_ids(sources, DecodeRequest(cfg)).hypotheses
    built = []
    make = translator._engine
    monkeypatch.setattr(translator, "_engine", lambda *a, **k: built.append(1) or make(*a, **k))
    got = translator.decode_ids(sources, DecodeRequest(cfg, static=StaticStep(readback_every=2))).hypotheses
    assert [[h.tokens for h in x] for x in got] == [[h.tokens for h in x] for x in expected]
    assert [h.score for x in got for h in x] == pytest.approx([h.score for x in expected for h in x], abs=1e-5)
    assert len(built) == 1  # (the static step attends over the full capacity: equal scores to ~1e-7)
    translator.decode_ids(sources, DecodeRequest(cfg))
    assert len(built) == 4  # (without it: one engine per batch)


class _Stepped(Exception):
    """Raised after the first device step: its readback needs data, which meta tensors do not hold."""


class _CrossDevice(TorchDispatchMode):
    """Records every operator that mixes host tensors with the device's: on a GPU, a host-to-device
    copy inside a captured step (a CUDA graph would replay a stale host value, or refuse to capture)."""

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [a for a in tree_leaves((args, kwargs or {})) if isinstance(a, torch.Tensor)]
        if len({a.device.type for a in tensors}) > 1:
            self.mixed.append(str(func))
        return func(*args, **kwargs or {})


@pytest.mark.parametrize("beam, static, pruning", [(3, True, None), (1, True, None), (3, False, None),
                                                   (1, False, None), (3, True, PruningConfig(rp=0.6, mc=2)),
                                                   (3, False, PruningConfig(rp=0.6, mc=2)),
                                                   (3, True, SamplingConfig(topp=0.9)), (2, False, SamplingConfig()),
                                                   (2, True, SamplingConfig(topk=5))])
def test_the_device_step_never_reads_the_device(demo_model_dir, beam, static, pruning):
    """The step a CUDA graph captures (``Engine._device_step``: model step, search step, pools,
    reorder) runs here on a ``meta`` model, where any read of a tensor's values (``.item()``,
    ``bool()``, ``nonzero``, a boolean-mask index) raises: so the step has no host sync and a data-
    independent shape, which capture needs, and it creates nothing from host values."""
    from raymt.workers.decoder.engine import Engine, StaticStep

    sources = CoreDecoder.load(str(demo_model_dir)).encode(TEXTS[:2] + TEXTS[3:])
    model = CoreDecoder.load(str(demo_model_dir), device="meta").checkpoint.model
    sched = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=2, capacity=2)
    search = SearchConfig(beam_size=beam, sampling=pruning) if isinstance(pruning, SamplingConfig) \
        else SearchConfig(beam_size=beam, pruning=pruning or PruningConfig())  # (sampling: the step's other proposal)
    engine = Engine(model, search, sched,
                    static=StaticStep() if static else None)
    step, seen = engine._device_step, {}

    def watched(ix):
        with _CrossDevice() as watch:
            seen["packed"] = step(ix)
        seen["mixed"] = watch.mixed
        raise _Stepped

    engine._device_step = watched
    with pytest.raises(_Stepped):  # (not a meta "cannot read" error from inside the step)
        engine.decode(sources)
    assert seen["packed"].device.type == "meta" and seen["packed"].shape[0] == 2
    assert seen["mixed"] == []


def test_int8_off_the_cpu_is_refused_before_anything_loads(demo_model_dir, monkeypatch):
    """``device="cuda"`` is a string here: the refusal comes before torch is asked about CUDA or the
    checkpoint is read (on this machine either would fail otherwise, with another error)."""
    import dataclasses

    from raymt.pipeline.decoders import api
    from raymt.workers.decoder import core_decoder as core_decoder_module
    from raymt.workers.decoder.decode_config import RuntimeConfig
    from raymt.workers.kernels.speedups import EXACT, CpuSpeedups

    def untouched(*args, **kwargs):
        raise AssertionError("reached past the refusal")

    monkeypatch.setattr(core_decoder_module, "load_checkpoint", untouched)
    monkeypatch.setattr(torch.cuda, "is_available", untouched)
    int8 = dataclasses.replace(EXACT, int8=True)
    for device in ("cuda", "cuda:1", torch.device("cuda", 0)):
        with pytest.raises(ValueError, match=r"int8 runs on the CPU only .*float32, bfloat16 or float16"):
            CoreDecoder.load(str(demo_model_dir), device=device, speedups=int8)
        with pytest.raises(ValueError, match="int8 runs on the CPU only"):
            RuntimeConfig(device=str(device), speedups=int8)
    monkeypatch.setattr(api, "resolve_device", lambda name: torch.device(name))  # (as on a GPU machine)
    monkeypatch.setattr(api.CoreDecoder, "load", untouched)
    with pytest.raises(ValueError, match="int8 runs on the CPU only"):
        api.Translator.load(str(demo_model_dir), device="cuda", compute_type="int8")
    assert RuntimeConfig(device="auto", speedups=int8).speedups.precision == "int8"  # (decided where it decodes)
    assert CpuSpeedups(bf16=True).precision == "bf16" and EXACT.precision == "float32"
    monkeypatch.undo()
    on_cpu = CoreDecoder.load(str(demo_model_dir), speedups=CpuSpeedups(int8=True))
    assert type(on_cpu.checkpoint.model.vocab_head).__name__ == "Int8Linear"  # int8 where it runs
