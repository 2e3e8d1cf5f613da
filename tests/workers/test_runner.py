"""The decoder runner (workers/decoder/runner.py): built once per translator, its cache, state and captured
steps reused by every decode call; freed at once on close; on the device it was given; a failed
capture decodes eagerly, out of memory shrinks the slots and says which sizes were tried."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import weakref

import pytest
import torch

from raymt.workers.model.cache import KVCache
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.engine import Engine
from raymt.workers.model.output_head import OutputHead
from raymt.workers.model.graphs import WARMUP_STEPS, GraphedStep
from raymt.workers.decoder.runner import CacheNeed, DecodeRunner, bucket
from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
from raymt.workers.kernels.speedups import CpuSpeedups
from raymt.workers.decoder.static_step import StaticStep
from raymt.workers.decoder.core_decoder import CoreDecoder

CALLS = [  # the first batch holds the longest source: later ones fit its cache
    ["Ein Mann mit einem roten Hut fährt mit seinem Fahrrad über eine lange Brücke.", "Ein Hund läuft.",
     "Zwei Männer spielen Fußball.", "Eine Frau liest ein Buch."],
    ["Eine Katze schläft.", "Ein Mann fährt Fahrrad.", "Zwei Kinder essen Eis am Strand.", "Ein Vogel singt.",
     "Kinder spielen im Park."],
    ["Eine Frau tanzt.", "Drei Hunde rennen über die Wiese.", "Ein Junge springt ins Wasser.", "Ein Mann kocht."],
]
CFG = SearchConfig(beam_size=3, num_hypotheses=2, max_length_a=0.0, max_length_b=12)  # one cap: one capacity


class Rerun:
    """A captured step on the CPU: ``replay`` reruns the step it captured, as a CUDA graph's replay
    recomputes it from the runner's persistent tensors."""

    def __init__(self, step, stream, pool) -> None:
        self.step = step

    def replay(self) -> torch.Tensor:
        return self.step()


def raising(error: Exception):
    def capture(step, stream, pool):
        raise error
    return capture


@pytest.fixture(scope="module")
def tr(demo_model_dir):
    return CoreDecoder.load(str(demo_model_dir), max_batch_size=4)


@pytest.fixture(scope="module")
def expected(tr):
    """Each call's hypotheses from an engine with a runner of its own (the decoder before runners)."""
    return [tokens(Engine(tr.checkpoint.model, CFG, SchedulerConfig(max_batch_sentences=4, capacity=4),
                          forced_eos=tr.forced_eos).decode(sorted(tr.encode(texts), key=len)))
            for texts in CALLS]


def tokens(hyps) -> list:
    return [[h.tokens for h in x] for x in hyps]


def decode_calls(tr: CoreDecoder, **kwargs) -> list:
    return [tokens(tr.decode_ids(sorted(tr.encode(texts), key=len), DecodeRequest(CFG, **kwargs)).hypotheses) for texts in CALLS]


def test_one_runner_serves_every_call_with_one_cache(demo_model_dir, expected):
    tr = CoreDecoder.load(str(demo_model_dir), max_batch_size=4)
    got = decode_calls(tr)  # three calls, batches of 4, 4 and 1, 4
    runner = tr.runner
    assert got == expected
    assert tr.runner is runner and runner.counts.caches == 1 and runner.counts.states == 1
    topup = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=4, capacity=4)
    assert decode_calls(tr, schedule=topup) == expected  # streaming calls fill the same slots
    assert runner.counts.caches == 1
    long = ["Ein Mann " + "und ein Hund " * 12 + "laufen."]  # a longer source than the cache holds: it grows
    tr.decode_ids(tr.encode(long), DecodeRequest(CFG))
    assert runner.counts.caches == 2 and runner.cache.cross_k.shape[3] >= len(tr.encode(long)[0])
    assert dataclasses.replace(tr, max_batch_size=2).runner is runner  # a copy decodes on the same cache


