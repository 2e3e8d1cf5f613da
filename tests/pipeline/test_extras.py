"""A missing optional package is named in one line with the extra that installs it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from raymt.pipeline.extras import MissingExtra, require, require_for_url
from tests.conftest import ROOT

# Runs a command as a user would, with the named packages absent (sys.modules[name] = None makes
# every import of them fail, as on a machine without them).
WITHOUT = "import sys, runpy; [sys.modules.__setitem__(m, None) for m in {missing!r}]; " \
          "sys.argv = {argv!r}; runpy.run_module({module!r}, run_name='__main__')"


def run_without(missing: list[str], module: str, *args: str) -> subprocess.CompletedProcess:
    code = WITHOUT.format(missing=missing, argv=[module, *args], module=module)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_require_returns_the_module_when_installed():
    assert require("json", "test", "reading JSON").dumps([1]) == "[1]"


def test_require_names_the_extra_when_missing():
    with pytest.raises(MissingExtra) as err:
        require("raymt_absent_package.sub", "s3", "reading s3://")
    assert str(err.value) == "reading s3:// needs raymt_absent_package: pip install 'raymt[s3]'"
    assert isinstance(err.value, ImportError)


@pytest.mark.parametrize("url", ["/data/in.txt", "in.txt", "file:///data/in.txt", "memory://x/y"])
def test_local_and_builtin_schemes_need_no_extra(url, monkeypatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)
    require_for_url(url)


@pytest.mark.parametrize("url", ["s3://bucket/corpus/", "S3://bucket/x.txt", "s3a://bucket/x"])
def test_s3_urls_need_s3fs(url, monkeypatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)
    with pytest.raises(MissingExtra, match=r"needs s3fs: pip install 'raymt\[s3\]'"):
        require_for_url(url)


def test_translate_to_s3_without_s3fs_is_one_line(demo_model_dir):
    done = run_without(["s3fs"], "raymt.jobs.translate", "--model", str(demo_model_dir),
                       "--input", "examples/sample.de.txt", "--output", "s3://bucket/out/")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1:] == ["error: reading s3:// needs s3fs: pip install 'raymt[s3]'"]
    assert "Traceback" not in done.stderr


def test_build_shortlist_without_eflomal_is_one_line(demo_model_dir, tmp_path):
    done = run_without(["eflomal"], "raymt.jobs.build_shortlist", "--model", str(demo_model_dir),
                       "--source", "examples/sample.de.txt", "--target", "examples/sample.de.txt",
                       "--output", str(tmp_path / "lex.s2t"))
    assert done.returncode == 1
    assert done.stderr.strip() == "error: aligning a bitext needs eflomal: pip install 'raymt[align]'"
    assert not (tmp_path / "lex.s2t").exists()


def test_translate_report_without_matplotlib_stops_before_the_job(demo_model_dir, tmp_path):
    out = tmp_path / "out"
    done = run_without(["matplotlib"], "raymt.jobs.translate", "--model", str(demo_model_dir),
                       "--input", "examples/sample.de.txt", "--output", str(out), "--report")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == \
        "error: the stats report (--report) needs matplotlib: pip install 'raymt[plots]'"
    assert not out.exists()


def test_report_without_matplotlib_is_one_line(tmp_path):
    done = run_without(["matplotlib"], "raymt.jobs.report", str(tmp_path / "out"))
    assert done.returncode == 1
    assert done.stderr.strip() == "error: the stats report needs matplotlib: pip install 'raymt[plots]'"
