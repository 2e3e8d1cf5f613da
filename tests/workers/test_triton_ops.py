"""The fused Triton log-softmax + top-k (workers/kernels/triton_ops.py) against ATen's output step.

The kernels run on a CUDA device where there is one, else on the CPU under Triton's interpreter.
The interpreter must be chosen before Triton is first imported, so on a machine without a GPU the
one test below that is not skipped runs this file again in a fresh process with
``TRITON_INTERPRET=1`` (CI's case: the same kernel code, executed by the interpreter)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from raymt.workers.model.step_ops import ATEN
from raymt.workers.decoder.decode_config import DecodeRequest

triton = pytest.importorskip("triton", reason="Triton is not installed (pip install -e '.[test]' brings it)")

from raymt.workers.kernels import triton_ops  # noqa: E402  (after the skip: its kernels need Triton)

RUNNABLE = triton_ops.INTERPRETED or torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
kernels = pytest.mark.skipif(not RUNNABLE, reason="runs in the interpreted subprocess (or on a GPU)")
# Compiled kernels sum in another order than ATen (and use the GPU's exp2): tolerances per dtype of
# the compared values, never tighter than the dtype's own rounding of a log-probability near -10.
TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=1e-2)}


@pytest.mark.skipif(RUNNABLE, reason="the kernels run in this process")
def test_the_kernels_under_the_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], cwd=root,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed, 2 skipped in .*", summary), done.stdout[-2000:]  # skipped: this one, the compile


@kernels
@pytest.mark.parametrize("n, v, k, skip", [(5, 5000, 10, 58), (3, 100, 4, -1), (4, 9000, 28, 0), (2, 2049, 2, 2048),
                                           (1, 3, 2, 1), (0, 300, 4, 1)])
def test_top_k_log_probs_equal_atens(n, v, k, skip):
    torch.manual_seed(n * v + k)
    logits = (torch.randn(n, v) * 4).to(DEVICE)
    values, cols = triton_ops.row_top_log_softmax(logits, k, skip)
    want_values, want_cols = ATEN.row_top(logits, k, skip)
    assert values.dtype == torch.float32 and cols.dtype == torch.int64 and values.shape == (n, min(k, v))
    torch.testing.assert_close(values, want_values, **TOLERANCE[torch.float32])
    assert torch.equal(cols, want_cols)


@kernels
def test_a_strided_and_a_bf16_logits_matrix():
    torch.manual_seed(1)
    wide = torch.randn(4, 6000, device=DEVICE)
    values, cols = triton_ops.row_top_log_softmax(wide[:, :5000], 6, 7)  # rows 6000 apart
    want = ATEN.row_top(wide[:, :5000].contiguous(), 6, 7)
    torch.testing.assert_close(values, want[0])
    assert torch.equal(cols, want[1])
    distinct = torch.full((2, 3000), -10.0, device=DEVICE)  # ten values exact in bf16 across two chunks: no ties
    distinct[:, torch.randperm(3000)[:10]] = torch.arange(10, device=DEVICE, dtype=torch.float32) / 4
    distinct = distinct.to(torch.bfloat16)
    values, cols = triton_ops.row_top_log_softmax(distinct, 5, 0)
    want_values, want_cols = ATEN.row_top(distinct, 5, 0)  # (ATen casts to float32 first, as the kernel reads)
    torch.testing.assert_close(values, want_values, **TOLERANCE[torch.float32])  # (float32 log-probs of bf16 logits)
    assert torch.equal(cols, want_cols)


@kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t, n", [(13, 6), (70, 5), (1, 3), (5, 0)])
def test_attention_through_the_ancestry_equals_atens_gathered_attention(t, n, dtype):
    """Each row over its own history, read in place through the ancestry (``ancestry_attention``),
    against ATen's path: gather the (t, N, H, D) copy, mask past each row's position, attend. Row 0
    reads the whole history, the last (an idle static row) only position 0, across BLOCK chunks."""
    from raymt.workers.model.step_ops import attend
    torch.manual_seed(t * 31 + n)
    big, rows, h, d = 80, 9, 4, 16
    cache = torch.randn(big, 2, rows, h, d, device=DEVICE).to(dtype)  # (T, L, R, H, D): one layer of two
    keys, values = cache[:, 1], cache.flip(0)[:, 1]  # strided views, as the cache's layer is
    ancestry = torch.randint(0, rows, (t, n), device=DEVICE)
    positions = torch.randint(0, t, (n,), device=DEVICE)
    reads = positions + 1
    if n:
        positions[0], reads[0], reads[-1] = t - 1, t, 1
    q = torch.randn(n, h, d, device=DEVICE).to(dtype)
    got = triton_ops.ancestry_attention(q, keys, values, ancestry, reads, d ** -0.5)
    steps = torch.arange(t, device=DEVICE)[:, None]
    k = keys[steps, ancestry].permute(1, 2, 0, 3).float()  # (N, H, t, D)
    v = values[steps, ancestry].permute(1, 2, 0, 3).float()
    mask = (torch.arange(t, device=DEVICE)[None, :] < reads[:, None])[:, None, None, :]
    want = attend(q[:, :, None].float(), k, v, mask)[:, :, 0]
    assert got.dtype == dtype and got.shape == (n, h, d)
    torch.testing.assert_close(got.float(), want, **TOLERANCE[dtype])


@kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("static", [False, True])
def test_attention_over_each_source_equals_atens_cross_attention(dtype, static):
    """Each row over its own sentence's source (``source_attention``: its length, no more), against
    ATen's path over the planned slots' longest source with the padding masked (``static``: every
    slot planned, over the cache's whole source capacity). Lengths 1 to 37, across BLOCK chunks;
    the slots' K/V past their lengths are NaN, which the kernel never reads."""
    from raymt.workers.model.cache import KVCache
    torch.manual_seed(int(static))
    h, d, k, capacity, lengths = 4, 16, 3, 40, [5, 37, 1, 17]
    cache = KVCache.empty(layers=2, heads=h, head_dim=d, slots=4, beam_size=k, source_capacity=capacity,
                          dtype=dtype, device=torch.device(DEVICE), zeroed=True)
    s = max(lengths)
    mask = torch.arange(s, device=DEVICE)[None, :] < torch.tensor(lengths, device=DEVICE)[:, None]  # (4, s)
    cross = [(torch.randn(4, h, s, d, device=DEVICE).to(dtype), torch.randn(4, h, s, d, device=DEVICE).to(dtype))
             for _ in range(2)]
    cache.admit(torch.arange(4, device=DEVICE), cross, mask)
    want_cache = (cache.cross_k.clone(), cache.cross_v.clone())
    written = torch.arange(capacity, device=DEVICE)[None, :] < torch.tensor(lengths, device=DEVICE)[:, None]
    for x in (cache.cross_k, cache.cross_v):  # (L, slots, H, S, D)
        x.masked_fill_(~written[None, :, None, :, None], float("nan"))
    planned = [0, 1, 2, 3] if static else [0, 1, 3]
    rows = [j * k + b for j in planned for b in range(k)][:-1]  # the last slot's last beam is not live
    grid = [planned.index(r // k) * k + r % k for r in rows]
    t = lambda x: torch.tensor(x, device=DEVICE)  # noqa: E731
    at = cache.step_at(t([0] * len(rows)), t(rows), t([0] * len(rows)), t(grid), t(planned), t=1,
                       s=capacity if static else max(lengths[j] for j in planned), shared=True,
                       first=0 if static else -1)
    q = torch.randn(len(rows), h * d, device=DEVICE).to(dtype)
    got = triton_ops.TritonOps().cross_attention(q, cache, 1, at)
    cache.cross_k, cache.cross_v = want_cache  # (ATen reads up to s: the padding must be finite there)
    want = ATEN.cross_attention(q.float(), replace(cache, cross_k=cache.cross_k.float(), cross_v=cache.cross_v.float(),
                                                   cross_bias=cache.cross_bias.float()), 1, at)
    assert got.dtype == dtype and got.shape == (len(rows), h * d)
    torch.testing.assert_close(got.float(), want, **TOLERANCE[dtype])


@kernels
def test_equal_values_keep_the_lower_column_first_across_chunks():
    logits = torch.zeros(2, 5000, device=DEVICE)
    logits[:, [4500, 30, 2100, 31]] = 3.0  # ties in three chunks of 2048 columns
    values, cols = triton_ops.row_top_log_softmax(logits, 5, 31)
    assert cols[0].tolist() == [30, 2100, 4500, 0, 1]  # <pad> (31) never chosen; then the zeros, lowest first
    assert torch.all(values[:, :3] == values[0, 0]) and torch.all(values[:, 3:] < values[0, 0])
    norm = torch.logsumexp(logits[0].double(), 0)
    torch.testing.assert_close(values[0, 0].double().cpu(), (3.0 - norm).cpu(), **TOLERANCE[torch.float32])


@kernels
def test_rows_with_fewer_candidates_than_k_fill_with_minus_infinity():
    logits = torch.full((1, 6), float("-inf"), device=DEVICE)
    logits[0, 2], logits[0, 4] = 1.0, 0.5  # <pad> at 4: one real candidate for k = 3
    values, cols = triton_ops.row_top_log_softmax(logits, 3, 4)
    assert cols.tolist() == [[2, 4, 4]]
    want = 1.0 - torch.logsumexp(torch.tensor([1.0, 0.5]), 0).item()
    assert values[0, 0].item() == pytest.approx(want, abs=TOLERANCE[torch.float32]["atol"])
    assert values[0, 1:].tolist() == [float("-inf")] * 2


@kernels
@pytest.mark.parametrize("beam, shortlisted", [(1, False), (4, True)])
def test_a_decode_with_the_fused_output_step_equals_atens(demo_model_dir, beam, shortlisted):
    from raymt.workers.config import SearchConfig
    from raymt.workers.search.shortlist import LexicalTable, Shortlist
    from raymt.workers.decoder.core_decoder import CoreDecoder
    translator = CoreDecoder.load(str(demo_model_dir), device=DEVICE)
    model = translator.checkpoint.model
    shortlist = None
    if shortlisted:  # candidate columns: the head gathers output-layer rows, the kernel maps columns back
        ids = list(range(0, model.config.decoder_vocab_size, 7))
        shortlist = Shortlist(LexicalTable({}, ids), top_m=0, top_n=len(ids), special_ids=translator.special_target_ids())
    texts = ["Ein Hund rennt über die Wiese.", "Eine Frau liest."]
    cfg = SearchConfig(beam_size=beam, num_hypotheses=1)
    decoder = model.model.decoder
    fused = triton_ops.TritonOps()
    decoder.ops = fused
    got = [t.text for t in translator.translate(texts, cfg, shortlist)]
    decoder.ops = ATEN
    assert got == [t.text for t in translator.translate(texts, cfg, shortlist)]
    assert triton_ops.device_ops(torch.device("cpu")) is ATEN  # the CPU's backend comes from workers/kernels/speedups.py


@kernels
def test_the_static_step_with_the_fused_output_step_decodes_as_atens_dynamic_one(demo_model_dir):
    """The one-shape step a CUDA graph replays (every slot's rows, forced EOS at the caps, results
    read back every other step) with the Triton output step: the dynamic ATen step's outputs."""
    from raymt.workers.config import SearchConfig
    from raymt.workers.decoder.engine import StaticStep
    from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
    from raymt.workers.decoder.core_decoder import CoreDecoder
    translator = CoreDecoder.load(str(demo_model_dir), device=DEVICE)
    decoder = translator.checkpoint.model.model.decoder
    sources = translator.encode(["Ein Hund rennt über die Wiese.", "Eine Frau liest.", "Zwei Männer."])
    cfg = SearchConfig(beam_size=2, num_hypotheses=2, max_length_a=0.0, max_length_b=6)
    batching = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=2, capacity=2)
    decoder.ops = ATEN
    want = translator.decode_ids(sources, DecodeRequest(cfg, schedule=batching)).hypotheses
    decoder.ops = triton_ops.TritonOps()
    got = translator.decode_ids(sources, DecodeRequest(cfg, schedule=batching, static=StaticStep(readback_every=2))).hypotheses
    decoder.ops = ATEN
    assert [[h.tokens for h in x] for x in got] == [[h.tokens for h in x] for x in want]
    assert any(len(x[0].tokens) == 6 for x in want)  # (a cap is reached: forced EOS runs through the kernel)


@pytest.mark.skipif(triton_ops.INTERPRETED, reason="compiles the kernels: runs in the parent process")
def test_the_kernels_compile_for_an_h100_without_spills(monkeypatch):
    """Every kernel through Triton's whole compiler for sm_90 (an H100/H200), on any machine (the
    wheel bundles ptxas and cuobjdump): a type error in a loop, or registers spilled to local memory,
    fails here rather than on a GPU."""
    import shutil
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # (Triton 3.9 warns while it is unset; fusion is the default)
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    cuobjdump = tools / "cuobjdump"
    if not cuobjdump.exists() and shutil.which("cuobjdump") is None:
        pytest.skip("this Triton has no CUDA backend tools")
    ptr = {"fp32": "*fp32", "bf16": "*bf16"}
    attention = {name: "*fp32" for name in ("q", "keys", "values", "out")} | {
        "ancestry": "*i64", "reads": "*i64", "stride_kt": "i64", "stride_kr": "i64", "stride_at": "i64",
        "scale": "fp32", "H": "constexpr", "D": "constexpr", "BLOCK": "constexpr"}
    chunk = {"logits": "*fp32", "stride": "i64", "v": "i32", "skip": "i32", "chunk_max": "*fp32", "chunk_sum": "*fp32",
             "top_val": "*fp32", "top_col": "*i64", "chunks": "i32", "K": "constexpr", "BLOCK": "constexpr"}
    merge = {"chunk_max": "*fp32", "chunk_sum": "*fp32", "top_val": "*fp32", "top_col": "*i64", "out_val": "*fp32",
             "out_col": "*i64", "chunks": "i32", "fill": "i32", "K": "constexpr", "CHUNKS": "constexpr",
             "CANDIDATES": "constexpr"}
    builds = [(triton_ops._ancestry_attention, attention | {n: ptr[dt] for n in ("q", "keys", "values", "out")},
               {"H": 8, "D": 64, "BLOCK": triton_ops.ATTENTION_BLOCK}) for dt in ptr]
    source = {name: "*fp32" for name in ("q", "keys", "values", "out")} | {
        "sentence": "*i64", "lengths": "*i64", "stride_ks": "i64", "stride_kh": "i64", "scale": "fp32",
        "H": "constexpr", "D": "constexpr", "BLOCK": "constexpr"}
    builds += [(triton_ops._source_attention, source | {n: ptr[dt] for n in ("q", "keys", "values", "out")},
                {"H": 8, "D": 64, "BLOCK": triton_ops.ATTENTION_BLOCK}) for dt in ptr]
    builds += [(triton_ops._chunk_top, chunk | {"logits": ptr[dt]}, {"K": 10, "BLOCK": 2048}) for dt in ptr]
    builds += [(triton_ops._merge_top, merge, {"K": 10, "CHUNKS": 32, "CANDIDATES": 512})]
    for fn, signature, constants in builds:
        kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants),
                                target=GPUTarget("cuda", 90, 32))
        cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"raymt-{os.getpid()}-{fn.fn.__name__}.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([str(cuobjdump if cuobjdump.exists() else "cuobjdump"), "--dump-resource-usage",
                                str(cubin)], capture_output=True, text=True, check=True).stdout
        cubin.unlink()
        line = next(x for x in usage.splitlines() if "REG:" in x)
        assert " STACK:0 " in line and " LOCAL:0 " in line, (fn.fn.__name__, line)  # nothing spilled


