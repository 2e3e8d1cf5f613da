"""Smoke version of the peer benchmark (the full one is `python -m benchmarks.bench`)."""
from __future__ import annotations

import json

import pytest

from benchmarks.bench import main
from benchmarks.flops import decoder_flops_per_row_step, flops_per_target_token
from raymt.workers.config import ModelConfig
from raymt.workers.kernels.isa import bf16_refusal, detect
from tests.conftest import SHARED_DATA, shared_path


def test_peer_benchmark_smoke(demo_model_dir, tmp_path):
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    shared_path("multi30k", "test_2016_flickr.de")
    out = tmp_path / "peers"
    main(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--sets", "multi30k", "--lines", "40",
          "--beams", "1,2", "--repeats", "1", "--out", str(out)])
    report = json.loads(out.with_suffix(".json").read_text())
    table = report["tables"]["multi30k/beam1"]
    names = [r["system"] for r in table["rows"]]
    bf16 = [] if bf16_refusal(detect()) else ["ours+bf16"]  # skipped, with the reason, on AVX2-only CPUs
    assert names == ["ours-plain", "ours+qkv", "ours+onednn", "ours-exact", "ours-exact-k", "ours+int8", *bf16, "ours-best",
                     "ct2-float32", "ct2-int8", "hf"]
    bleu = {r["system"]: r["bleu"] for r in table["rows"]}
    assert bleu["ours-exact"] == bleu["ours+onednn"] == bleu["ours+qkv"] == bleu["ct2-float32"] == bleu["hf"]  # greedy: identical outputs
    assert table["identical_outputs"]["ours-exact = hf"] == 40
    steps = report["tables"]["multi30k/beam1/speedups"]
    assert [s["step"][:2] for s in steps] == ["ba"] + ["+ "] * (4 + len(bf16)) and steps[0]["speedup"] == 1.0
    assert set(table["ratios"]) >= {"ours-exact / ct2-float32", "ours-exact / hf", "ours-best / ct2-int8"}
    phases = report["tables"]["multi30k/beam2/profile/ours-exact"]
    assert {p["phase"] for p in phases} >= {"decoder layers", "output layer"} and sum(p["share"] for p in phases) > 0.9
    beam2 = report["tables"]["multi30k/beam2"]["identical_outputs"]  # same search rules, same outputs
    assert beam2["ours-exact = hf"] == beam2["ours-exact-k = ct2-float32"] == beam2["ours-plain = ours-exact"] == 40
    assert all(r["tokens_per_s"] > 0 and 0 < r["share_of_gemm_peak"] for r in table["rows"])
    assert report["gemm_peak_gflops"] > 0 and report["gemm_probe"]["torch_matmul"] > 0
    float32 = [r for r in table["rows"] if r["system"] in ("ours-exact", "ct2-float32", "hf")]
    assert all(r["share_of_gemm_peak"] < 1 for r in float32)  # no float32 decoder outruns the GEMM it runs on
    if report["isa_peak_gflops"] > 0:  # (a clock was readable)
        assert all(r["share_of_isa_peak"] > 0 for r in table["rows"]) and "FLOP/cycle" in report["isa_peak"]
        assert all(r["share_of_isa_peak"] < 1 for r in float32)  # nor the measured FMA peak


def test_the_fma_probe_measures_a_peak_no_gemm_exceeds():
    """The ISA's peak at the clock the cores really run: above the GEMM probe on the same threads."""
    from benchmarks.fma_probe import isa_peak
    from benchmarks.peers import gemm_probe

    try:
        peak, how = isa_peak(1, detect())
    except Exception as err:  # no compiler here: the bench falls back to the reported clock
        pytest.skip(f"FMA probe cannot be built: {err}")
    gemm = gemm_probe(threads=1, size=512, seconds=0.2).peak
    assert gemm <= peak * 1.02 and "GHz" in how and "measured" in how


def test_streaming_policies_against_batch_decoding(demo_model_dir, tmp_path):
    """The bench's policy systems: the same translations as batch decoding, timed beside it."""
    shared_path("multi30k", "test_2016_flickr.de")
    out = tmp_path / "policies"
    main(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--sets", "multi30k", "--lines", "40",
          "--beams", "2", "--repeats", "1", "--systems", "ours-exact,ours-topup,ours-var-stream,ours-fifo",
          "--profile", "", "--out", str(out)])
    table = json.loads(out.with_suffix(".json").read_text())["tables"]["multi30k/beam2"]
    assert table["identical_outputs"] == {"ours-topup = ours-exact": 40, "ours-var-stream = ours-exact": 40,
                                          "ours-fifo = ours-exact": 40}
    assert set(table["ratios"]) == {"ours-topup / ours-exact", "ours-var-stream / ours-exact", "ours-fifo / ours-exact"}