def test_the_static_step_is_captured_once_per_bucket_across_calls(demo_model_dir, expected):
    tr = CoreDecoder.load(str(demo_model_dir), max_batch_size=4)
    tr._runner = DecodeRunner(tr.checkpoint.model, capture=Rerun)  # graphs on the CPU: counted, replayed
    got = decode_calls(tr, static=StaticStep())
    assert got == expected
    assert (tr.runner.counts.caches, tr.runner.counts.captures) == (1, 1)
    batching = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=2, capacity=2)  # another bucket
    assert decode_calls(tr, schedule=batching, static=StaticStep()) == expected
    assert (tr.runner.counts.caches, tr.runner.counts.captures) == (1, 2)
    assert [bucket(n, 1024) for n in (1, 2, 3, 5, 600)] == [1, 2, 4, 8, 1024] and bucket(6, 6) == 6


def test_a_failed_capture_decodes_eagerly_with_one_warning(demo_model_dir, expected, caplog):
    tr = CoreDecoder.load(str(demo_model_dir), max_batch_size=4)
    tr._runner = DecodeRunner(tr.checkpoint.model, capture=raising(RuntimeError("operation not permitted when "
                                                                                 "stream is capturing")))
    with caplog.at_level(logging.WARNING, logger="raymt.workers.model.graphs"):
        assert decode_calls(tr, static=StaticStep()) == expected
    warnings = [r.getMessage() for r in caplog.records if r.name == "raymt.workers.model.graphs"]
    assert len(warnings) == 1 and "decoding eagerly" in warnings[0] and "not permitted" in warnings[0]
    assert "\n" not in warnings[0] and tr.runner.counts.captures == 1  # (not tried again for the bucket)


def test_warm_up_and_capture_run_on_one_stream_and_replays_follow(monkeypatch):
    """The first ``WARMUP_STEPS`` steps run eagerly on the side stream the capture then records on
    (torch's stream calls answered on the CPU), as torch's CUDA graph guide warms up; the next is
    captured there, later ones replay it."""
    entered = []

    class Stream:
        def wait_stream(self, other) -> None:
            pass

    @contextlib.contextmanager
    def on(stream):
        entered.append(stream)
        yield

    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", on)
    side, captured_on = Stream(), []
    graph = GraphedStep(stream=side, capture=lambda step, stream, pool: captured_on.append(stream) or Rerun(step, 0, 0))
    outputs = [graph.run(lambda i=i: torch.tensor([i])) for i in range(WARMUP_STEPS + 3)]
    assert WARMUP_STEPS >= 2 and entered == [side] * WARMUP_STEPS and captured_on == [side]  # one stream
    warm = list(range(WARMUP_STEPS))  # run eagerly; then the captured step, replayed
    assert [int(x) for x in outputs] == warm + [WARMUP_STEPS] * 3 and graph.graph is None


def test_out_of_memory_capturing_names_the_slots_tried_and_shrinks_the_bucket(demo_model_dir, expected):
    tr = CoreDecoder.load(str(demo_model_dir), max_batch_size=4)
    fits = {"slots": 2}

    def capture(step, stream, pool):  # a device where a graph of more than 2 slots does not fit
        if tr.runner.cache is not None and tr.runner._static and max(k[0] for k in tr.runner._static) > fits["slots"]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return Rerun(step, stream, pool)

    tr._runner = DecodeRunner(tr.checkpoint.model, capture=capture)
    sources = sorted(tr.encode(CALLS[1]), key=len)
    engine = Engine(tr.checkpoint.model, CFG, SchedulerConfig(max_batch_sentences=4, capacity=4),
                    forced_eos=tr.forced_eos, static=StaticStep(), runner=tr.runner)
    with pytest.raises(torch.OutOfMemoryError, match=r"4 slots.*slots tried: 4; later calls decode in at most 2"):
        engine.decode(sources)
    assert tr.runner.slot_cap == 2
    assert decode_calls(tr, static=StaticStep()) == expected  # later calls: 2 slots, captured once
    assert tr.runner.counts.captures == 2


def test_out_of_memory_sizing_the_cache_halves_the_slots(demo_model_dir, expected, monkeypatch, caplog):
    tr = CoreDecoder.load(str(demo_model_dir), max_batch_size=4)
    model, tried = tr.checkpoint.model, []
    real = model.new_cache

    def small_device(slots, *args, **kwargs):
        tried.append(slots)
        if slots > 1:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(slots, *args, **kwargs)

    monkeypatch.setattr(model, "new_cache", small_device)
    with caplog.at_level(logging.WARNING, logger="raymt.workers.decoder.runner"):
        assert decode_calls(tr) == expected
    assert tried == [4, 2, 1] and tr.runner.slot_cap == 1 and tr.runner.counts.caches == 1
    assert "slots tried: 4, 2, 1; decoding with 1" in caplog.text
    monkeypatch.setattr(model, "new_cache", lambda *a, **k: small_device(2, *a[1:], **k))  # not even one fits
    engine = Engine(model, CFG, SchedulerConfig(max_batch_sentences=4, capacity=4))
    with pytest.raises(torch.OutOfMemoryError, match="KV cache; slots tried: 4, 2, 1"):
        engine.decode(tr.encode(CALLS[1]))


