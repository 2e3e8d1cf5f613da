"""The soak benchmark: its curve and verdict from samples, a smoke run on Ray, and the full soak (slow)."""
from __future__ import annotations

import csv

import pytest

from benchmarks.bench_soak import Sample, build_corpus, committed_rows, curve, job_argv, main, verdicts


def samples(*points: tuple[int, float, float]) -> list[Sample]:
    return [Sample(float(i), rows, {"pid 1": a, "pid 2": b}) for i, (rows, a, b) in enumerate(points)]


def test_the_curve_keeps_each_decoders_highest_rss_per_tenth():
    got = curve(samples((0, 300, 310), (50, 500, 505), (50, 520, 500), (990, 530, 540)), total=1000)
    assert [r["rows done"] for r in got] == ["0-10%", "90-100%"]
    assert got[0]["pid 1 MB"] == 520 and got[0]["pid 2 MB"] == 505 and got[1]["up to row"] == 990


def test_the_verdict_compares_the_first_tenth_after_the_warm_up_with_the_last():
    flat = samples((0, 900, 900), (250, 500, 600), (500, 510, 605), (950, 520, 610))
    assert [(v.warm_mb, v.end_mb, v.flat) for v in verdicts(flat, 1000)] == [(500, 520, True), (600, 610, True)]
    growing = samples((250, 500, 600), (950, 560, 610))
    assert [v.flat for v in verdicts(growing, 1000)] == [False, True]  # +12% and +1.7%
    assert verdicts(samples((100, 500, 500)), 1000) == []  # nothing after the warm-up: no verdict


def test_corpus_markers_and_the_job_line(tmp_path):
    corpus = build_corpus(tmp_path / "c.de", 70)
    assert len(corpus.read_text().splitlines()) == 70
    (tmp_path / "_manifest").mkdir()
    (tmp_path / "_manifest" / "a.json").write_text('{"rows": 30}')
    seen: dict[str, int] = {}
    assert committed_rows(tmp_path / "_manifest", seen) == 30 and seen == {"a.json": 30}
    args = type("A", (), {"model": "m", "decoders": 2, "threads": 1, "beam_size": 2, "unit_rows": 2500,
                          "progress_every": 30.0, "in_process": False})()
    assert job_argv(args, corpus, tmp_path / "out")[-2:] == ["--local-rows", "0"]  # never the in-process route


def test_soak_smoke_on_ray(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "soak.csv"
    got = main(["--model", str(demo_model_dir), "--lines", "600", "--unit-rows", "100", "--every-s", "0.25",
                "--beam-size", "1", "--csv", str(out)])
    assert got["where"] == "ray" and got["curve"] and got["samples"]
    decoders = {d for s in got["samples"] for d in s.rss_mb}
    assert len(decoders) == 2 and all(s.rss_mb[d] > 50 for s in got["samples"] for d in s.rss_mb)
    rows = list(csv.DictReader(out.open()))
    assert rows and {r["decoder"] for r in rows} == decoders
    assert "verdict:" in capsys.readouterr().out


@pytest.mark.slow
def test_soak_50000_lines_decoder_rss_flat_after_warm_up(demo_model_dir, tmp_path):
    got = main(["--model", str(demo_model_dir), "--csv", str(tmp_path / "soak.csv")])
    assert got["verdicts"] and got["flat"], got["verdicts"]
