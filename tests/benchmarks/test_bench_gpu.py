"""Smoke version of the GPU benchmark, on the CPU (the full one runs on a GPU:
`python -m benchmarks.bench_gpu`; see its docstring)."""
from __future__ import annotations

import json

from benchmarks.bench_gpu import main
from raymt.pipeline.decoders.shortlist_files import save_table
from raymt.workers.search.shortlist import LexicalTable
from raymt.workers.decoder.core_decoder import CoreDecoder
from tests.conftest import SHARED_DATA, shared_path


def test_bench_gpu_smoke_on_the_cpu(demo_model_dir, tmp_path):
    shared_path("multi30k", "test_2016_flickr.de")
    out, lex = tmp_path / "gpu", str(tmp_path / "lex.s2t")
    tok = CoreDecoder.load(str(demo_model_dir)).checkpoint.tokenizer
    save_table(lex, LexicalTable({}, list(range(0, 8001, 3))), tok)  # a frequency-only table: every third id
    main(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--sets", "multi30k", "--lines", "12",
          "--beams", "2", "--hf-batches", "4,12", "--capacities", "4", "--batching-beams", "2", "--batch-sentences", "4",
          "--search-beam", "3", "--shortlist", lex, "--output-rows", "4", "--repeats", "1", "--device", "cpu",
          "--synthetic-base", "--synthetic-lines", "3", "--static", "--out", str(out)])
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["device"] == "CPU" and report["dtype"] == "torch.float32"
    peers = report["tables"]["multi30k/beam2"]
    rows = {r["system"]: r for r in peers["rows"]}
    late = "ours static top-up 4 (read back every 4, a step late)"
    assert set(rows) == {"hf batch 4", "hf batch 12", "ours top-up 4", "ours static top-up 4 (read back every 4)",
                         "ours static top-up 4 (read back every step)", late}
    assert rows[late]["bleu"] == rows["ours top-up 4"]["bleu"]
    assert rows["ours top-up 4"]["bleu"] == rows["hf batch 4"]["bleu"]  # exact search: the same translations
    assert rows["ours static top-up 4 (read back every 4)"]["bleu"] == rows["ours top-up 4"]["bleu"]
    assert rows["ours static top-up 4 (read back every step)"]["bleu"] == rows["ours top-up 4"]["bleu"]
    assert peers["ours_best_over_hf_best"] > 0
    batching = {r["system"] for r in report["tables"]["multi30k/batching/beam2"]["rows"]}
    assert batching == {"GREEDY", "FIXED", "VAR-BATCH", "VAR-STREAM", "VAR-STR-FIFO"}
    synthetic = report["tables"]["synthetic-base/beam5"]
    assert [r["system"] for r in synthetic["rows"]] == ["ours synthetic-base top-up 4",
                                                       "ours synthetic-base static top-up 4"]
    assert synthetic["step_ops"] != "AtenOps" or report["device"] == "CPU"  # (a GPU's: the Triton kernels)
    assert all(r["target_tokens"] > 0 for r in synthetic["rows"])
    topup = {r["system"]: r for r in report["tables"]["multi30k/topup/beam2"]["rows"]}
    assert set(topup) == {"mini-batch", "maxi-batch", "top-up", "top-up + maxi-batch"}
    assert len({r["bleu"] for r in topup.values()}) == 1  # exact search under every batching
    search = {r["system"]: r for r in report["tables"]["multi30k/search/beam3"]["rows"]}
    assert set(search) == {"exact", "pruning", "shortlist", "shortlist + pruning"}
    assert search["shortlist"]["bleu"] != search["exact"]["bleu"]  # every third id: a visibly different search
    for vocab in (8000, 32000, 58101):
        output = report["tables"][f"output-step/vocab{vocab}"]["rows"]
        assert {(r["logits"], r["kernel"]) for r in output} == {("float32", "aten"), ("bfloat16", "aten")}  # no GPU
        assert all(r["rows"] == 4 and r["vocab"] == vocab and r["us"] > 0 and r["floor_us"] > 0 for r in output)
    attention = report["tables"]["self-attention-step"]["rows"]
    assert {(r["history"], r["t"]) for r in attention} == {(16, 16), (16, 257), (64, 64), (64, 257)}
    assert {r["kernel"] for r in attention} == {"aten gather"} and all(r["floor_share"] > 0 for r in attention)
    cross = report["tables"]["cross-attention-step"]["rows"]
    assert {(r["length"], r["kernel"]) for r in cross} == {(24, "aten (s = 24)"), (24, "aten (s = 256)"),
                                                           (64, "aten (s = 64)"), (64, "aten (s = 256)")}
    assert all(r["slots"] == 1 and r["floor_share"] > 0 for r in cross)
    assert "# GPU benchmark on CPU" in out.with_suffix(".md").read_text()


def test_a_size_that_runs_out_of_memory_is_a_row_that_says_so():
    import torch

    from benchmarks.bench_gpu import measure, rows_of

    def too_big(lines):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    lines = ["a dog runs over the green grass .", "two men play football in the park ."]
    fits = measure("ours top-up 4", torch.device("cpu"), lambda x: (list(x), 8 * len(x), 2), lines, 2)
    rows = rows_of([fits, measure("ours top-up 1024", torch.device("cpu"), too_big, lines, 2)], lines)
    assert rows[0]["tokens_per_s"] > 0 and rows[0]["bleu"] == 100.0
    assert rows[1]["system"] == "ours top-up 1024 (out of memory)" and rows[1]["tokens_per_s"] is None
