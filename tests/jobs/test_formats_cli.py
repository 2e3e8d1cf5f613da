"""Every corpus format round-trips through the translate command (in this process, the decoder
actors' code): compressed text in and out, JSON lines in and out, TSV in, standard input and
output, the input's other columns kept, Marian n-best text, and refused output names."""
from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from raymt.jobs.translate import main
from raymt.pipeline.writers import read_marian_nbest
from tests.conftest import ROOT

LINES = (ROOT / "examples" / "sample.de.txt").read_text(encoding="utf-8").splitlines()[:4]
TEXT = ("\n".join(LINES) + "\n").encode()


def translate(model, src, out, *flags: str) -> None:
    main(["--in-process", "--threads", "1", "--model", str(model), "--input", str(src), "--output", str(out),
          "--beam-size", "2", *flags])


@pytest.fixture(scope="module")
def reference(demo_model_dir, tmp_path_factory) -> list[str]:
    """The plain text job's translations of ``LINES``, one a line."""
    tmp = tmp_path_factory.mktemp("reference")
    (tmp / "in.txt").write_bytes(TEXT)
    translate(demo_model_dir, tmp / "in.txt", tmp / "out.txt")
    return (tmp / "out.txt").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("suffix, out_suffix, compress, decompress", [
    ("gz", "gz", gzip.compress, gzip.decompress),
    ("zst", "zst", lambda d: zstandard.ZstdCompressor().compress(d),
     lambda d: zstandard.ZstdDecompressor().decompress(d, max_output_size=1 << 20)),
    ("bz2", "txt", bz2.compress, None),
    ("xz", "txt", lzma.compress, None),
])
def test_compressed_text_in_and_out_translates_as_plain_text(demo_model_dir, tmp_path, reference, suffix, out_suffix,
                                                             compress, decompress):
    (tmp_path / f"in.de.{suffix}").write_bytes(compress(TEXT))
    out = tmp_path / f"out.en.{out_suffix}"
    translate(demo_model_dir, tmp_path / f"in.de.{suffix}", out, "--unit-rows", "3")  # units are line ranges
    data = out.read_bytes()
    assert (decompress(data) if decompress else data).decode().splitlines() == reference


def test_jsonl_in_and_out_with_bad_rows_and_nbest(demo_model_dir, tmp_path, reference):
    rows = [{"id": "a", "text": LINES[0], "lang": "de"}, "{not json", {"text": 7}, {"src": "x"}, {"text": LINES[1]}]
    (tmp_path / "in.jsonl").write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    translate(demo_model_dir, tmp_path / "in.jsonl", tmp_path / "out.jsonl.gz", "--nbest", "2")
    got = [json.loads(line) for line in gzip.decompress((tmp_path / "out.jsonl.gz").read_bytes()).splitlines()]
    assert len(got) == 5 and [g["status"] for g in got] == ["ok", "invalid", "invalid", "invalid", "ok"]
    assert {k: got[0][k] for k in ("id", "text", "lang", "translation")} == {"id": "a", "text": LINES[0], "lang": "de",
                                                                             "translation": reference[0]}
    assert got[4]["translation"] == reference[1] and len(got[4]["nbest"]) == 2
    assert got[4]["nbest"][0] == {"text": got[4]["translation"], "score": got[4]["score"]}
    assert "invalid JSON" in got[1]["reason"] and "JSON int" in got[2]["reason"] and "no field 'text'" in got[3]["reason"]
    assert got[3]["src"] == "x"  # the other fields of a row without its text still pass through


def test_tsv_in_translates_the_chosen_column_and_marks_short_rows(demo_model_dir, tmp_path, reference):
    (tmp_path / "in.tsv.gz").write_bytes(gzip.compress(
        "".join(f"{i}\t{line}\tgold\n" for i, line in enumerate(LINES)).encode() + b"only one column\n"))
    translate(demo_model_dir, tmp_path / "in.tsv.gz", tmp_path / "out.parquet", "--column", "2")
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["translation"] for r in table[:4]] == reference and table[4]["status"] == "invalid"
    assert table[4]["reason"] == "1 tab-separated column(s), the text is asked from column 2"


