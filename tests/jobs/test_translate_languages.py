"""The translate job on an NLLB directory: --source-lang / --target-lang reach the encoder and the
decoder (in-process and through standard input), and a missing language is one line, not a traceback."""
from __future__ import annotations

import json

import pytest

from raymt.jobs.translate import main
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.core_decoder import CoreDecoder
from tests.conftest import shared_path

transformers = pytest.importorskip("transformers")


def test_job_translates_into_the_target_language_and_refuses_without_one(nllb_dir, tmp_path, capsys):
    lines = shared_path("multi30k", "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:6]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    base = ["--in-process", "--threads", "1", "--model", str(nllb_dir), "--input", str(tmp_path / "in.txt"),
            "--beam-size", "2", "--source-lang", "deu_Latn"]
    main([*base, "--output", str(tmp_path / "out.txt"), "--target-lang", "fra_Latn"])
    got = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    tr = CoreDecoder.load(str(nllb_dir))
    cfg = SearchConfig(beam_size=2)
    assert got == [t.text for t in tr.translate(lines, cfg, source_lang="deu_Latn", target_lang="fra_Latn")]
    assert got != [t.text for t in tr.translate(lines, cfg, source_lang="deu_Latn", target_lang="eng_Latn")]
    with pytest.raises(SystemExit) as error:
        main([*base, "--output", str(tmp_path / "none.txt")])
    assert str(error.value).startswith("error: this nllb model needs target_lang") and "--target-lang" in str(error.value)
    with pytest.raises(SystemExit) as error:
        main([*base, "--output", str(tmp_path / "bad.txt"), "--target-lang", "fr"])
    assert "unknown language code 'fr'" in str(error.value) and "\n" not in str(error.value)


def test_per_row_target_language_column(nllb_dir, tmp_path):
    """``--source-lang-column`` / ``--target-lang-column``: a Parquet column / JSONL field gives each row its
    languages (rows of different languages decoded together); a row without one takes the job's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = shared_path("multi30k", "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:6]
    langs = ["fra_Latn", "eng_Latn", None, "ita_Latn", "eng_Latn", None]
    sources = [None, "eng_Latn", "deu_Latn", None, "fra_Latn", "eng_Latn"]
    pq.write_table(pa.table({"text": lines, "lang": langs, "src": sources}), tmp_path / "in.parquet")
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t, **({"lang": g} if g else {}), "src": s}) + "\n"
                                               for t, g, s in zip(lines, langs, sources)), encoding="utf-8")
    tr = CoreDecoder.load(str(nllb_dir))
    want = [t.text for t in tr.translate(lines, SearchConfig(beam_size=2), source_lang=[s or "deu_Latn" for s in sources],
                                         target_lang=[g or "fra_Latn" for g in langs])]
    assert want != [t.text for t in tr.translate(lines, SearchConfig(beam_size=2), source_lang="deu_Latn",
                                                 target_lang=[g or "fra_Latn" for g in langs])]  # (the sources count)
    for name in ("in.parquet", "in.jsonl"):
        out = tmp_path / f"out-{name}.txt"
        main(["--in-process", "--threads", "1", "--model", str(nllb_dir), "--input", str(tmp_path / name),
              "--output", str(out), "--beam-size", "2", "--source-lang", "deu_Latn", "--target-lang", "fra_Latn",
              "--target-lang-column", "lang", "--source-lang-column", "src"])
        assert out.read_text(encoding="utf-8").splitlines() == want, name


def test_a_bad_code_in_a_language_column_is_one_invalid_row(nllb_dir, tmp_path):
    """An unknown (or missing) code in a per-row column: that row ``invalid`` with the code named and
    its translation empty; every other row of the unit translates as without it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = shared_path("multi30k", "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:5]
    langs = ["fra_Latn", "xx_Latn", "eng_Latn", None, "fra_Latn"]
    sources = ["deu_Latn", "deu_Latn", "deu_Latn", "deu_Latn", "zz_Zzzz"]
    pq.write_table(pa.table({"text": lines, "lang": langs, "src": sources}), tmp_path / "in.parquet")
    main(["--in-process", "--threads", "1", "--model", str(nllb_dir), "--input", str(tmp_path / "in.parquet"),
          "--output", str(tmp_path / "out.parquet"), "--beam-size", "2", "--source-lang", "deu_Latn",
          "--target-lang-column", "lang", "--source-lang-column", "src"])
    out = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["status"] for r in out] == ["ok", "invalid", "ok", "invalid", "invalid"]
    assert out[1]["reason"].startswith("unknown target language 'xx_Latn' (202 codes: ace_Arab, ")
    assert out[3]["reason"].startswith("no target language") and "--target-lang" in out[3]["reason"]
    assert out[4]["reason"].startswith("unknown source language 'zz_Zzzz'")
    assert [r["source"] for r in out] == lines and [out[i]["translation"] for i in (1, 3, 4)] == ["", "", ""]
    tr = CoreDecoder.load(str(nllb_dir))
    good = [0, 2]
    want = tr.translate([lines[i] for i in good], SearchConfig(beam_size=2), source_lang="deu_Latn",
                        target_lang=[langs[i] for i in good])
    assert [out[i]["translation"] for i in good] == [t.text for t in want]
    with pytest.raises(ValueError, match=r"target_lang: unknown codes in 1 of 5 rows: 1 \('xx_Latn'\)"):
        tr.translate(lines, SearchConfig(beam_size=2), source_lang="deu_Latn",
                     target_lang=[g or "fra_Latn" for g in langs])


def test_per_row_target_languages_on_ray(nllb_dir, tmp_path):
    """The same per-row languages through Ray: an encoder actor binds each row's source language, decoder
    actors force each row's target; two units, so rows of both units and several languages are decoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from tests.pipeline.ray_helpers import start_ray

    lines = shared_path("multi30k", "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:8]
    langs = ["fra_Latn", "eng_Latn", None, "ita_Latn", "eng_Latn", None, "ita_Latn", "fra_Latn"]
    pq.write_table(pa.table({"text": lines, "lang": langs}), tmp_path / "in.parquet")
    want = [t.text for t in CoreDecoder.load(str(nllb_dir)).translate(
        lines, SearchConfig(beam_size=2), source_lang="deu_Latn", target_lang=[g or "fra_Latn" for g in langs])]
    start_ray(num_cpus=2)
    try:
        main(["--local-rows", "0", "--unit-rows", "4", "--decoders", "1", "--encoders", "1", "--threads", "1",
              "--model", str(nllb_dir), "--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out.parquet"),
              "--beam-size", "2", "--source-lang", "deu_Latn", "--target-lang", "fra_Latn", "--target-lang-column", "lang"])
    finally:
        ray.shutdown()
    out = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["translation"] for r in out] == want and [r["lang"] for r in out] == langs
