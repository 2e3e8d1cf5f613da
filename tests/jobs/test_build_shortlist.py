"""raymt.jobs.build_shortlist on a Multi30k slice, then raymt.jobs.translate with the table it wrote."""
from __future__ import annotations

import pyarrow.parquet as pq

from raymt.jobs.build_shortlist import main as build
from raymt.jobs.translate import main as translate
from raymt.pipeline.shortlists import load_table
from tests.conftest import ROOT, shared_path
from raymt.workers.translator import Translator

SAMPLE = ROOT / "examples" / "sample.de.txt"


def slice_of(name: str, tmp_path, n: int = 400):
    lines = shared_path("multi30k", name).read_text(encoding="utf-8").split("\n")[:n]
    out = tmp_path / name
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def test_alignment_table_translates_hund_to_dog(demo_model_dir, tmp_path):
    src, tgt = slice_of("train.de", tmp_path), slice_of("train.en", tmp_path)
    out = tmp_path / "lex.s2t"
    build(["--model", str(demo_model_dir), "--source", str(src), "--target", str(tgt), "--output", str(out)])
    tok = Translator.load(str(demo_model_dir)).checkpoint.tokenizer
    table = load_table(str(out), tok)
    assert table.frequent and (tmp_path / "lex.s2t.freq").exists()
    hund = tok.source_vocab["▁Hund"]
    best = [t for t, _ in table.translations[hund][:3]]
    assert tok.target_vocab["▁dog"] in best


def test_word_space_and_vmap_output(demo_model_dir, tmp_path):
    src, tgt = slice_of("train.de", tmp_path), slice_of("train.en", tmp_path)
    out = tmp_path / "table.vmap"
    build(["--model", str(demo_model_dir), "--source", str(src), "--target", str(tgt), "--space", "word",
           "--output", str(out), "--vmap-top-m", "5", "--vmap-top-n", "20"])
    first = out.read_text(encoding="utf-8").split("\n")[0]
    assert first.startswith("\t") and len(first.split()) == 20


def test_self_built_table_drives_a_shortlisted_translation(demo_model_dir, tmp_path):
    src = slice_of("val.de", tmp_path, n=60)
    table = tmp_path / "self.s2t"
    build(["--model", str(demo_model_dir), "--source", str(src), "--self-built", "--beam-size", "2",
           "--output", str(table)])
    out = tmp_path / "out.parquet"
    translate(["--in-process", "--model", str(demo_model_dir), "--input", str(SAMPLE), "--output", str(out), "--beam-size", "2",
               "--shortlist", str(table), "--shortlist-m", "20", "--shortlist-n", "200"])
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == len(SAMPLE.read_text(encoding="utf-8").split("\n")[:-1])
    assert all(r["translation"] for r in rows)
    assert "shortlist:" in rows[0]["signature"]
