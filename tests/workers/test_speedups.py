"""CPU speed-ups: fused QKV and oneDNN packing keep the translations (float32, another summation
order); int8 stays close (its BLEU change is benchmarked in benchmarks.bench)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from dataclasses import replace

import pytest
import sacrebleu
import torch

from raymt.workers.config import SearchConfig
from raymt.workers.kernels.isa import IsaUnsupported, detect as detect_isa
from raymt.workers.search.selection import row_top_log_probs
from raymt.workers.search.shortlist import LexicalTable, Shortlist
from raymt.workers.model.packed_linear import PackedLinear, small_work
from raymt.workers.kernels.speedups import EXACT, CpuSpeedups, Int8Linear, amx_int8, onednn_available
from raymt.workers.decoder.core_decoder import CoreDecoder
from tests.workers.reference_decoding import translate_ids
from tests.pipeline.ray_helpers import clean_corpus

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear kernels")
needs_bf16 = pytest.mark.skipif(not detect_isa().bf16, reason=f"no bf16 GEMMs on this CPU: {detect_isa().describe()}")


def texts_of(translator: CoreDecoder, texts: list[str], cfg: SearchConfig, shortlist=None) -> list[str]:
    return [t.text for t in translator.translate(texts, cfg, shortlist)]


@needs_onednn
def test_packed_linear_equals_linear() -> None:
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(16, 40)
    x = torch.randn(3, 5, 16, generator=gen)
    torch.testing.assert_close(PackedLinear.of(linear)(x), linear(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(PackedLinear(linear.weight, None)(x[0]), x[0] @ linear.weight.T, atol=1e-5, rtol=1e-5)


@needs_onednn
@pytest.mark.parametrize("post_op, act", [("none", lambda y: y), ("swish", torch.nn.functional.silu),
                                          ("relu", torch.nn.functional.relu)])
def test_packed_linear_runs_small_products_unpacked_and_large_ones_on_onednn(post_op, act) -> None:
    """Under ``small_work()`` multiply-adds (this CPU's) the plain ``F.linear`` (its post-op applied
    after), from there oneDNN's packed kernel with the post-op fused: the same function either way."""
    gen = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(256, 1024)
    layer = PackedLinear.of(linear, post_op)
    assert layer.small_rows == -(-small_work() // (256 * 1024))  # 31 rows on Intel, 1 elsewhere
    if layer.small_rows == 1:  # (this CPU's rule leaves no small product at this shape: test the kernels' seam at 31)
        layer.small_rows = 31
    small, large = torch.randn(layer.small_rows - 1, 256, generator=gen), torch.randn(layer.small_rows, 256, generator=gen)
    assert torch.equal(layer(small), act(torch.nn.functional.linear(small, linear.weight, linear.bias)))
    packed = torch.ops.mkldnn._linear_pointwise(large, layer.packed, layer.bias, post_op, [], "")
    assert torch.equal(layer(large), packed)
    for x in (small, large):
        torch.testing.assert_close(layer(x), act(linear(x)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows, k, n", [(1, 256, 768), (6, 256, 256), (7, 1024, 256), (20, 512, 2048), (64, 48, 80),
                                        (70, 256, 1024), (13, 64, 8001), (5, 32, 3), (9, 40, 100)])
@pytest.mark.parametrize("act", ["none", "swish", "relu"])
def test_small_linear_is_the_product(native_kernels, rows: int, k: int, n: int, act: str) -> None:
    """csrc/small_linear.cpp against float64 ``act(x W^T + b)``: every row-tile height (1-6 and a
    remainder), every panel width (1-4 register blocks), outputs that end inside a vector register
    (the packed weight zero-padded), with and without a bias."""
    gen = torch.Generator().manual_seed(rows)
    w, b, x = (torch.randn(*shape, generator=gen) for shape in ((n, k), (n,), (rows, k)))
    width = native_kernels.vector_width()
    blocks = -(-n // width)
    padded = torch.nn.functional.pad(w, (0, 0, 0, blocks * width - n))
    packed = padded.view(blocks, width, k).transpose(1, 2).contiguous()
    fn = {"none": lambda y: y, "swish": torch.nn.functional.silu, "relu": torch.relu}[act]
    for bias in (b, None):
        want = fn(x.double() @ w.double().T + (0 if bias is None else bias.double()))
        got = native_kernels.small_linear(x, packed, bias, {"none": 0, "swish": 1, "relu": 2}[act], n)
        assert got.shape == (rows, n)
        torch.testing.assert_close(got.double(), want, atol=1e-5 * math.sqrt(k), rtol=1e-5)
    with pytest.raises(RuntimeError, match="packed must be"):
        native_kernels.small_linear(x, packed.transpose(1, 2), b, 0, n)
    with pytest.raises(RuntimeError, match="act must be"):
        native_kernels.small_linear(x, packed, b, 3, n)
    with pytest.raises(RuntimeError, match="do not fill the last"):
        native_kernels.small_linear(x, packed, None, 0, blocks * width + 1)


@needs_onednn
def test_packed_linear_takes_the_small_kernel_for_few_rows(native_kernels) -> None:
    """Up to ``SMALL_KERNEL_ROWS`` rows run ``small_linear`` (the swish applied in it), more run oneDNN."""
    gen = torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    layer = PackedLinear.of(torch.nn.Linear(256, 1024), "swish")
    layer.use_small_kernel(native_kernels)
    rows = PackedLinear.SMALL_KERNEL_ROWS
    few, many = torch.randn(rows, 256, generator=gen), torch.randn(rows + 1, 256, generator=gen)
    assert torch.equal(layer(few), native_kernels.small_linear(few, layer.small_packed, layer.bias, 1, 1024))
    assert torch.equal(layer(many), torch.ops.mkldnn._linear_pointwise(many, layer.packed, layer.bias, "swish", [], ""))
    for x in (few, many):
        want = torch.nn.functional.silu(x @ layer.weight.T + layer.bias)
        torch.testing.assert_close(layer(x), want, atol=1e-5, rtol=1e-5)
    odd = PackedLinear(torch.randn(8001, 256, generator=gen), None)  # outputs that end inside a vector register
    odd.use_small_kernel(native_kernels)
    x = torch.randn(rows, 256, generator=gen)
    assert odd(x).shape == (rows, 8001)
    torch.testing.assert_close(odd(x), x @ odd.weight.T, atol=1e-4, rtol=1e-5)


@needs_onednn
def test_exact_speedups_keep_outputs_and_int8_stays_close(demo_model_dir) -> None:
    texts, cfg = clean_corpus(24), SearchConfig(beam_size=3)
    plain = CoreDecoder.load(str(demo_model_dir), speedups=CpuSpeedups())
    exact = texts_of(plain, texts, cfg)
    fast = CoreDecoder.load(str(demo_model_dir))  # the default: EXACT
    model = fast.checkpoint.model
    assert EXACT.fused_qkv and EXACT.onednn and not EXACT.int8
    assert model.model.decoder.layers[0].self_attn.qkv_proj is not None
    assert isinstance(model.model.decoder.layers[0].fc1, PackedLinear) and model.vocab_head is not None
    assert model.model.decoder.layers[0].fc1.post_op == "swish"  # the FFN activation folded into its GEMM
    if model.model.decoder.ops.beam_kernel is not None:  # (native kernels built) few-row products on small_linear
        assert model.model.decoder.layers[0].fc1.small_kernel is not None
    assert texts_of(fast, texts, cfg) == exact
    # shortlist heads are packed per candidate set and give the plain model's shortlist output
    table = LexicalTable({s: [(t, 1.0) for t in range(s % 50, 8000, 37)] for x in fast.encode(texts) for s in x},
                         frequent=list(range(300)))
    shortlist = Shortlist(table, top_m=40, top_n=300, special_ids=fast.special_target_ids())
    assert texts_of(fast, texts, cfg, shortlist) == texts_of(plain, texts, cfg, shortlist)
    # the teacher-forced path (distillation scores) runs through the packed layers too
    src = fast.encode(texts[:4])
    torch.testing.assert_close(torch.tensor([sum(x) for x in fast.score_ids(src, [[5, 6, 0]] * 4)]),
                               torch.tensor([sum(x) for x in plain.score_ids(src, [[5, 6, 0]] * 4)]), atol=1e-4, rtol=0)
    int8 = CoreDecoder.load(str(demo_model_dir), speedups=CpuSpeedups(fused_qkv=True, onednn=True, int8=True))
    assert isinstance(int8.checkpoint.model.model.decoder.layers[0].fc1, Int8Linear)  # quantised, lean call
    assert sacrebleu.corpus_bleu(texts_of(int8, texts, cfg), [exact]).score > 60  # quantisation noise only


WARM_HEAP_PROBE = """
import ctypes, resource, sys, torch
from raymt.workers.kernels.speedups import warm_heap
def faults():  # a churn of 8-24 MB tensors of changing sizes, up to ~100 MB live
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(12):
        xs = [torch.empty((2 + (i * j) % 5) << 20).fill_(1.0) for j in range(1, 6)]
        del xs
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
if sys.argv[1] == "warm":
    assert warm_heap() and warm_heap()  # idempotent
else:  # glibc's documented starting thresholds (128 KiB), pinned: its dynamic threshold would
    mallopt = ctypes.CDLL(None).mallopt  # otherwise depend on what the imports freed before
    assert mallopt(-3, 128 << 10) and mallopt(-1, 128 << 10)
faults()  # the first round may fault in any case
print(min(faults() for _ in range(3)))  # a stray fault elsewhere in the process does not count
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_warm_heap_stops_page_faults_on_repeated_large_tensors() -> None:
    """A fresh process each (mallopt is a process setting): at glibc's default thresholds large
    blocks are mapped fresh and fault their pages in again and again; after ``warm_heap`` later
    rounds reuse them."""
    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", WARM_HEAP_PROBE, mode], capture_output=True, text=True,
                             check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        return int(out.stdout.split()[-1])
    default, warm = faults("default"), faults("warm")
    assert warm < 500 and default > 10_000, (default, warm)


def test_int8_linear_is_the_quantised_module_call() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(
            torch.nn.Sequential(torch.nn.Linear(16, 40)), {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
            dtype=torch.qint8)[0]
    x = torch.randn(7, 16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(Int8Linear.of(quantized)(x), quantized(x))
    # a shortlist head quantised from its float weight equals quantize_dynamic's module on that weight
    linear = torch.nn.Linear(16, 40, bias=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized_from = torch.ao.quantization.quantize_dynamic(
            torch.nn.Sequential(linear), {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
            dtype=torch.qint8)[0]
    torch.testing.assert_close(Int8Linear.from_weight(linear.weight, None)(x), quantized_from(x), atol=1e-6, rtol=0)
    torch.testing.assert_close(Int8Linear.from_weight(linear.weight, None)(x), linear(x), atol=0.05, rtol=0.05)


def test_int8_linear_takes_the_amx_kernels_only_for_large_products() -> None:
    """Small products (a decoder step's few rows) run FBGEMM's kernels, large ones oneDNN's AMX
    kernels where the CPU has them; both quantise the same int8 weight and stay close to float."""
    gen = torch.Generator().manual_seed(3)
    torch.manual_seed(3)  # (the layer's initial weights)
    linear = torch.nn.Linear(512, 2048)
    layer = Int8Linear.from_weight(linear.weight, linear.bias)
    assert (layer.amx is not None) == amx_int8()
    small, large = torch.randn(2, 512, generator=gen), torch.randn(160, 512, generator=gen)
    for x in (small, large):  # (FBGEMM's 7-bit activations: up to ~0.055 off on single outputs of mean size ~0.46)
        error = (layer(x) - linear(x)).abs()
        assert error.max() < 0.1 and error.mean() < 0.03 * linear(x).abs().mean()
    assert torch.equal(layer(small), torch.ops.quantized.linear_dynamic(small, layer.packed, True))
    if layer.amx is not None:
        assert 2 < layer.amx_rows <= 160  # 24M multiply-adds: 23 rows of 512 x 2048
        assert torch.equal(layer(large), torch.ops.quantized.linear_dynamic(large, layer.amx, False))
        assert not torch.equal(layer(large), torch.ops.quantized.linear_dynamic(large, layer.packed, True))


@needs_onednn
@needs_bf16
def test_bf16_translates_close_to_float32_with_and_without_a_shortlist(demo_model_dir) -> None:
    texts, cfg = clean_corpus(24), SearchConfig(beam_size=3)
    exact = CoreDecoder.load(str(demo_model_dir))
    bf16 = CoreDecoder.load(str(demo_model_dir), speedups=replace(EXACT, bf16=True))
    model = bf16.checkpoint.model
    assert model.lm_head.weight.dtype == torch.bfloat16 and isinstance(model.model.decoder.layers[0].fc1, PackedLinear)
    assert sacrebleu.corpus_bleu(texts_of(bf16, texts, cfg), [texts_of(exact, texts, cfg)]).score > 60
    table = LexicalTable({s: [(t, 1.0) for t in range(s % 50, 8000, 37)] for x in bf16.encode(texts) for s in x},
                         frequent=list(range(300)))
    shortlist = Shortlist(table, top_m=40, top_n=300, special_ids=bf16.special_target_ids())
    assert sacrebleu.corpus_bleu(texts_of(bf16, texts, cfg, shortlist), [texts_of(exact, texts, cfg, shortlist)]).score > 60
    scores = bf16.score_ids(bf16.encode(texts[:2]), [[5, 6, 0]] * 2)
    assert all(len(s) == 3 and all(math.isfinite(x) for x in s) for s in scores)


def test_precisions_are_alternatives() -> None:
    with pytest.raises(ValueError, match="alternatives"):
        CpuSpeedups(int8=True, bf16=True)
    with pytest.raises(ValueError, match="alternatives"):
        CpuSpeedups(bf16=True, fp16=True)


@pytest.mark.skipif(detect_isa().bf16, reason="this CPU has bf16 GEMMs (the refusal is tested under AVX2 emulation)")
def test_bf16_is_refused_before_loading_where_the_cpu_has_no_bf16_gemms(demo_model_dir) -> None:
    with pytest.raises(IsaUnsupported, match="--bf16 needs a CPU with bfloat16 GEMMs"):
        CoreDecoder.load(str(demo_model_dir), speedups=replace(EXACT, bf16=True))


def test_fp16_translates_close_to_float32_with_float32_scores(demo_model_dir) -> None:
    """float16 (the GPU dtype where bf16 is missing) on the CPU: ATen's kernels, no oneDNN packing;
    log-probs and scores stay float32, so hypotheses score as float32 sums."""
    texts, cfg = clean_corpus(24), SearchConfig(beam_size=3)
    exact = CoreDecoder.load(str(demo_model_dir))
    fp16 = CoreDecoder.load(str(demo_model_dir), speedups=replace(EXACT, fp16=True))
    model = fp16.checkpoint.model
    assert model.lm_head.weight.dtype == torch.float16 and type(model.model.decoder.layers[0].fc1) is torch.nn.Linear
    assert sacrebleu.corpus_bleu(texts_of(fp16, texts, cfg), [texts_of(exact, texts, cfg)]).score > 60
    hidden = torch.randn(3, model.config.d_model, generator=torch.Generator().manual_seed(0)).half()
    logits, pad = model.project(hidden), model.config.pad_token_id
    top = row_top_log_probs(logits, 4, pad, ops=model.ops)
    assert logits.dtype == torch.float16 and top.log_probs.dtype == torch.float32  # the search reads float32
    want = torch.log_softmax(logits.float(), -1).index_fill(1, torch.tensor([pad]), float("-inf")).topk(4).values
    torch.testing.assert_close(top.log_probs, want)
    hyps = translate_ids(fp16, fp16.encode(texts[:4]), cfg)
    assert all(math.isfinite(h[0].log_prob) and h[0].score == h[0].score for h in hyps)
    assert CpuSpeedups(fp16=True).dtype == torch.float16 and EXACT.dtype == torch.float32
