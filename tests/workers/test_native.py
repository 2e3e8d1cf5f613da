"""The native decode-step operators (workers/kernels/native.py) against the ATen operators they replace."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from raymt.workers.model.cache import KVCache
from raymt.workers.search.selection import row_top_log_probs
from raymt.workers.kernels.speedups import EXACT
from raymt.workers.model.step_ops import ATEN, NativeOps, attend
from raymt.workers.decoder.core_decoder import CoreDecoder

NEG_INF = float("-inf")


@pytest.fixture(scope="module")
def ops(native_kernels):
    return native_kernels


def aten_row_top(logits: torch.Tensor, k: int, skip: int) -> tuple[torch.Tensor, torch.Tensor]:
    lp = torch.log_softmax(logits, dim=-1)
    if skip >= 0:
        lp[:, skip] = NEG_INF
    return torch.topk(lp, k, dim=1)


@pytest.mark.parametrize("n, v, k, skip", [(160, 8001, 10, 8000), (7, 8001, 1, 8000), (5, 333, 6, 17),
                                           (3, 100, 8, -1), (4, 37, 37, 5), (2, 16, 3, 0)])
def test_row_top_log_softmax_is_bit_equal_to_aten(ops, n: int, v: int, k: int, skip: int) -> None:
    gen = torch.Generator().manual_seed(n * v + k)
    logits = torch.randn(n, v, generator=gen) * 4
    logits[0, (skip + 1) % v] = logits[0].max() + 3  # a clear winner next to the banned column
    if skip >= 0:
        logits[-1, skip] = logits[-1].max() + 5  # the banned column is the row maximum: still normalises
    values, ids = ops.row_top_log_softmax(logits, k, skip)
    ref_values, ref_ids = aten_row_top(logits, k, skip)
    assert torch.equal(values, ref_values)  # bit-equal: ATen's own max, exp-sum and log
    finite = torch.isfinite(ref_values)
    assert torch.equal(ids[finite], ref_ids[finite])
    assert not bool((ids[finite] == skip).any())
    if k == v and skip >= 0:  # one slot has no column left: -inf, at the banned column, as ATen gives it
        assert values[:, -1].eq(NEG_INF).all() and ids[:, -1].eq(skip).all()


def test_row_top_log_softmax_on_model_logits_and_ties(ops, demo_model_dir) -> None:
    model = CoreDecoder.load(str(demo_model_dir), speedups=EXACT).checkpoint.model
    hidden = torch.randn(64, model.config.d_model, generator=torch.Generator().manual_seed(1))
    logits = model.project(hidden).contiguous()
    pad = model.config.pad_token_id
    values, ids = ops.row_top_log_softmax(logits, 10, pad)
    ref_values, ref_ids = aten_row_top(logits, 10, pad)
    assert torch.equal(values, ref_values) and torch.equal(ids, ref_ids)
    tied = torch.zeros(2, 50)
    tied[:, 7] = tied[:, 30] = 1.0
    _, ids = ops.row_top_log_softmax(tied, 3, -1)
    assert ids[:, :2].tolist() == [[7, 30], [7, 30]] and ids[:, 2].tolist() == [0, 0]  # ties: lower column first


def test_row_top_log_probs_native_equals_aten_with_shortlist_and_forced_eos(ops) -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(12, 40, generator=gen)
    token_ids = torch.randperm(200, generator=gen)[:40]
    token_ids[11] = 199  # <pad> among the candidates
    force = torch.zeros(12, dtype=torch.bool)
    force[[2, 5]] = True
    for ids in (None, token_ids):
        pad = 39 if ids is None else 199
        a = row_top_log_probs(logits, 6, pad, force, 0, ids)
        b = row_top_log_probs(logits, 6, pad, force, 0, ids, NativeOps(ops))
        assert torch.equal(a.log_probs, b.log_probs) and torch.equal(a.tokens, b.tokens)
    no_pad = row_top_log_probs(logits, 6, 555, None, 0, token_ids, NativeOps(ops))  # <pad> not a candidate: nothing skipped
    assert torch.equal(no_pad.tokens, row_top_log_probs(logits, 6, 555, None, 0, token_ids).tokens)


def test_row_top_log_softmax_rejects_bad_input(ops) -> None:
    with pytest.raises(RuntimeError, match="contiguous float32"):
        ops.row_top_log_softmax(torch.zeros(4, 10).t(), 2, 0)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        ops.row_top_log_softmax(torch.zeros(4, 10, dtype=torch.float64), 2, 0)
    with pytest.raises(RuntimeError, match="k must be"):
        ops.row_top_log_softmax(torch.zeros(4, 10), 11, 0)


@pytest.mark.parametrize("t", [1, 7, 40])
def test_self_attention_equals_batched_matmuls(ops, t: int) -> None:
    gen = torch.Generator().manual_seed(t)
    cap, layers, n, h, d = 48, 3, 11, 4, 16
    self_k, self_v = torch.randn(cap, layers, n, h, d, generator=gen), torch.randn(cap, layers, n, h, d, generator=gen)
    qkv = torch.randn(n, 3 * h * d, generator=gen)
    q = qkv[:, : h * d]  # a strided view, as the fused QKV projection gives it
    positions = torch.randint(0, t, (n,), generator=gen)
    positions[0] = t - 1
    mask = (torch.arange(t)[None, :] <= positions[:, None])[:, None, None, :]  # (N, 1, 1, t)
    for layer in range(layers):
        keys, values = self_k[:t, layer].permute(1, 2, 0, 3), self_v[:t, layer].permute(1, 2, 0, 3)
        ref = attend(q.reshape(n, h, 1, d), keys, values, None).view(n, -1)
        torch.testing.assert_close(ops.self_attention(q, self_k, self_v, None, None, layer, t, d ** -0.5), ref,
                                   atol=2e-6, rtol=1e-5)
        ref = attend(q.reshape(n, h, 1, d), keys, values, mask).view(n, -1)  # each row over its own prefix
        torch.testing.assert_close(ops.self_attention(q, self_k, self_v, None, positions, layer, t, d ** -0.5), ref,
                                   atol=2e-6, rtol=1e-5)
    # through an ancestry table: row n's position p lives in cache row ancestry[p, n] of 2n rows
    wide_k, wide_v = torch.randn(cap, layers, 2 * n, h, d, generator=gen), torch.randn(cap, layers, 2 * n, h, d, generator=gen)
    ancestry = torch.randint(0, 2 * n, (cap, n), generator=gen)
    gather = lambda c: c.gather(2, ancestry[:, None, :, None, None].expand(cap, layers, n, h, d))  # noqa: E731
    for layer in range(layers):
        for pos in (None, positions):
            torch.testing.assert_close(ops.self_attention(q, wide_k, wide_v, ancestry, pos, layer, t, d ** -0.5),
                                       ops.self_attention(q, gather(wide_k), gather(wide_v), None, pos, layer, t, d ** -0.5),
                                       atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="out of range"):
        ops.self_attention(q, self_k, self_v, None, None, layers, t, 1.0)
    with pytest.raises(RuntimeError, match="ancestry row out of range"):
        ops.self_attention(q, self_k, self_v, ancestry, None, 0, t, 1.0)
    with pytest.raises(RuntimeError, match="position is out of range"):
        ops.self_attention(q, self_k, self_v, None, positions + t, 0, t, 1.0)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        ops.self_attention(q, self_k.transpose(0, 1), self_v, None, None, 0, t, 1.0)


def _planned_step(cache: KVCache, rows: list[int], positions: list[int]):
    """The engine's StepAt for cache rows ``rows`` (ascending) at ``positions``."""
    k = cache.beam_size
    slots = sorted({r // k for r in rows})
    grid = [slots.index(r // k) * k + r % k for r in rows]
    rows_t = torch.tensor(rows)
    return cache.step_at(torch.zeros(len(rows), dtype=torch.long), rows_t, torch.tensor(positions), torch.tensor(grid),
                         torch.tensor(slots), t=max(positions) + 1, s=cache.cross_k.shape[3],
                         shared=len(set(positions)) == 1, first=-1)


def test_cross_attention_equals_the_sentence_grid(ops) -> None:
    """The native kernel (each row over its sentence's source length) equals the ATen grid (additive mask)."""
    gen = torch.Generator().manual_seed(5)
    layers, b, h, s, d, w = 2, 6, 4, 9, 8, 3
    lengths = torch.tensor([9, 1, 4, 9, 6, 2])
    src_mask = torch.arange(s)[None, :] < lengths[:, None]
    cache = KVCache.empty(layers=layers, heads=h, head_dim=d, slots=b, beam_size=w, source_capacity=s,
                          dtype=torch.float32, device=torch.device("cpu"), zeroed=True)
    cache.admit(torch.arange(b), zip(torch.randn(layers, b, h, s, d, generator=gen),
                                     torch.randn(layers, b, h, s, d, generator=gen)), src_mask)
    rows = [0, 1, 2, 3, 6, 7, 9, 12, 13, 14, 16]  # sentence 2 not planned; empty grid entries: finished or pruned beams
    at = _planned_step(cache, rows, [0] * len(rows))
    q = torch.randn(len(rows), h * d, generator=gen)
    for layer in range(layers):
        torch.testing.assert_close(NativeOps(ops).cross_attention(q, cache, layer, at),
                                   ATEN.cross_attention(q, cache, layer, at), atol=2e-6, rtol=1e-5)
    with pytest.raises(RuntimeError, match="sentence index out of range"):
        ops.cross_attention(q, cache.cross_k, cache.cross_v, 0, None, torch.full((len(rows),), b),
                            cache.source_lengths, 1.0)


@pytest.mark.parametrize("d", [8, 32, 64, 128])
def test_cross_attention_rows_of_one_sentence_share_a_pass(ops, d) -> None:
    """Runs of rows of one sentence (a beam; runs longer than the kernel's group of 16; a sentence
    split in two runs) over its first lengths[j] source positions, with lengths or an additive bias."""
    gen = torch.Generator().manual_seed(d)
    layers, b, h, s = 2, 4, 3, 11
    lengths = torch.tensor([11, 1, 5, 8])
    sentence = torch.tensor([0] * 20 + [2, 2, 1, 3, 3, 3, 2])  # 20 > 16 rows in a run; sentence 2 twice
    k, v = torch.randn(layers, b, h, s, d, generator=gen), torch.randn(layers, b, h, s, d, generator=gen)
    q = torch.randn(len(sentence), h * d, generator=gen)
    bias = torch.where(torch.arange(s)[None, :] < lengths[:, None], 0.0, float("-inf"))  # (B, S)
    bias = bias[:, None, None, :].expand(b, h, 1, s).contiguous()
    for layer in range(layers):
        keys, values = k[layer][sentence], v[layer][sentence]  # (N, H, S, D)
        scores = q.view(-1, h, 1, d) @ keys.transpose(-1, -2) * d ** -0.5 + bias[sentence]  # (N, H, 1, S)
        want = (torch.softmax(scores, -1) @ values).reshape(len(sentence), h * d)
        got = ops.cross_attention(q, k, v, layer, None, sentence, lengths, d ** -0.5)
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
        assert torch.equal(ops.cross_attention(q, k, v, layer, bias, sentence, None, d ** -0.5), got)


def test_decoding_falls_back_to_aten_where_the_operators_cannot_be_built(tmp_path, demo_model_dir) -> None:
    probe = ("import logging, sys; logging.basicConfig(level=logging.WARNING)\n"
             "from raymt.workers.kernels.native import load\n"
             "from raymt.workers.decoder.core_decoder import CoreDecoder\n"
             "t = CoreDecoder.load(sys.argv[1])\n"
             "from raymt.workers.model.step_ops import ATEN\n"
             "assert load() is None and t.checkpoint.model.ops is ATEN\n"
             "print(t.translate(['Ein Hund läuft.'])[0].text)\n")
    env = {**os.environ, "CXX": "/bin/false", "TORCH_EXTENSIONS_DIR": str(tmp_path), "RAYMT_NATIVE_PREBUILT": "0"}
    out = subprocess.run([sys.executable, "-c", probe, str(demo_model_dir)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()  # it still translates
    assert out.stderr.count("native decode operators unavailable") == 1  # one warning, both targets named
    assert "portable:" in out.stderr


@pytest.mark.slow
def test_portable_build_is_cached_apart_and_equals_aten(tmp_path) -> None:
    """The fallback build (no -march, ATen's scalar vector types; aarch64's build) gives ATen's
    log-softmax + top-k bit for bit where ATen runs its scalar kernels too, to float rounding where
    ATen dispatches to AVX2/AVX-512 (another summation order), and lives beside the machine's build."""
    probe = ("import sys, torch\n"
             "from raymt.workers.kernels.native import build_targets, load\n"
             "assert build_targets() == ['portable'] and load() is not None\n"
             "x = torch.randn(9, 801, generator=torch.Generator().manual_seed(0)) * 4\n"
             "v, i = torch.ops.raymt.row_top_log_softmax(x, 5, 800)\n"
             "lp = torch.log_softmax(x, -1); lp[:, 800] = float('-inf'); rv, ri = lp.topk(5)\n"
             "exact = torch.equal(v, rv) and torch.equal(i, ri)\n"
             "close = torch.allclose(v, rv, rtol=0, atol=1e-5) and torch.equal(i, ri)\n"
             "sys.exit(0 if exact or (close and sys.argv[1] == 'close') else 4)\n")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "RAYMT_NATIVE_MARCH": "portable",
           "RAYMT_NATIVE_PREBUILT": "0"}
    for aten, want in (("default", "exact"), (None, "close")):
        run_env = {**env, "ATEN_CPU_CAPABILITY": aten} if aten else env
        out = subprocess.run([sys.executable, "-c", probe, want], env=run_env, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, (aten, out.stderr)
    assert [p.name.split("-")[0] for p in tmp_path.glob("raymt/*.so")] == ["raymt_ops_portable"]


@torch.no_grad()
def test_native_and_aten_backends_step_alike(ops, demo_model_dir) -> None:
    """The demo model with every CPU rewrite (native kernels, fused QKV, oneDNN; the cache left
    unzeroed) and with the ATen step backend give the same logits through beam permutations and
    duplicates, an empty (pruned) beam, a sentence left out of a step, rows at different positions
    and growth past the initial capacity."""
    from dataclasses import replace

    aten = CoreDecoder.load(str(demo_model_dir), speedups=replace(EXACT, native=False))
    fast = CoreDecoder.load(str(demo_model_dir), speedups=EXACT)
    assert fast.checkpoint.model.ops is not ATEN and aten.checkpoint.model.ops is ATEN
    sources = aten.encode(["Ein Mann fährt Fahrrad.", "Zwei Kinder spielen im Garten am Haus.", "Hallo!"])
    k, pad = 3, aten.checkpoint.model.config.pad_token_id
    width = max(len(x) for x in sources)
    src = torch.tensor([x + [pad] * (width - len(x)) for x in sources])
    caches = []
    for t in (aten, fast):
        model = t.checkpoint.model
        caches.append(model.new_cache(3, k, width, target_capacity=2))
        caches[-1].admit(torch.arange(3), model.cross_kv(model.encode(src, src != pad)), src != pad)
    assert caches[0].zeroed and not caches[1].zeroed
    gen = torch.Generator().manual_seed(3)
    # (rows run, their positions, then row -> source row reorder)
    plans = [(list(range(9)), [0] * 9, {0: 2, 1: 2, 2: 0, 3: 4, 4: 3, 5: 3, 6: 8, 7: 6, 8: 7}),
             (list(range(9)), [1] * 9, {0: 1, 1: 0, 2: 0, 3: 3, 4: 5, 6: 8, 7: 6, 8: 6}),
             ([0, 1, 2, 3, 4, 6, 7, 8], [2] * 8, {0: 0, 1: 1, 2: 2, 6: 6, 7: 7}),
             ([0, 1, 2, 6, 7], [3, 3, 3, 3, 3], {0: 2, 1: 1, 2: 0, 6: 7, 7: 6}),
             ([0, 1, 2, 6, 7], [4, 4, 4, 4, 4], {})]
    for rows, positions, moves in plans:
        tokens = torch.randint(1, pad, (len(rows),), generator=gen)
        logits = []
        for t, cache in zip((aten, fast), caches):
            at = cache.step_at(tokens, torch.tensor(rows), torch.tensor(positions),
                               torch.tensor([r for r in rows]), torch.tensor([0, 1, 2]), t=max(positions) + 1,
                               s=width, shared=True, first=0)
            model = t.checkpoint.model
            logits.append(model.decode_step(tokens, at, cache, model.output_head()))
            if moves:
                dst = sorted(moves)
                cache.reorder(torch.tensor([moves[r] for r in dst]), torch.tensor(dst), max(positions) + 1)
        torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=0)
    assert caches[1].max_length >= 5 and caches[1].self_k.shape[2] == 3 * k  # grown; K/V rows never moved


def test_self_attention_step_writes_the_rows_then_attends(ops) -> None:
    gen = torch.Generator().manual_seed(9)
    cap, layers, r, n, h, d, t = 8, 2, 10, 6, 4, 8, 5
    self_k, self_v = torch.randn(cap, layers, r, h, d, generator=gen), torch.randn(cap, layers, r, h, d, generator=gen)
    rows = torch.tensor([9, 0, 4, 2, 7, 5])
    positions = torch.tensor([4, 4, 2, 0, 3, 4])
    ancestry = torch.randint(0, r, (cap, n), generator=gen)
    ancestry[positions, torch.arange(n)] = rows  # this step's position: the row's own cache row
    qkv = torch.randn(n, 3 * h * d + 5, generator=gen)[:, : 3 * h * d]  # strided rows
    k_ref, v_ref = self_k.clone(), self_v.clone()
    k_ref[positions, 1, rows] = qkv[:, h * d: 2 * h * d].reshape(n, h, d)
    v_ref[positions, 1, rows] = qkv[:, 2 * h * d:].reshape(n, h, d)
    out = ops.self_attention_step(qkv, self_k, self_v, ancestry, rows, positions, 1, t, d ** -0.5)
    assert torch.equal(self_k, k_ref) and torch.equal(self_v, v_ref)  # only (position, layer 1, row) written
    assert torch.equal(out, ops.self_attention(qkv[:, : h * d], k_ref, v_ref, ancestry, positions, 1, t, d ** -0.5))
    with pytest.raises(RuntimeError, match="qkv must be"):
        ops.self_attention_step(qkv[:, : 2 * h * d], self_k, self_v, ancestry, rows, positions, 1, t, 1.0)
    with pytest.raises(RuntimeError, match="row or position out of range"):
        ops.self_attention_step(qkv, self_k, self_v, ancestry, rows + r, positions, 1, t, 1.0)


def test_a_build_killed_midway_never_blocks_a_later_load(tmp_path) -> None:
    """No lock is shared between processes: a builder SIGKILLed mid-compile (a decoder actor killed while
    loading) leaves only its private directory, and the next process builds (or loads) without waiting."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "RAYMT_NATIVE_PREBUILT": "0"}  # (first-use builds)
    probe = "import sys; from raymt.workers.kernels.native import load; sys.exit(0 if load() is not None else 3)"
    builder = subprocess.Popen([sys.executable, "-c", probe], env=env, cwd=os.getcwd(), start_new_session=True)
    deadline = time.time() + 120
    while not list(tmp_path.glob("raymt/*-build-*/build.ninja")) and time.time() < deadline:
        if builder.poll() is not None:
            pytest.skip("the operators could not be built here")
        time.sleep(0.05)
    time.sleep(0.5)  # inside the compile
    os.killpg(builder.pid, signal.SIGKILL)  # the builder with its ninja and compiler, as a killed actor's group
    builder.wait()
    assert not list(tmp_path.glob("raymt/*.so")), "killed before its library was in place"
    (tmp_path / "raymt_decode_ops_avx512").mkdir()
    (tmp_path / "raymt_decode_ops_avx512" / "lock").touch()  # the old shared layout's stale lock: ignored
    assert subprocess.run([sys.executable, "-c", probe], env=env, timeout=300).returncode == 0
    assert len(list(tmp_path.glob("raymt/*.so"))) == 1
    assert subprocess.run([sys.executable, "-c", probe], env=env, timeout=60).returncode == 0  # loads, no build
    assert len(list(tmp_path.glob("raymt/*-build-*"))) == 1  # only the killed one's (removed after an hour)
