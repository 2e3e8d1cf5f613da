"""Smoke run of the corpus-scale bench: a text corpus planned and read by unit, parts assembled."""
from __future__ import annotations

from tests.conftest import shared_path


def test_corpus_scale_bench_smoke(capsys) -> None:
    shared_path("wmt22", "generaltest2022.de-en.src.de")
    from benchmarks.bench_corpus_scale import main
    got = main(["--lines", "30000", "--parts", "4", "--rows", "250"])
    assert got["rows"] == 30000 and got["units"] == 12 and got["assembled"] == 1000
    assert got["read_mb"] < 1.0  # one unit's bytes, not the file's
    assert "one unit read" in capsys.readouterr().out