def test_jsonl_ids_stay_unique_and_an_overlong_row_is_not_decoded(demo_model_dir, tmp_path, reference, capsys):
    """Ids "0", "1", "2" and rows without their own (not parsable, no id field): every output id is
    distinct. A row over --max-row-chars is an empty translation with status too_long and its length."""
    rows = [{"id": "0", "text": LINES[0]}, "{kaputt", {"id": "2", "text": "Ein Satz. " * 30}, {"text": LINES[1]},
            {"id": "1", "text": LINES[2]}]
    (tmp_path / "in.jsonl").write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    translate(demo_model_dir, tmp_path / "in.jsonl", tmp_path / "out.jsonl", "--max-row-chars", "200")
    got = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [g["id"] for g in got] == ["0", "row:1", "2", "row:3", "1"]  # before: "1" twice, "3"
    assert [g["status"] for g in got] == ["ok", "invalid", "too_long", "ok", "ok"]
    assert got[2]["translation"] == "" and got[2]["reason"] == "300 characters, more than --max-row-chars 200"
    assert [got[k]["translation"] for k in (0, 3, 4)] == reference[:3]
    assert "too_long 1" in capsys.readouterr().out  # the summary's rows by status
    # another limit decodes other rows: resuming with it is refused
    with pytest.raises(SystemExit, match=r"(?s)error: .*started by another plan.*max-row-chars:200"):
        translate(demo_model_dir, tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    with pytest.raises(SystemExit) as refused:
        translate(demo_model_dir, tmp_path / "in.jsonl", tmp_path / "other.jsonl", "--max-row-chars", "-1")
    assert refused.value.code == 2 and "max_row_chars must be >= 0" in capsys.readouterr().err


def test_csv_in_reads_the_header_s_columns_and_passes_the_others(demo_model_dir, tmp_path, reference):
    """A compressed CSV: the header names the columns (never translated as a sentence), a quoted
    field holds a comma and a newline, the id column gives ids and the other columns pass through."""
    texts = [f'"{line}"' for line in LINES]
    texts[1] = '"Zwei Kinder spielen\nim Sand, am Strand."'  # a comma and a newline inside one field
    data = "key,text,domain\n" + "".join(f"k{i},{t},d{i}\n" for i, t in enumerate(texts))
    (tmp_path / "in.csv.gz").write_bytes(gzip.compress(data.encode()))
    translate(demo_model_dir, tmp_path / "in.csv.gz", tmp_path / "out.parquet", "--id-column", "key",
              "--unit-rows", "3")
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["id"] for r in table] == ["k0", "k1", "k2", "k3"]
    assert [r["domain"] for r in table] == ["d0", "d1", "d2", "d3"]
    assert [r["translation"] for r in table[::2]] == reference[::2] and table[3]["translation"] == reference[3]
    assert table[1]["source"] == "Zwei Kinder spielen\nim Sand, am Strand."  # the field as written
    assert table[1]["status"] == "normalised" and table[1]["translation"]  # its newlines made spaces, translated
    with pytest.raises(SystemExit, match=r"error: .*in.csv.gz: no text column 'src'; columns found: \['key', 'text', "
                                         r"'domain'\]"):
        translate(demo_model_dir, tmp_path / "in.csv.gz", tmp_path / "other.parquet", "--text-column", "src")
    assert not (tmp_path / "other.parquet.parts").exists()