@pytest.mark.parametrize("static", [False, True])
def test_closing_frees_the_cache_without_a_garbage_collection(demo_model_dir, static):
    """No reference cycle holds a decode's cache (the engine's static index buffer once held a bound
    method of the engine): reference counting alone frees it."""
    gc.collect()
    gc.disable()
    try:
        tr = CoreDecoder.load(str(demo_model_dir), max_batch_size=4)
        tr.decode_ids(tr.encode(CALLS[1]), DecodeRequest(CFG, static=StaticStep() if static else None))
        cache, state = weakref.ref(tr.runner.cache), weakref.ref(tr.runner.state)
        tr.close()
        assert cache() is None and state() is None
        engine = Engine(tr.checkpoint.model, CFG, SchedulerConfig(max_batch_sentences=2, capacity=2),
                        static=StaticStep() if static else None)  # an engine with a runner of its own
        engine.decode(tr.encode(CALLS[1]))
        cache = weakref.ref(engine.cache)
        del engine
        assert cache() is None
    finally:
        gc.enable()


def test_every_tensor_the_runner_makes_is_on_its_device(demo_model_dir):
    model = CoreDecoder.load(str(demo_model_dir), device="meta").checkpoint.model
    runner = DecodeRunner(model, capture=Rerun)
    with torch.device("cpu"):  # anything created without device= would land here, not on meta
        slots = runner.reserve(CacheNeed(4, 3, 9, 13, static=True), pad=model.config.pad_token_id)
        made = [runner.norm(1.0, 14), runner.beams(3)]
        copier = runner.copier(64, 2)
        static = runner.static_indices(slots, 3, True, copier)
        made += [static.all_rows, static.all_slots]
    made += [getattr(x, f) for x in (runner.cache, runner.state) for f in x.__dataclass_fields__
             if isinstance(getattr(x, f), torch.Tensor)]
    assert slots == 4 and len(made) > 12 and {t.device.type for t in made} == {"meta"}
    assert runner.held_bytes() > 0 and copier.device.type == "meta"


def test_a_cuda_runner_enters_its_device_index(demo_model_dir, monkeypatch):
    """On CPU, as far as CPU can show it: device N becomes the current device, each call runs inside
    ``torch.cuda.device(N)``, and the capture stream is made on N."""
    calls = []

    @contextlib.contextmanager
    def entered(device):
        calls.append(("device", torch.device(device)))
        yield

    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", torch.device(device))))
    monkeypatch.setattr(torch.cuda, "device", entered)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: calls.append(("stream", device)) or object())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")

    class OnGpu3:
        device = torch.device("cuda:3")

    runner = DecodeRunner(OnGpu3())
    head = OutputHead(None, torch.zeros(6, 4), None)
    with runner.scope():
        graph, _ = runner.graph(8, ("search",), head)
    assert calls == [("set_device", torch.device("cuda:3")), ("device", torch.device("cuda:3")),
                     ("stream", torch.device("cuda:3"))]
    assert graph.pool == "pool" and runner.graph(8, ("search",), head)[0] is graph  # one per bucket


def test_a_graph_pool_is_reused_only_while_a_captured_graph_holds_it(monkeypatch):
    """Torch refuses a capture into a pool whose graphs are all gone (its use count is 0), so a
    replaced graph's successor gets a fresh pool unless another bucket's captured graph keeps it."""
    handles = iter(range(100))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: object())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(handles))
    runner = DecodeRunner(type("Model", (), {"device": torch.device("cuda")})())
    head = OutputHead(None, torch.zeros(6, 4), None)
    pools = [runner.graph(8, (search,), head)[0].pool for search in ("a", "b")]
    assert pools == [0, 1]  # (the first graph never captured: nothing holds its pool)
    held, _ = runner.graph(4, ("a",), head)
    held.captured = type("Captured", (), {"graph": "a CUDA graph"})()
    assert runner.graph(8, ("c",), head)[0].pool == held.pool == 2  # bucket 4's captured graph holds it


