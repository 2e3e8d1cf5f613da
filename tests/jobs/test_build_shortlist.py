"""raymt.jobs.build_shortlist on a Multi30k slice, then raymt.jobs.translate with the table it wrote."""
from __future__ import annotations

import pyarrow.parquet as pq

from raymt.jobs.build_shortlist import main as build
from raymt.jobs.translate import main as translate
from raymt.pipeline.decoders.shortlist_files import load_table
from tests.conftest import ROOT, shared_path
from raymt.workers.decoder.core_decoder import CoreDecoder

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
    tok = CoreDecoder.load(str(demo_model_dir)).checkpoint.tokenizer
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


def test_nllb_gets_one_table_per_target_language_and_the_job_decodes_with_them(nllb_dir, tmp_path):
    """An NLLB model: one frequency table per --target-lang from its own translations of --source,
    ``<code>.s2t`` in the --output directory; ``--shortlist`` that directory decodes a unit of mixed
    target languages as the API does with those tables."""
    import pyarrow as pa

    from raymt.pipeline.decoders.shortlist_files import load_shortlist
    from raymt.workers.config import SearchConfig
    from raymt.workers.search.shortlist import LanguageShortlists

    src = slice_of("train.de", tmp_path, n=20)
    out = tmp_path / "shortlists"
    build(["--model", str(nllb_dir), "--source", str(src), "--source-lang", "deu_Latn", "--target-lang", "fra_Latn",
           "eng_Latn", "--frequency-only", "--beam-size", "2", "--output", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["eng_Latn.s2t", "eng_Latn.s2t.freq", "fra_Latn.s2t",
                                                      "fra_Latn.s2t.freq"]
    tr = CoreDecoder.load(str(nllb_dir))
    tok = tr.checkpoint.tokenizer
    lists = load_shortlist(str(out), tok, top_m=10, top_n=50, special_ids=tr.special_target_ids())
    assert isinstance(lists, LanguageShortlists)
    assert sorted(lists.by_language) == sorted([tok.lang_id("fra_Latn"), tok.lang_id("eng_Latn")])
    assert all(s.table.frequent for s in lists.by_language.values())
    lines = src.read_text(encoding="utf-8").splitlines()[:6]
    langs = ["fra_Latn", "eng_Latn"] * 3
    pq.write_table(pa.table({"text": lines, "lang": langs}), tmp_path / "in.parquet")
    translate(["--in-process", "--threads", "1", "--model", str(nllb_dir), "--input", str(tmp_path / "in.parquet"),
               "--output", str(tmp_path / "out.parquet"), "--beam-size", "2", "--source-lang", "deu_Latn",
               "--target-lang-column", "lang", "--shortlist", str(out), "--shortlist-m", "10", "--shortlist-n", "50"])
    want = tr.translate(lines, SearchConfig(beam_size=2), lists, source_lang="deu_Latn", target_lang=langs)
    assert pq.read_table(tmp_path / "out.parquet").column("translation").to_pylist() == [t.text for t in want]
    full = tr.translate(lines, SearchConfig(beam_size=2), source_lang="deu_Latn", target_lang=langs)
    assert [t.tokens for t in want] != [t.tokens for t in full]  # (the tables did restrict the search)