def test_parquet_output_keeps_the_input_columns_unless_told_not_to(demo_model_dir, tmp_path, reference):
    pq.write_table(pa.table({"id": [1, 2], "text": LINES[:2], "domain": ["news", "web"], "score": [0.5, 0.9],
                             "meta": [{"k": 1}, {"k": 2}]}), tmp_path / "in.parquet", row_group_size=1)
    translate(demo_model_dir, tmp_path / "in.parquet", tmp_path / "out.parquet", "--unit-rows", "1")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("domain").to_pylist() == ["news", "web"] and table.column("meta").to_pylist()[1] == {"k": 2}
    assert table.column("input_score").to_pylist() == [0.5, 0.9]  # renamed: the output has its own score
    assert table.column("translation").to_pylist() == reference[:2]
    translate(demo_model_dir, tmp_path / "in.parquet", tmp_path / "out.jsonl")
    first = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert (first["domain"], first["meta"], first["input_score"], first["id"]) == ("news", {"k": 1}, 0.5, "1")
    translate(demo_model_dir, tmp_path / "in.parquet", tmp_path / "slim.parquet", "--no-passthrough")
    assert "domain" not in pq.read_table(tmp_path / "slim.parquet").column_names


def test_nbest_text_is_marian_nbest_with_input_sentence_indices(demo_model_dir, tmp_path):
    rows = [LINES[0], "", "{bad", LINES[2], LINES[3]]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" if r != "{bad" else r + "\n"
                                               for r in rows))
    translate(demo_model_dir, tmp_path / "in.jsonl", tmp_path / "out.nbest", "--beam-size", "3", "--nbest", "3",
              "--unit-rows", "2")
    got = read_marian_nbest((tmp_path / "out.nbest").read_text(encoding="utf-8"))
    indices = [k for k, _, _ in got]
    assert indices == sorted(indices) and set(indices) == set(range(len(rows)))  # every sentence, in order
    per = {k: [(h, s) for j, h, s in got if j == k] for k in range(len(rows))}
    assert [len(per[k]) for k in range(len(rows))] == [3, 1, 1, 3, 3]  # no hypothesis: one empty line
    assert per[1] == [("", 0.0)] and per[2] == [("", 0.0)]
    assert all([s for _, s in per[k]] == sorted((s for _, s in per[k]), reverse=True) for k in (0, 3, 4))


def test_an_output_format_the_job_cannot_write_is_refused_before_any_work(demo_model_dir, tmp_path):
    (tmp_path / "in.txt").write_bytes(TEXT)
    for name in ("out.csv", "out.xlsx", "out.json"):
        with pytest.raises(SystemExit, match=r"error: --output .*cannot be written; supported outputs: "):
            translate(demo_model_dir, tmp_path / "in.txt", tmp_path / name)
        assert not (tmp_path / f"{name}.parts").exists() and not (tmp_path / name).exists()


def test_stdin_to_stdout_translates_as_the_job_does(demo_model_dir, reference):
    out = subprocess.run([sys.executable, "-m", "raymt.jobs.translate", "--threads", "1", "--model",
                          str(demo_model_dir), "--input", "-", "--output", "-", "--beam-size", "2"],
                         input=TEXT, capture_output=True, check=True, cwd=ROOT, timeout=300)
    assert out.stdout.decode().splitlines() == reference  # translations only: logs and summary on stderr
    assert b"translated 4 rows (ok 4) from - to -" in out.stderr


def test_on_ray_the_input_columns_flow_through_and_stdin_translates_alike(demo_model_dir, tmp_path, reference):
    """A Ray job (local cluster, two units on one decoder actor): the other columns are read again at
    commit and reach the assembled Parquet; its translations are the stream's and the in-process job's."""
    pq.write_table(pa.table({"text": LINES, "domain": ["a", "b", "c", "d"]}), tmp_path / "in.parquet", row_group_size=2)
    job = subprocess.run([sys.executable, "-m", "raymt.jobs.translate", "--model", str(demo_model_dir), "--input",
                          str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out.parquet"), "--beam-size", "2",
                          "--unit-rows", "2", "--local-rows", "0", "--decoders", "1", "--threads", "1"],
                         check=True, capture_output=True, cwd=ROOT, timeout=400, env={**os.environ, "RAY_ADDRESS": ""})
    assert b"in 2 units" in job.stdout and b", ray (" in job.stdout  # decoded by a Ray actor, not in this process
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("translation").to_pylist() == reference
    assert table.column("domain").to_pylist() == ["a", "b", "c", "d"]


