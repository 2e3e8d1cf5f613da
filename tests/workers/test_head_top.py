"""The fused output layer (``head_top_log_softmax``: product, log-softmax and top-k in one pass)
against the product and the row top it replaces, and a decode through it against one without; an
int8 output layer's row top through it."""
from __future__ import annotations

import pytest
import torch

from raymt.workers.config import SearchConfig
from raymt.workers.kernels.isa import detect
from raymt.workers.model.packed_linear import PackedLinear
from raymt.workers.kernels.speedups import EXACT, Int8Linear
from raymt.workers.decoder.core_decoder import CoreDecoder

NEG_INF = float("-inf")


@pytest.fixture(autouse=True)
def fused_at_any_width(monkeypatch):
    """The fused pass at every output width (by default only from ``FUSED_MIN_OUTPUTS`` on, where it pays)."""
    monkeypatch.setattr(PackedLinear, "FUSED_MIN_OUTPUTS", 0)


def packed_head(weight: torch.Tensor, kernels) -> PackedLinear:
    head = PackedLinear(weight, None)
    head.use_small_kernel(kernels)
    return head


def unfused(head: PackedLinear, x: torch.Tensor, k: int, skip: int, bias: torch.Tensor | None, kernels):
    logits = head(x) if bias is None else head(x) + bias
    return kernels.row_top_log_softmax(logits.contiguous(), k, skip)


# rows that fill whole row groups and not; outputs that fill whole panels, a partial last block, a
# single block; the banned column inside the first panel, the last one, none
@pytest.mark.parametrize("m, n, e, k, skip", [(160, 8001, 64, 10, 8000), (7, 1000, 48, 6, 3), (13, 64, 32, 5, -1),
                                              (1, 17, 16, 4, 16), (6, 333, 40, 1, 0), (25, 130, 24, 130, 7)])
def test_fused_head_equals_the_product_then_the_row_top(native_kernels, m, n, e, k, skip) -> None:
    gen = torch.Generator().manual_seed(m * n + e)
    weight, x, bias = torch.randn(n, e, generator=gen), torch.randn(m, e, generator=gen), torch.randn(n, generator=gen)
    head = packed_head(weight, native_kernels)
    for b in (None, bias):
        values, columns = head.row_top(x, k, skip, b)
        ref_values, ref_columns = unfused(head, x, k, skip, b, native_kernels)
        finite = torch.isfinite(ref_values)
        assert torch.equal(columns[finite], ref_columns[finite])  # the same columns, in the same order
        assert torch.equal(finite, torch.isfinite(values))
        torch.testing.assert_close(values[finite], ref_values[finite], rtol=0, atol=2e-5)  # the normaliser's order
        assert not bool((columns[finite] == skip).any())
        if k == n and skip >= 0:  # one slot has no column left: -inf at the banned column, as the row top gives it
            assert values[:, -1].eq(NEG_INF).all() and columns[:, -1].eq(skip).all()


def test_fused_head_breaks_ties_by_column_and_does_not_depend_on_threads(native_kernels) -> None:
    weight = torch.randn(4000, 32, generator=torch.Generator().manual_seed(3))
    weight[3000] = weight[10]  # two columns with equal logits, in different panels (and threads' ranges)
    weight[3999] = weight[10]
    head = packed_head(weight, native_kernels)
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(4))
    x[0] = weight[10] * 4  # row 0: the tied columns are its best three
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(head.row_top(x, 8, -1, None))
    finally:
        torch.set_num_threads(before)
    assert results[0][1][0, :3].tolist() == [10, 3000, 3999]  # ties: the lower column first, as one scan keeps them
    for values, columns in results[1:]:
        assert torch.equal(values, results[0][0]) and torch.equal(columns, results[0][1])  # bit-equal at any split


