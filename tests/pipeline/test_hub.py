"""Hugging Face hub ids as models, offline from a hub cache laid out as huggingface_hub lays it out
(``tests/pipeline/hub_cache.py``): which arguments are ids, the cache's revisions, the command line
in a subprocess, the Python API, a resumed job keeping its recorded commit, the offline-missing line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import raymt
from raymt.jobs.translate import main
from raymt.pipeline.digests import file_digest
from raymt.pipeline.hub import ALLOW_PATTERNS, HubError, HubId, ResolvedModel, hub_id, resolve_model
from raymt.pipeline.outputs.ledger import MODEL_FILES
from raymt.pipeline.outputs.sink import OutputStore
from raymt.workers.config import SearchConfig
from tests.conftest import ROOT
from tests.pipeline.hub_cache import REPO, HubCache, build_cache, go_offline

SAMPLE = ROOT / "examples" / "sample.de.txt"
LINES = SAMPLE.read_text(encoding="utf-8").splitlines()
SEARCH = SearchConfig(beam_size=2)


@pytest.fixture
def hub(tmp_path, demo_model_dir, monkeypatch) -> HubCache:
    """A hub cache of ``org/name`` (revisions A = main, B), offline: nothing is requested from the hub."""
    cache = build_cache(tmp_path / "hf-cache", demo_model_dir)
    go_offline(monkeypatch, cache.root)
    return cache


def test_which_arguments_are_hub_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub_id("Helsinki-NLP/opus-mt-de-en") == HubId("Helsinki-NLP/opus-mt-de-en")
    assert hub_id("facebook/nllb-200-distilled-600M@main") == HubId("facebook/nllb-200-distilled-600M", "main")
    assert hub_id("org/name@refs/pr/1") == HubId("org/name", "refs/pr/1")
    for other in ("s3://bucket/model", "hf://org/name", "/abs/org/name", "./org/name", "org/name/sub", "name",
                  "org/name@", "org/name@a b"):
        assert hub_id(other) is None, other
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert hub_id("org/name") is None, "a path that exists wins over the id"
    assert resolve_model("org/name") == ResolvedModel("org/name")
    assert ResolvedModel("org/name").ref == "./org/name", "a relative path shaped like an id is never read as one"


def test_the_patterns_fetch_every_file_a_plan_records():
    from fnmatch import fnmatch
    assert all(any(fnmatch(name, p) for p in ALLOW_PATTERNS) for name in MODEL_FILES)


def test_an_id_resolves_to_main_or_the_named_revision_offline(hub: HubCache):
    model = resolve_model(REPO)
    assert (model.path, model.repo_id, model.commit) == (str(hub.snapshot(hub.a)), REPO, hub.a)
    assert (model.ref, model.url) == (f"{REPO}@{hub.a}", f"hf://{REPO}@{hub.a}")
    assert resolve_model(f"{REPO}@{hub.b}").path == str(hub.snapshot(hub.b))
    assert resolve_model(REPO, recorded=[f"hf://{REPO}@{hub.b}/config.json"]).commit == hub.b
    assert resolve_model(f"{REPO}@{hub.a}", recorded=[f"hf://{REPO}@{hub.b}/config.json"]).commit == hub.a
    hub.move_main(hub.b)
    assert resolve_model(REPO).commit == hub.b


def test_an_id_missing_from_the_cache_offline_is_one_line_naming_it_and_the_cache(hub: HubCache):
    with pytest.raises(HubError) as err:
        resolve_model("org/missing")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("model org/missing: no such directory here, and the Hugging Face hub cache "
                              f"{hub.root} holds no complete copy of org/missing (HF_HUB_OFFLINE is set)")
    with pytest.raises(HubError, match=f"holds no complete copy of {REPO} at v9"):
        resolve_model(f"{REPO}@v9")


def test_the_api_loads_a_hub_id(hub: HubCache, demo_model_dir, one_thread):
    from_hub = raymt.Translator.load(REPO, search=SEARCH)
    assert from_hub.translate(LINES[:4]) == raymt.Translator.load(str(demo_model_dir), search=SEARCH).translate(LINES[:4])
    at_b = raymt.Translator.load(f"{REPO}@{hub.b}", search=SEARCH)
    assert at_b.translate(LINES[:2]) == from_hub.translate(LINES[:2])  # (B: the same model, other vocab.json bytes)
    with pytest.raises(HubError, match="org/missing"):
        raymt.Translator.load("org/missing")


def run_cli(hub_root, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_JOB_ID")}
    env.update(HF_HUB_CACHE=str(hub_root), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "raymt.jobs.translate", "--in-process", "--threads", "1", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_cli_translates_a_hub_id_offline_and_records_its_commit(hub: HubCache, demo_model_dir, tmp_path):
    out = tmp_path / "out.en.txt"
    done = run_cli(hub.root, "--model", REPO, "--input", str(SAMPLE), "--output", str(out), "--beam-size", "2")
    assert done.returncode == 0, done.stderr
    assert f"[model:{REPO}|" in done.stdout
    from_dir = raymt.Translator.load(str(demo_model_dir), search=SEARCH).translate(LINES)
    assert out.read_text(encoding="utf-8").splitlines() == from_dir
    plan = json.loads((tmp_path / "out.en.txt.parts" / "_PLAN.json").read_text())
    recorded = {f["path"]: f for f in plan["model"]}
    assert set(recorded) == {f"hf://{REPO}@{hub.a}/{name}" for name in MODEL_FILES
                             if (hub.snapshot(hub.a) / name).exists()}
    config = recorded[f"hf://{REPO}@{hub.a}/model.safetensors"]
    assert config["version"] == hub.a and config["sha256"] == file_digest(str(demo_model_dir / "model.safetensors"))


def test_the_cli_names_an_id_missing_offline_in_one_line(hub: HubCache, tmp_path):
    done = run_cli(hub.root, "--model", "org/missing", "--input", str(SAMPLE), "--output", str(tmp_path / "o.txt"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"error: model org/missing: no such directory here, and the Hugging Face hub cache {hub.root} holds no "
        "complete copy of org/missing (HF_HUB_OFFLINE is set)"), done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "o.txt.parts").exists()


def test_a_resume_keeps_the_recorded_commit_after_main_moved(hub: HubCache, tmp_path, capsys):
    out = tmp_path / "out"
    job = ["--in-process", "--threads", "1", "--beam-size", "2", "--input", str(SAMPLE), "--output", f"{out}/"]
    main(["--model", REPO, *job])
    first = OutputStore(str(out)).read_plan()
    capsys.readouterr()
    assert {f["path"].split("/")[3] for f in first.model} == {f"name@{hub.a}"}
    hub.move_main(hub.b)
    main(["--model", REPO, *job])  # the same command: resumed at A, though main is B now
    assert OutputStore(str(out)).read_plan() == first
    assert "(1 already committed)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as err:  # B named: another model for this output, refused
        main(["--model", f"{REPO}@{hub.b}", *job])
    assert f"model files in hf://{REPO}@{hub.a} then, in hf://{REPO}@{hub.b} now" in str(err.value)