def test_flop_formula_by_hand():
    cfg = ModelConfig(vocab_size=100, decoder_vocab_size=100, d_model=4, encoder_layers=1, decoder_layers=1,
                      encoder_attention_heads=1, decoder_attention_heads=1, encoder_ffn_dim=8, decoder_ffn_dim=8,
                      pad_token_id=99, decoder_start_token_id=99)
    # self q,k,v,o 8*16 + self attn 4*t*4 + cross q,o 4*16 + cross attn 4*S*4 + ffn 4*4*8, + output 2*4*100
    assert decoder_flops_per_row_step(cfg, source_length=3, target_position=2) == 128 + 32 + 64 + 48 + 128 + 800
    assert decoder_flops_per_row_step(cfg, 3, 2, output_size=10) == 128 + 32 + 64 + 48 + 128 + 80
    assert flops_per_target_token(cfg, source_length=3, target_length=4, fan_out=2) > \
        flops_per_target_token(cfg, source_length=3, target_length=4, fan_out=1)


def test_flop_formula_counts_what_the_model_multiplies():
    """The formula's GEMM terms against torch's FLOP counter on a teacher-forced forward of a random
    model (B sentences of S source and T target tokens): every linear layer, the cached cross-attention
    K/V and the output layer. The counter does not see attention's score and weighted-sum products
    (scaled_dot_product_attention), so those terms are taken off by hand: 4 S E per encoder token and
    layer, 4 T E (causal, computed in full) + 4 S E per target position and decoder layer."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from benchmarks.flops import encoder_flops_per_source_token
    from raymt.workers.model.model import MarianModel

    cfg = ModelConfig(vocab_size=301, decoder_vocab_size=301, d_model=64, encoder_layers=2, decoder_layers=3,
                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=256,
                      pad_token_id=300, decoder_start_token_id=300)
    b, s, t, e = 3, 7, 5, 64
    src, tgt = torch.randint(0, 299, (b, s)), torch.randint(0, 299, (b, t))
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        MarianModel(cfg).eval()(src, torch.ones(b, s, dtype=torch.bool), tgt)
    formula = b * s * encoder_flops_per_source_token(cfg, s) + b * t * decoder_flops_per_row_step(cfg, s, t)
    attention = b * s * 2 * 4 * s * e + b * t * 3 * (4 * t * e + 4 * s * e)
    assert counter.get_total_flops() == formula - attention


def test_gemm_probe_reads_both_kernels():
    from benchmarks.peers import gemm_probe

    probe = gemm_probe(threads=1, size=128, seconds=0.05)
    assert probe.torch_matmul > 0 and probe.peak == max(probe.torch_matmul, probe.onednn)


def test_ctranslate2_is_resident_only_during_its_own_runs(demo_model_dir, tmp_path):
    """Either library slowed the other in one process (benchmarks/peers.py): the bench runs
    CTranslate2 in a child process without torch, started before each of its timed runs and ended after."""
    pytest.importorskip("ctranslate2")
    from benchmarks.peers import PeerRun, ctranslate2_system, run
    from raymt.workers.config import SearchConfig
    from raymt.workers.decoder.core_decoder import CoreDecoder

    translator = CoreDecoder.load(str(demo_model_dir), threads=1)
    ct2 = ctranslate2_system(str(demo_model_dir), "float32", 1, SearchConfig(beam_size=2), translator, str(tmp_path))
    resident = []
    ours = PeerRun("ours", lambda lines: resident.append(ct2._ct2 is not None) or [x.text for x in translator.translate(
        lines, SearchConfig(beam_size=2))])
    lines = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball."]
    systems = [PeerRun("ct2", ct2), ours]
    run(systems, lines, repeats=2, warmup_lines=1)
    assert resident == [False, False, False] and ct2._ct2 is None  # never beside ours' runs (warm-up included)
    ct2.load()
    assert ct2._ct2.ready == {"torch_loaded": False}  # its process never imports torch
    ct2.unload()
    assert systems[0].outputs == ours.outputs and len(systems[0].seconds) == 2


def test_best_split_lists_every_split_and_the_best_of_each(demo_model_dir, tmp_path):
    """``--best-split``: ours at every decoders x threads split (2 cores: 1x2, 2x1), CTranslate2 at every
    inter x intra split and batch size, and the fastest of each system."""
    pytest.importorskip("ctranslate2")
    shared_path("multi30k", "test_2016_flickr.de")
    out = tmp_path / "splits"
    main(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--sets", "multi30k", "--lines", "24",
          "--beams", "2", "--repeats", "1", "--threads", "2", "--systems", "ours-exact,ct2-float32", "--profile", "",
          "--best-split", "--batch-sizes", "32,64", "--out", str(out)])
    report = json.loads(out.with_suffix(".json").read_text())
    grid = report["tables"]["multi30k/beam2/splits"]
    assert [(r["system"], r["split"], r["batch"]) for r in grid["rows"]] == [
        ("ours-exact", "1x2", "-"), ("ct2-float32", "1x2", "32"), ("ct2-float32", "1x2", "64"),
        ("ours-exact", "2x1", "-"), ("ct2-float32", "2x1", "32"), ("ct2-float32", "2x1", "64")]
    for best in grid["best"]:
        assert best["tokens_per_s"] == max(r["tokens_per_s"] for r in grid["rows"] if r["system"] == best["system"])
    assert [b["system"] for b in grid["best"]] == ["ours-exact", "ct2-float32"]
    assert set(grid["ratios"]) == {"best ours-exact / best ct2-float32"} and grid["ratios"]["best ours-exact / best ct2-float32"] > 0
    # two decoder processes, each on its share, put every line back in its place: the same translations
    main_row = next(r for r in report["tables"]["multi30k/beam2"]["rows"] if r["system"] == "ours-exact")
    assert all((r["bleu"], r["target_tokens"]) == (main_row["bleu"], main_row["target_tokens"])
               for r in grid["rows"] if r["system"] == "ours-exact")
    assert "Best split per system" in out.with_suffix(".md").read_text()


def test_shape_checkpoints_decode_to_the_cap_alike_and_the_vmap_reaches_ctranslate2(tmp_path):
    """A random-weight checkpoint of a user's shape (``benchmarks.shapes``; here a small one) loads in
    ours, CTranslate2 and HF, decodes every sentence to ``--max-tokens`` in each (EOS unreachable), and
    ours-best's shortlist reaches CTranslate2 as the same vocabulary map (``ct2-int8-vmap``)."""
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    from benchmarks.shapes import Shape, build

    shared_path("multi30k", "test_2016_flickr.de")
    tokenizer = shared_path("..", "models", "base-de-en", "vocab.json").parent
    model = build(Shape(64, 2, 128, 9001, "swish", encoder_layers=1, decoder_layers=1), str(tmp_path / "shape"), str(tokenizer))
    vocab = json.loads((tmp_path / "shape" / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) == 9001 and vocab["<pad>"] == 9000 and "▁unused0" in vocab
    vmap = tmp_path / "table.vmap"
    vmap.write_text("\t▁a ▁the .\n▁Ein\t▁A ▁a\n▁Hund\t▁dog\n", encoding="utf-8")
    out = tmp_path / "peers"
    main(["--model", model, "--data", str(SHARED_DATA), "--sets", "multi30k", "--lines", "6", "--beams", "2",
          "--repeats", "1", "--max-tokens", "5", "--systems", "ours-exact,ours-unfused-head,ours-best,ct2-float32,"
          "ct2-int8-vmap,hf", "--shortlist", str(vmap), "--profile", "", "--out", str(out)])
    table = json.loads(out.with_suffix(".json").read_text())["tables"]["multi30k/beam2"]
    rows = {r["system"]: r for r in table["rows"]}
    full = {rows[name]["target_tokens"] for name in ("ours-exact", "ours-unfused-head", "ct2-float32", "hf")}
    assert len(full) == 1 and full.pop() > 6 * 3  # every sentence to the cap (5 pieces; re-tokenised text)
    same = table["identical_outputs"]
    assert same["ours-exact = hf"] == same["ours-unfused-head = ours-exact"] == 6  # the fused output layer: no token moves
    assert "ours-best / ct2-int8-vmap" in table["ratios"]