def test_fused_head_declines_what_it_does_not_take(native_kernels, monkeypatch) -> None:
    head = packed_head(torch.randn(100, 16), native_kernels)
    monkeypatch.setattr(PackedLinear, "FUSED_MIN_OUTPUTS", 101)
    assert head.row_top(torch.randn(3, 16), 4, -1, None) is None  # too narrow to pay
    monkeypatch.setattr(PackedLinear, "FUSED_MIN_OUTPUTS", 0)
    assert head.row_top(torch.randn(PackedLinear.SMALL_KERNEL_ROWS + 1, 16), 4, -1, None) is None  # oneDNN's rows
    assert head.row_top(torch.randn(3, 16, dtype=torch.float64), 4, -1, None) is None
    assert PackedLinear(torch.randn(100, 16), None).row_top(torch.randn(3, 16), 4, -1, None) is None  # no kernels


def test_a_decode_through_the_fused_head_equals_one_without(demo_model_dir) -> None:
    lines = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch im Park.",
             "Kinder laufen am Strand entlang, während die Sonne untergeht."]
    fused = CoreDecoder.load(str(demo_model_dir), speedups=EXACT)
    plain = CoreDecoder.load(str(demo_model_dir), speedups=EXACT)
    head = plain.checkpoint.model.vocab_head
    assert fused.checkpoint.model.vocab_head.top_kernel is not None, "the fused head is on by default"
    head.top_kernel = None  # the product, then the row top
    for beam in (1, 5):
        cfg = SearchConfig(beam_size=beam)
        got, want = fused.translate(lines, cfg), plain.translate(lines, cfg)
        assert [t.text for t in got] == [t.text for t in want]
        for a, b in zip(got, want):
            assert a.score == pytest.approx(b.score, abs=1e-4)


def test_an_int8_output_layer_takes_its_row_top_from_the_float32_fused_pass(native_kernels) -> None:
    gen = torch.Generator().manual_seed(11)
    weight, x, bias = torch.randn(300, 32, generator=gen), torch.randn(20, 32, generator=gen), torch.randn(300, generator=gen)
    int8 = Int8Linear.from_weight(weight, None)
    assert int8.row_top(x, 5, 3, None) is None  # not fused: its int8 product, then the row top
    int8.fuse_float_top(weight, native_kernels)
    want = packed_head(weight, native_kernels).row_top(x, 5, 3, bias)
    got = int8.row_top(x, 5, 3, bias)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])  # the float32 pass, bit for bit
    assert int8.row_top(torch.randn(PackedLinear.SMALL_KERNEL_ROWS + 1, 32), 5, 3, None) is None  # its int8 product
    assert int8.float_top.packed is None  # (no oneDNN copy of a weight only the fused pass reads)


def test_an_int8_decoder_fuses_its_full_output_layer_and_keeps_its_translations(demo_model_dir) -> None:
    """int8 layers with the float32 fused output layer, against the same int8 decoder with its int8
    output layer: the output layer's quantisation noise alone between them."""
    import sacrebleu
    from dataclasses import replace

    from tests.conftest import shared_path

    lines = shared_path("multi30k", "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:60]
    fused = CoreDecoder.load(str(demo_model_dir), speedups=replace(EXACT, int8=True))
    if detect().int8_dot:  # VNNI / AMX: the int8 product stays
        assert fused.checkpoint.model.vocab_head.float_top is None
        pytest.skip("this CPU has an int8 dot-product unit: int8 decoders keep the int8 output layer")
    plain = CoreDecoder.load(str(demo_model_dir), speedups=replace(EXACT, int8=True))
    assert fused.checkpoint.model.vocab_head.float_top is not None, "int8 decoders fuse the full output layer"
    plain.checkpoint.model.vocab_head.float_top = None
    cfg = SearchConfig(beam_size=5)
    got, want = [t.text for t in fused.translate(lines, cfg)], [t.text for t in plain.translate(lines, cfg)]
    assert sum(a == b for a, b in zip(got, want)) >= 50
    assert sacrebleu.corpus_bleu(got, [want]).score > 85