def test_the_identity_gather_is_a_view():
    cache = KVCache.empty(layers=1, heads=1, head_dim=2, slots=3, beam_size=2, source_capacity=4,
                          dtype=torch.float32, device=torch.device("cpu"), zeroed=True, target_capacity=6)
    cache.ancestry.copy_(torch.randint(0, 6, (6, 6)))
    every = torch.arange(6)
    at = cache.step_at(torch.zeros(6, dtype=torch.long), every, torch.full((6,), 2), every, torch.arange(3), t=3,
                       s=4, shared=True, first=0)
    assert at.ancestry.data_ptr() == cache.ancestry.data_ptr() and at.ancestry.is_contiguous()  # no copy
    assert torch.equal(at.ancestry, cache.ancestry[:3].index_select(1, every))
    some = torch.arange(2, 6)
    at = cache.step_at(torch.zeros(4, dtype=torch.long), some, torch.full((4,), 2), some, torch.arange(1, 3), t=3,
                       s=4, shared=True, first=1)
    assert at.ancestry.data_ptr() != cache.ancestry.data_ptr()
    assert torch.equal(at.ancestry, cache.ancestry[:3, 2:])


def shortlist(specials: tuple[int, ...], start: int, size: int) -> torch.Tensor:
    """A sorted candidate set of ``size`` ids: the specials, then ids from ``start`` on."""
    others = [i for i in range(start, start + size) if i not in specials][: size - len(specials)]
    return torch.tensor(sorted({*specials, *others}))


def test_same_size_shortlists_share_one_graph_and_each_call_reads_its_own_head(demo_model_dir):
    """A replay reads the head the graph was given: the runner's fixed buffers, into which each call
    copies its own shortlist. ``Rerun`` replays the capturing call's step (as a CUDA graph replays
    its kernels): were the head that call's own, the second call would decode over the first's.
    (No CPU rewrites, as on a GPU: a shortlist head is plain tensors, not a packed module.)"""
    tr = CoreDecoder.load(str(demo_model_dir), max_batch_size=4, speedups=CpuSpeedups())
    model, sources = tr.checkpoint.model, sorted(tr.encode(CALLS[1]), key=len)
    first, second = (shortlist(tr.special_target_ids(), start, 400) for start in (2, 150))
    assert first.shape == second.shape and not torch.equal(first, second)
    schedule = SchedulerConfig(max_batch_sentences=4, capacity=4)

    def decode(candidates, runner=None):
        engine = Engine(model, CFG, schedule, forced_eos=tr.forced_eos, candidates=candidates,
                        static=StaticStep(), runner=runner)
        return tokens(engine.decode(sources))

    eager = [decode(c) for c in (first, second)]  # (a runner of its own on the CPU: no graph)
    assert eager[0] != eager[1], "the shortlists decode alike: nothing tested"
    runner = DecodeRunner(model, capture=Rerun)
    assert [decode(c, runner) for c in (first, second, first)] == [eager[0], eager[1], eager[0]]
    assert runner.counts.captures == 1  # (one bucket, one shape of head: one graph for every call)
    held = next(iter(runner._graphs.values()))
    assert torch.equal(held.head.ids, first) and held.head.ids.data_ptr() != first.data_ptr()  # the runner's copy


def test_a_head_that_cannot_be_copied_is_held_by_its_graph():
    """A packed head (its own module) is not copied: its graph keeps it, so no later head can take
    its memory or its ``id`` while the graph may replay it; another such head is another graph."""
    runner = DecodeRunner(type("Model", (), {"device": torch.device("cpu")})(), capture=Rerun)
    packed = OutputHead(torch.arange(4), torch.zeros(4, 2), None, linear=object())
    graph, head = runner.graph(2, ("search",), packed)
    ref = weakref.ref(packed)
    del packed, head
    gc.collect()
    assert ref() is not None and runner._graphs[2].head is ref()
    other = OutputHead(torch.arange(4), torch.zeros(4, 2), None, linear=object())
    assert runner.graph(2, ("search",), other)[0] is not graph and ref() is None  # (replaced: now freed)