@kernels
@pytest.mark.parametrize("static", [False, True])
def test_the_triton_attention_never_reads_an_unwritten_position(demo_model_dir, static, monkeypatch):
    """With the Triton attention the K/V cache is not zeroed (``TritonOps.zeroed_cache``): every
    position a row reads was written first, a static step's idle rows included, and every source
    position a row reads is its own sentence's. Here the never-written K/V, self- and cross-attention,
    are NaN: one read of them would poison that row's softmax and change the output."""
    from raymt.workers.model.cache import KVCache
    from raymt.workers.config import SearchConfig
    from raymt.workers.decoder.engine import StaticStep
    from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
    from raymt.workers.decoder.core_decoder import CoreDecoder

    empty, made = KVCache.empty.__func__, []

    def poisoned(cls, **kwargs):
        cache = empty(cls, **kwargs)
        if not cache.zeroed:
            for x in (cache.self_k, cache.self_v, cache.cross_k, cache.cross_v):
                x.fill_(float("nan"))
        made.append(cache.zeroed)
        return cache

    translator = CoreDecoder.load(str(demo_model_dir), device=DEVICE)
    decoder = translator.checkpoint.model.model.decoder
    sources = translator.encode(["Ein Hund rennt über die Wiese.", "Eine Frau liest.", "Zwei Männer.", "Ein Kind."])
    cfg = SearchConfig(beam_size=3, num_hypotheses=2)
    batching = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=2, capacity=2)
    decoder.ops = ATEN
    want = translator.decode_ids(sources, DecodeRequest(cfg, schedule=batching)).hypotheses
    monkeypatch.setattr(KVCache, "empty", classmethod(poisoned))
    decoder.ops = triton_ops.TritonOps()
    try:
        got = translator.decode_ids(sources, DecodeRequest(
                cfg, schedule=batching, static=StaticStep(readback_every=2) if static else None)).hypotheses
    finally:
        decoder.ops = ATEN
    assert made == [False]  # one cache, not zeroed, NaN where never written
    assert [[h.tokens for h in x] for x in got] == [[h.tokens for h in x] for x in want]


