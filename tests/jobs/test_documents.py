"""Rows of several sentences (paragraphs, posts) are translated a sentence at a time and rejoined with
their whitespace: the job, the Python API and the Ray Data operator give the same rows; a one-sentence
row is unchanged; a resume in the middle of a corpus of split rows writes each row exactly once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymt import Translator
from raymt.jobs.translate import main
from raymt.pipeline.outputs.sink import OutputStore
from raymt.ray_data import Translate
from tests.conftest import ROOT, SHARED_DATA
from tests.hold_gates import AFTER_COMMIT, gate_env
from tests.pipeline.ray_helpers import SAMPLE, assert_exactly_once

SENTENCES = SAMPLE * 3  # the shipped sample's sentences


def paragraphs(n: int) -> list[str]:
    """n rows of 2-4 sentences, joined by a space, a newline or a blank line in turn."""
    joins = [" ", "\n", "\n\n", "  "]
    out, k = [], 0
    for i in range(n):
        size = 2 + i % 3
        out.append(joins[i % 4].join(SENTENCES[(k + j) % len(SENTENCES)] for j in range(size)))
        k += size
    return out


@pytest.fixture(scope="module")
def api(demo_model_dir):
    return Translator.load(str(demo_model_dir), threads=1)


def test_a_paragraph_is_its_sentences_translated_and_rejoined_as_written(demo_model_dir, api):
    sentences = SENTENCES[:4]
    text = f"{sentences[0]} {sentences[1]}\n\n{sentences[2]}\n    {sentences[3]}"
    [row] = api.translate_rows([text])
    alone = api.translate(sentences)
    assert row.text == f"{alone[0]} {alone[1]}\n\n{alone[2]}\n    {alone[3]}"
    assert (row.status, row.reason) == ("split", "4 sentences")
    assert row.nbest == ((row.text, row.score),)
    whole = Translator.load(str(demo_model_dir), threads=1, split_sentences=False).translate_rows([text])[0]
    assert whole.status == "normalised" and "\n" not in whole.text  # off: one sequence, as before


def test_one_sentence_rows_are_unchanged_by_the_splitter(demo_model_dir, api):
    off = Translator.load(str(demo_model_dir), threads=1, split_sentences=False)
    assert api.translate(SENTENCES[:12]) == off.translate(SENTENCES[:12])
    assert {r.status for r in api.translate_rows(SENTENCES[:12])} == {"ok"}


def test_the_job_the_api_and_the_operator_give_the_same_rows(demo_model_dir, api, tmp_path, one_thread):
    texts = paragraphs(9) + [SENTENCES[0], "", None]
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(len(texts))], "text": pa.array(texts, pa.string())}), src)
    main(["--model", str(demo_model_dir), "--input", str(src), "--output", str(tmp_path / "out"), "--threads", "1",
          "--in-process", "--unit-rows", "5"])
    job = OutputStore(str(tmp_path / "out")).read().sort_by("row").to_pylist()
    rows = api.translate_rows(texts)
    assert [r["translation"] for r in job] == [r.text for r in rows]
    assert [r["status"] for r in job] == [r.status for r in rows]
    assert [r["reason"] for r in job] == [r.reason for r in rows]
    assert [r["status"] for r in job][:9] == ["split"] * 9
    operator = Translate(str(demo_model_dir), threads=1)
    out = operator(pa.table({"text": pa.array(texts, pa.string())}))
    assert out.column("translation").to_pylist() == [r.text for r in rows]
    assert "\n\n" in job[2]["translation"] and "\n" in job[1]["translation"]


def test_a_resume_in_the_middle_of_split_rows_writes_each_row_once(demo_model_dir, tmp_path):
    texts = paragraphs(24)
    src, out, gate = tmp_path / "in.jsonl", tmp_path / "out", tmp_path / "gate"
    src.write_text("".join(json.dumps({"id": f"p{i:02d}", "text": t}, ensure_ascii=False) + "\n"
                           for i, t in enumerate(texts)))
    args = ["--model", str(demo_model_dir), "--input", str(src), "--output", str(out), "--threads", "1",
            "--in-process", "--unit-rows", "4", "--beam-size", "2"]
    gate.touch()
    proc = subprocess.Popen([sys.executable, "-m", "raymt.jobs.translate", *args], cwd=ROOT,
                            env={**os.environ, **gate_env(AFTER_COMMIT, gate)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "_PLAN.json").exists() or not OutputStore(str(out)).committed():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # held after its first unit: interrupted in the middle
    assert proc.wait(timeout=60) == 1
    assert len(OutputStore(str(out)).committed()) < 6
    main(args)
    table = assert_exactly_once(str(out), [f"p{i:02d}" for i in range(24)])
    fresh = tmp_path / "fresh"
    main([*args[:5], str(fresh), *args[6:]])
    assert table.sort_by("row").column("translation").to_pylist() == \
        OutputStore(str(fresh)).read().sort_by("row").column("translation").to_pylist()


@pytest.mark.skipif(not (SHARED_DATA / "wmt22").exists(), reason=f"needs {SHARED_DATA / 'wmt22'}")
def test_wmt22_lines_the_splitter_cuts_are_few_and_named(api):
    from raymt.workers.text.sentences import split_sentences
    lines = (SHARED_DATA / "wmt22" / "generaltest2022.de-en.src.de").read_text().splitlines()
    cut = [x for x in lines if len(split_sentences(x, "de").texts) > 1]
    assert len(cut) <= 3, cut  # lines that hold two sentences; every other line is decoded as before