def test_on_ray_a_csv_input_and_an_overlong_row(demo_model_dir, tmp_path, reference):
    """A Ray job (three units, the encoder pool tokenising ahead of one decoder actor): CSV records
    with a quoted newline, and a row over the default --max-row-chars (20,000) left undecoded."""
    long = "Ein Hund rennt. " * 1251  # 20,016 characters
    texts = [LINES[0], long, LINES[1], LINES[2], LINES[3]]
    data = "text,n\n" + "".join(f'"{t}",{i}\n' for i, t in enumerate(texts))
    (tmp_path / "in.csv").write_text(data.replace("Zwei Kinder", "Zwei\nKinder"))
    job = subprocess.run([sys.executable, "-m", "raymt.jobs.translate", "--model", str(demo_model_dir), "--input",
                          str(tmp_path / "in.csv"), "--output", str(tmp_path / "out.parquet"), "--beam-size", "2",
                          "--unit-rows", "2", "--local-rows", "0", "--decoders", "1", "--threads", "1"],
                         capture_output=True, cwd=ROOT, timeout=400, env={**os.environ, "RAY_ADDRESS": ""})
    assert job.returncode == 0, job.stderr.decode()[-3000:]
    assert b"in 3 units" in job.stdout and b", ray (" in job.stdout
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["id"] for r in table] == [r["n"] for r in table] == ["0", "1", "2", "3", "4"]  # "n": as written
    assert table[1]["status"] == "too_long" and table[1]["translation"] == ""
    assert table[1]["reason"] == f"{len(long)} characters, more than --max-row-chars 20000"
    assert [r["translation"] for r in (table[0], *table[2:])] == reference  # "Zwei\nKinder": the newline a space
    assert [r["status"] for r in table] == ["ok", "too_long", "normalised", "ok", "ok"]


def test_a_stream_from_a_file_to_standard_output_and_from_standard_input_to_a_file(demo_model_dir, tmp_path,
                                                                                      reference):
    """``translate_stream`` (what ``-`` runs): n-best lines numbered across batches, and a compressed file written."""
    import io

    from raymt.jobs.translate import build_parser, decode_config, decoder_settings
    from raymt.pipeline.orchestration.stream import translate_stream
    from raymt.pipeline.orchestration.units import Columns

    (tmp_path / "in.txt.bz2").write_bytes(bz2.compress(TEXT))
    args = build_parser().parse_args(["--model", str(demo_model_dir), "--input", str(tmp_path / "in.txt.bz2"),
                                      "--output", "-", "--beam-size", "2", "--nbest", "2", "--threads", "1"])
    settings = decoder_settings(args, decode_config(args), one_file=False)
    stdout = io.BytesIO()
    result = translate_stream(str(tmp_path / "in.txt.bz2"), "-", settings, Columns(), stdin=io.BytesIO(),
                              stdout=stdout, batch_rows=3)
    got = read_marian_nbest(stdout.getvalue().decode())
    assert result.rows == 4 and [k for k, _, _ in got] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [h for k, h, _ in got[::2]] == reference  # each sentence's best first
    args = build_parser().parse_args(["--model", str(demo_model_dir), "--input", "-", "--output", "o.gz",
                                      "--beam-size", "2", "--threads", "1"])
    settings = decoder_settings(args, decode_config(args), one_file=False)
    translate_stream("-", str(tmp_path / "out.en.gz"), settings, Columns(), stdin=io.BytesIO(TEXT), stdout=io.BytesIO())
    assert gzip.decompress((tmp_path / "out.en.gz").read_bytes()).decode().splitlines() == reference