@kernels
def test_the_static_step_with_the_triton_kernels_is_safe_to_replay(demo_model_dir, monkeypatch):
    """``test_graph_replay.py`` with the GPU's backend: after the captured step, every step launches
    the same kernels on the same memory with the same scalars (the kernels as black boxes: what a
    CUDA graph records of them), through refills and readbacks every other step. Under the
    interpreter only: on a GPU the static step is captured and then replayed from the graph, so the
    step this trace watches runs twice (warm-up, capture) and no replay can be compared; there
    ``test_gpu.py``'s ``test_the_static_step_on_cuda_decodes_as_the_dynamic_one`` and the GPU check
    compare the replay with the same step run eagerly instead."""
    if torch.cuda.is_available():
        pytest.skip("on CUDA the static step replays its graph, bypassing the trace; the replay is compared "
                    "with the eager step in tests/workers/test_gpu.py")
    from tests.workers.replay_trace import CAPTURED, replay_mismatches, trace_static_decode
    from raymt.workers.config import SearchConfig
    from raymt.workers.decoder.engine import StaticStep
    from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
    from raymt.workers.kernels.speedups import CpuSpeedups
    from raymt.workers.decoder.core_decoder import CoreDecoder

    class OnDevice(triton_ops.TritonOps):
        def may_any(self, mask: torch.Tensor) -> bool:  # (as on a GPU: the device is never read mid-step)
            return True

    translator = CoreDecoder.load(str(demo_model_dir), device=DEVICE, speedups=CpuSpeedups())
    translator.checkpoint.model.model.decoder.ops = OnDevice()
    sources = translator.encode(["Ein Hund rennt über die Wiese.", "Eine Frau liest.", "Zwei Männer.", "Ein Kind.",
                                 "Zwei Hunde spielen im Schnee."])
    cfg = SearchConfig(beam_size=2, num_hypotheses=1, max_length_a=0.0, max_length_b=8)
    batching = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=2, capacity=2)
    trace = trace_static_decode(monkeypatch, lambda: translator.decode_ids(
        sources, DecodeRequest(cfg, schedule=batching, static=StaticStep(readback_every=2))).hypotheses, triton_ops)
    kernels_run = [op for op, _ in trace.steps[CAPTURED] if not op.startswith("aten.")]
    assert sorted(set(kernels_run)) == ["ancestry_attention", "row_top_log_softmax", "source_attention"]
    assert [n for n in trace.admitted_after if n > CAPTURED + 1]
    assert replay_mismatches(trace) == []
