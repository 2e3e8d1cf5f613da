"""The end-to-end Ray benchmark: its peer callables translate like the peers (fast, no Ray), and a
small run end to end (slow: every system is a fresh process that starts Ray)."""
from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest

from benchmarks.bench_ray_e2e import Ct2Translate, HfTranslate, main
from tests.conftest import SHARED_DATA, shared_path

TEXTS = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball."]


def test_the_peer_callables_translate_a_batch_like_our_api(demo_model_dir, tmp_path, one_thread):
    from raymt import Translator
    ours = Translator.load(str(demo_model_dir), threads=1).translate(TEXTS, beam_size=2)
    subprocess.run([sys.executable, "-m", "ctranslate2.converters.transformers", "--model", str(demo_model_dir),
                    "--output_dir", str(tmp_path / "ct2"), "--quantization", "float32"], check=True, capture_output=True)
    batch = pa.table({"id": [0, 1], "text": TEXTS})
    ct2 = Ct2Translate(str(tmp_path / "ct2"), str(demo_model_dir), threads=1, beam=2, batch=8)(batch)
    hf = HfTranslate(str(demo_model_dir), threads=1, beam=2)(batch)
    assert ct2.column("translation").to_pylist() == ours == hf.column("translation").to_pylist()
    assert ct2.column("id").to_pylist() == [0, 1]
    capped = Ct2Translate(str(tmp_path / "ct2"), str(demo_model_dir), threads=1, beam=2, batch=8, max_tokens=2)(batch)
    hf_capped = HfTranslate(str(demo_model_dir), threads=1, beam=2, max_tokens=2)(batch)
    for table in (capped, hf_capped):  # --max-tokens reaches the peers: two pieces at most, EOS not reached
        assert all(0 < len(t.split()) <= 2 for t in table.column("translation").to_pylist())


@pytest.mark.slow
def test_bench_ray_e2e_smoke(demo_model_dir, tmp_path):
    shared_path("multi30k", "test_2016_flickr.de")
    main(["--model", str(demo_model_dir), "--data", str(SHARED_DATA), "--lines", "12", "--small", "3",
          "--hf-lines", "6", "--out", str(tmp_path / "report")])
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["system"] for r in report["runs"]][:2] == ["job-float32", "job-int8"]
    assert all(r["target_tokens"] > 0 and r["bleu"] > 0 for r in report["runs"])
    assert "job-float32 / ct2-float32" in report["ratios"]
