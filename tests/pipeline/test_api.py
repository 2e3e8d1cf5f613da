"""The Python API, ``raymt.Translator``: what it returns, where it loads from, and that it translates
exactly as the command line does with the same (default) settings."""
from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from raymt import Translator
from raymt.workers.decoder.decode_config import DEFAULTS, ShortlistSource
from tests.conftest import ROOT

SAMPLE = ROOT / "examples" / "sample.de.txt"


@pytest.fixture(scope="module")
def translator(demo_model_dir, one_thread):
    with Translator.load(str(demo_model_dir), threads=1) as t:
        yield t


def test_strings_in_strings_out_in_order(translator):
    out = translator.translate(["Ein Hund läuft.", "", None, "Zwei Männer spielen Fußball."])
    assert out[0] == "A dog is running." and out[1:3] == ["", ""] and "soccer" in out[3]
    assert translator.translate([]) == []
    assert translator.decode == DEFAULTS or translator.decode.search == DEFAULTS.search


def test_nbest_on_request_with_scores_best_first(translator):
    (best,) = translator.translate(["Ein Hund läuft."])
    (hyps,) = translator.translate(["Ein Hund läuft."], nbest=3)
    assert len(hyps) == 3 and hyps[0][0] == best
    assert [s for _, s in hyps] == sorted((s for _, s in hyps), reverse=True) and all(s < 0 for _, s in hyps)
    with pytest.raises(ValueError, match="num_hypotheses must be in"):
        translator.translate(["Ein Hund."], nbest=4, beam_size=2)
    assert translator.translate(["Ein Hund läuft."], beam_size=1) == ["A dog is running."]


def test_rows_carry_the_jobs_statuses(translator):
    rows = translator.translate_rows(["Ein\x07 Hund läuft.", "  ", None, b"Ein Hund l\xe4uft."])
    assert [r.status for r in rows] == ["normalised", "empty", "null", "normalised"]
    assert rows[0].text == "A dog is running." and "control character" in rows[0].reason
    assert "invalid UTF-8" in rows[3].reason


def test_a_row_over_the_row_limit_is_too_long_and_not_decoded(demo_model_dir, translator):
    """The job's default limit (20,000 characters) and one set at load, bytes cells alike; 0: none."""
    long = "Ein Hund. " * 2001  # 20,010 characters
    rows = translator.translate_rows(["Ein Hund läuft.", long, long.encode()])
    assert [r.status for r in rows] == ["ok", "too_long", "too_long"] and rows[1].text == "" and not rows[1].nbest
    assert rows[1].reason == "20010 characters, more than --max-row-chars 20000"
    tokens = translator.stats.target_tokens
    small = Translator.load(str(demo_model_dir), threads=1, max_row_chars=10)
    assert small.translate(["Ein Hund.", "Ein Hund läuft."]) == ["A dog.", ""]
    assert translator.stats.target_tokens == tokens
    unlimited = Translator.load(str(demo_model_dir), threads=1, max_row_chars=0).translate_rows(["Ein Hund. " * 50])[0]
    assert (unlimited.status, unlimited.reason) == ("split", "50 sentences")  # decoded: a sentence at a time
    with pytest.raises(ValueError, match="max_row_chars must be >= 0"):
        Translator.load(str(demo_model_dir), max_row_chars=-1)


def test_loads_from_a_url_and_refuses_unknown_compute_types(demo_model_dir, s3, one_thread):
    for name in os.listdir(demo_model_dir):
        s3.put(str(demo_model_dir / name), f"corpus-bucket/models/demo/{name}")
    remote = Translator.load("s3://corpus-bucket/models/demo", threads=1)
    local = Translator.load(str(demo_model_dir), threads=1)
    assert remote.translate(["Ein Hund läuft."]) == local.translate(["Ein Hund läuft."])
    with pytest.raises(ValueError, match="compute_type 'int4': choose one of float32, int8, bfloat16, float16"):
        Translator.load(str(demo_model_dir), compute_type="int4")