def test_a_reallocation_drops_graphs_and_hands_memory_back_before_allocating(demo_model_dir, monkeypatch):
    """A larger cache or beam state is never allocated beside the old generation's graphs, index
    buffers and cached blocks: they are dropped and released first (on CUDA ``empty_cache``)."""
    from raymt.workers.decoder import runner as runner_module
    from raymt.workers.search.beams import SlotState

    tr = CoreDecoder.load(str(demo_model_dir), max_batch_size=4)
    runner = tr._runner = DecodeRunner(tr.checkpoint.model, capture=Rerun)
    tr.decode_ids(tr.encode(CALLS[1]), DecodeRequest(CFG, static=StaticStep()))
    assert runner._graphs and runner._static and runner.counts.captures == 1
    events = []

    def seen(what):
        return what, len(runner._graphs), len(runner._static)

    monkeypatch.setattr(runner_module, "release_cached", lambda device: events.append(seen("release")))
    new_cache, empty, grow = runner.model.new_cache, SlotState.empty, KVCache.reserve
    monkeypatch.setattr(runner.model, "new_cache", lambda *a, **k: events.append(seen("cache")) or new_cache(*a, **k))
    monkeypatch.setattr(SlotState, "empty", lambda *a, **k: events.append(seen("state")) or empty(*a, **k))
    monkeypatch.setattr(KVCache, "reserve", lambda cache, n: (events.append(seen("grow")) if n > cache.max_length
                                                              else None) or grow(cache, n))
    long = tr.encode(["Ein Mann " + "und ein Hund " * 12 + "laufen."])  # a longer source: a new cache
    tr.decode_ids(long, DecodeRequest(CFG, static=StaticStep()))
    tr.decode_ids(long, DecodeRequest(dataclasses.replace(CFG, max_length_b=40), static=StaticStep()))  # longer targets: both grow
    allocations = [i for i, e in enumerate(events) if e[0] != "release"]
    assert {events[i][0] for i in allocations} == {"cache", "state", "grow"}, events
    for i in allocations:
        assert events[i][1:] == (0, 0) and events[i - 1] == ("release", 0, 0), events
    assert runner.counts.captures == 3  # (each generation captured anew)


def test_release_cached_empties_torch_cache_on_cuda_only(monkeypatch):
    from raymt.workers.model.graphs import release_cached

    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    release_cached(torch.device("cpu"))
    assert emptied == []
    release_cached(torch.device("cuda:1"))
    assert emptied == [True]


def test_free_memory_leaves_graph_pools_out(monkeypatch):
    """Torch's idle blocks of its default pool are free to a new cache; a graph pool's are not (they
    stay reserved for its replays), nor are another device's."""
    from raymt.workers.model.graphs import free_memory

    segments = [dict(device=0, segment_pool_id=(0, 0), total_size=300, allocated_size=100),
                dict(device=0, segment_pool_id=(1, 0), total_size=400, allocated_size=50),  # a graph pool
                dict(device=1, segment_pool_id=(0, 0), total_size=800, allocated_size=0)]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1000, 5000))
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: segments)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert free_memory(torch.device("cuda")) == 1000 + 200
    assert free_memory(torch.device("cuda:1")) == 1000 + 800


def test_the_slot_estimate_counts_the_source_positions_the_cache_allocates(demo_model_dir, monkeypatch):
    """A GPU call's slots are fitted with each slot's cross-attention K/V at the cache's rounded
    source capacity (a 9-token source takes 16 positions), not the longest source's length."""
    from raymt.workers.decoder import core_decoder as core_decoder_module
    from raymt.workers.model import graphs
    from raymt.workers.decoder.runner import source_capacity

    tr = CoreDecoder.load(str(demo_model_dir), max_batch_size=4)
    sources, estimated = sorted(tr.encode(CALLS[1]), key=len), []
    real = core_decoder_module.bytes_per_sentence
    monkeypatch.setattr(graphs, "free_memory", lambda device: 2**40)
    monkeypatch.setattr(core_decoder_module, "bytes_per_sentence", lambda **k: estimated.append(k) or real(**k))
    tr._fit_to_memory(SchedulerConfig(max_batch_sentences=4, capacity=4), sources, CFG, None)
    tr.decode_ids(sources, DecodeRequest(CFG))
    assert max(map(len, sources)) == 9 and source_capacity(9, 512) == 16
    assert estimated[0]["max_source"] == tr.runner.cache.cross_k.shape[3] == 16