def test_a_whole_vocabulary_shortlist_changes_nothing(demo_model_dir, translator, tmp_path):
    tok = translator.core.checkpoint.tokenizer
    pieces = sorted(tok.target_vocab, key=tok.target_vocab.get)
    (tmp_path / "lex.s2t").write_text("▁dog ▁Hund 0.9\n", encoding="utf-8")
    (tmp_path / "lex.s2t.freq").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    texts = SAMPLE.read_text(encoding="utf-8").split("\n")[:6]
    listed = Translator.load(str(demo_model_dir), threads=1,
                             shortlist=ShortlistSource(str(tmp_path / "lex.s2t"), top_n=len(pieces)))
    assert listed.shortlist is not None and listed.decode.batching.schedule is None  # (batches, as the job's)
    assert listed.translate(texts) == translator.translate(texts)


def test_the_api_and_the_command_line_translate_alike(demo_model_dir, translator, tmp_path):
    """One table of defaults and one row path: the same lines give the same translations, n-best and
    statuses through ``python -m raymt.jobs.translate`` and ``raymt.Translator``. The repeated word runs
    past the length cap a * source + b, so a cap that differed would show; the long line is split."""
    lines = [*SAMPLE.read_text(encoding="utf-8").split("\n")[:4], "Ja ja ja ja ja ja ja ja ja ja ja ja",
             "Ein\x07 Hund.", " ".join(["Ein Hund läuft über die Wiese."] * 150)]
    src, out = tmp_path / "in.de.txt", tmp_path / "out.parquet"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "raymt.jobs.translate", "--in-process", "--threads", "1", "--nbest", "2",
                    "--model", str(demo_model_dir), "--input", str(src), "--output", str(out)],
                   cwd=ROOT, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    job = pq.read_table(out).to_pylist()
    api = translator.translate_rows(lines, nbest=2)
    assert [r["translation"] for r in job] == [r.text for r in api]
    assert [r["status"] for r in job] == [r.status for r in api] and api[-1].status == "split"
    assert [[h["text"] for h in r["nbest"]] for r in job] == [[h for h, _ in r.nbest] for r in api]
    for r, a in zip(job, api):
        assert [h["score"] for h in r["nbest"]] == pytest.approx([s for _, s in a.nbest], abs=1e-5)
    assert len(api[4].text.split()) < 30  # the cap binds: unbounded, the model repeats "ja" for 256 tokens


def test_search_values_the_decoder_cannot_use_are_one_valueerror_before_decoding(demo_model_dir, translator):
    """The same refusals as the command line's, raised by the configs where they are built (or
    replaced, for one call's search), before any decoding; the coldest temperature is greedy."""
    import math

    from raymt.workers.config import MIN_SAMPLING_TEMPERATURE, SamplingConfig, SearchConfig
    tokens = translator.stats.target_tokens
    for value in (math.inf, 1e-300, 1e300, math.nan):
        with pytest.raises(ValueError, match=r"^sampling temperature must be in \[0\.0001, 10000\], got "):
            translator.translate(["Ein Hund."], sampling=SamplingConfig(temperature=value))
    with pytest.raises(ValueError, match=r"^num_samples \(sampling's beam_size\) must be in \[1, 1024\], got 100000$"):
        translator.translate(["Ein Hund."], beam_size=100_000, sampling=SamplingConfig())
    with pytest.raises(ValueError, match=r"^beam_size must be in \[1, 1024\], got 100000$"):
        translator.translate(["Ein Hund."], beam_size=100_000)
    with pytest.raises(ValueError, match=r"^beam_size must be in \[1, 1024\], got 100000$"):
        Translator.load(str(demo_model_dir), search=SearchConfig(beam_size=100_000))
    assert translator.stats.target_tokens == tokens  # nothing decoded
    texts = ["Ein Hund läuft.", "Zwei Männer spielen Fußball."]
    cold = SamplingConfig(temperature=MIN_SAMPLING_TEMPERATURE)
    assert translator.translate(texts, beam_size=2, sampling=cold) == translator.translate(texts, beam_size=1)
