"""Fault injection on a real local Ray cluster, as an operator or the OOM killer would do it: decoder
actors SIGKILLed mid-unit, between units, while loading the model and twice in one job, the encoder
actor killed once; every id must come out exactly once and the job must end by itself. And the
resume guards: a rerun with another --unit-rows, model or beam is refused (never mixed), a second
job on the same output is refused while the first runs, mixed id types and empty inputs complete.

``RAYMT_KILL_ROUNDS=10 python -m pytest tests/pipeline/test_faults.py -k kill`` repeats the kill test.
"""
from __future__ import annotations

import json
import re
import os
import shutil
import signal
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymt.jobs.translate import main
from raymt.pipeline.outputs.sink import OutputStore
from tests.hold_gates import AFTER_COMMIT, BEFORE_ENCODE, gate_env
from tests.pipeline.conftest import free_port
from tests.pipeline.ray_helpers import (
    assert_exactly_once,
    clean_corpus,
    spawn_driver,
    start_ray,
    wait_for_commits,
    write_corpus,
)

ROUNDS = int(os.environ.get("RAYMT_KILL_ROUNDS", "1"))
LEASE_FILES = ("_LEASE.json", "_LEASE.lock")  # (the lock records its holder: a refused writer takes it too)


METRICS_PORT = free_port()


@pytest.fixture(scope="module")
def cluster():
    import ray
    address = start_ray(num_cpus=2, _metrics_export_port=METRICS_PORT,
                        _system_config={"metrics_report_interval_ms": 500})
    yield address
    ray.shutdown()


def ray_processes(title: str, besides: frozenset[int] = frozenset()) -> set[int]:
    """Pids of this machine's Ray worker processes whose title starts with ``ray::<title>``, less
    ``besides``: an earlier test's actor can outlive its job for a while, and signalling it tests nothing."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(f"ray::{title}".encode()):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found - besides


def kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def committed(out: Path) -> int:
    return len(OutputStore(str(out)).committed()) if (out / "_PLAN.json").exists() else 0


def wait_until(condition, proc, timeout: float = 180, what: str = "") -> object:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := condition():
            return value
        assert proc.poll() is None, f"the driver ended while waiting for {what}"
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_decoder_and_encoder_killed_repeatedly_lose_and_duplicate_nothing(cluster, demo_model_dir, tmp_path, round_):
    n = 800
    src = write_corpus(tmp_path / "in.parquet", clean_corpus(n))
    out = tmp_path / "out"
    args = ["--model", str(demo_model_dir), "--input", str(src), "--output", str(out), "--beam-size", "3",
            "--threads", "1", "--unit-rows", "40", "--decoders", "1"]
    stale = frozenset(ray_processes("MapWorker") | ray_processes("DecoderActor"))
    proc = spawn_driver(cluster, args, tmp_path / "driver.log")
    log = lambda: (tmp_path / "driver.log").read_text(errors="replace")  # noqa: E731
    try:
        encoder = wait_until(lambda: ray_processes("MapWorker", stale), proc, what="the encoder actor")
        first = wait_until(lambda: ray_processes("DecoderActor", stale), proc, what="the first decoder")
        wait_until(lambda: committed(out) >= 1, proc, what="a first commit")
        kills = {"encoder": sum(kill(p) for p in encoder)}  # the encoder once, early in the stream
        for p in first:  # mid-unit: the next unit is in the actor's hands at once
            kill(p)
        # while it loads the model: the restarted decoder's new process, as soon as it appears
        second = wait_until(lambda: ray_processes("DecoderActor", stale) - first, proc, what="the restarted decoder")
        kills["during model load"] = sum(kill(p) for p in second)
        # between units: right after a commit of the (twice) restarted decoder
        before = committed(out)
        wait_until(lambda: committed(out) > before, proc, timeout=240, what="a commit after the restarts")
        third = ray_processes("DecoderActor", stale) - first - second
        kills["between units"] = sum(kill(p) for p in third)
        assert proc.wait(timeout=400) == 0, log()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert kills["during model load"] and kills["between units"], kills
    assert_exactly_once(str(out), [f"r{i:04d}" for i in range(n)])
    assert "died" in log()


def job(model, inp, out, *extra) -> list[str]:
    return ["--model", str(model), "--input", str(inp), "--output", str(out), "--beam-size", "1", "--threads", "1",
            *extra]  # later --beam-size wins


def test_resume_keeps_its_unit_rows_and_other_unit_rows_are_refused(cluster, demo_model_dir, tmp_path, capsys):
    src = write_corpus(tmp_path / "in.parquet", clean_corpus(400))
    out = tmp_path / "out"
    proc = spawn_driver(cluster, job(demo_model_dir, src, out, "--unit-rows", "20", "--beam-size", "4"),
                        tmp_path / "driver.log")
    wait_for_commits(str(out), 1, proc)
    proc.send_signal(signal.SIGKILL)  # a killed run whose first unit(s) committed
    proc.wait(timeout=60)
    with pytest.raises(SystemExit, match=r"started by another plan(.|\n)*--unit-rows 20 then, 2500 now"):
        main(job(demo_model_dir, src, out, "--beam-size", "4", "--unit-rows", "2500"))
    assert not (out / "_SUCCESS").exists()
    main(job(demo_model_dir, src, out, "--beam-size", "4"))  # --unit-rows left out: the output's plan's 20
    assert_exactly_once(str(out), [f"r{i:04d}" for i in range(400)])
    assert len(list(out.glob("part-*.parquet"))) == 20
    main(job(demo_model_dir, src, out, "--beam-size", "4", "--restart"))  # explicit: a fresh output, default units
    assert_exactly_once(str(out), [f"r{i:04d}" for i in range(400)])
    assert json.loads((out / "_SUCCESS").read_text())["rows"] == 400
    units = json.loads((out / "_PLAN.json").read_text())["units"]  # default units: one per decoder here
    assert units < 20 and len(list(out.glob("part-*.parquet"))) == units  # the killed run's parts are gone


def test_rerun_with_another_model_or_beam_is_refused(cluster, demo_model_dir, tmp_path):
    src = write_corpus(tmp_path / "in.parquet", clean_corpus(30))
    out = tmp_path / "out"
    main(job(demo_model_dir, src, out, "--unit-rows", "10"))
    signature = json.loads((out / "_SUCCESS").read_text())["signature"]
    other = tmp_path / "other-model"
    shutil.copytree(demo_model_dir, other)
    with pytest.raises(SystemExit, match=r"search signature .*beam:1.* then, .*beam:5.* now(.|\n)*--restart"):
        main(job(other, src, out, "--unit-rows", "10", "--beam-size", "5"))
    with pytest.raises(SystemExit, match=r"model files in .*demo-de-en then, in .*other-model now"):
        main(job(other, src, out, "--unit-rows", "10"))  # the same files elsewhere: another model all the same
    assert json.loads((out / "_SUCCESS").read_text())["signature"] == signature  # untouched
    time.sleep(0.01)
    src.write_bytes(src.read_bytes())  # the input rewritten (new mtime): refused too
    with pytest.raises(SystemExit, match=r"input .*in.parquet changed"):
        main(job(demo_model_dir, src, out, "--unit-rows", "10"))


def test_second_job_on_the_same_output_is_refused_while_the_first_runs(cluster, demo_model_dir, tmp_path):
    src = write_corpus(tmp_path / "in.parquet", clean_corpus(400))
    out = tmp_path / "out"
    proc = spawn_driver(cluster, job(demo_model_dir, src, out, "--unit-rows", "20", "--beam-size", "4"),
                        tmp_path / "driver.log")
    try:
        wait_for_commits(str(out), 1, proc)
        with pytest.raises(SystemExit, match=r"another job is writing this output: .*_LEASE.json is held by"):
            main(job(demo_model_dir, src, out, "--unit-rows", "20", "--beam-size", "4"))
        assert proc.wait(timeout=300) == 0, (tmp_path / "driver.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_exactly_once(str(out), [f"r{i:04d}" for i in range(400)])
    assert json.loads((out / "_LEASE.json").read_text())["released"]  # released (kept: the next generation follows)


def test_a_paused_ray_job_that_lost_its_lease_stops_and_its_actors_write_nothing(cluster, demo_model_dir, tmp_path):
    """The driver paused (SIGSTOP) past its lease while its decoder actor decodes on: the actor's commits
    are refused from the lease's expiry, a second job takes the output over and completes, and the
    first, resumed, stops with one line and leaves the second's output as it was."""
    src = write_corpus(tmp_path / "in.parquet", clean_corpus(300))
    out = tmp_path / "out"
    log = tmp_path / "a.log"
    a = spawn_driver(cluster, job(demo_model_dir, src, out, "--unit-rows", "10", "--lease-ttl", "4", "--decoders", "1",
                                  "--beam-size", "3"), log)
    try:
        wait_for_commits(str(out), 1, a)
        os.kill(a.pid, signal.SIGSTOP)
        time.sleep(max(json.loads((out / "_LEASE.json").read_text())["expires"] - time.time(), 0) + 0.5)
        main(job(demo_model_dir, src, out, "--unit-rows", "10", "--in-process", "--beam-size", "3"))
        after_b = {p.name: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name not in LEASE_FILES}
        time.sleep(3)  # A's actor, still decoding, tries to commit: refused
    finally:
        os.kill(a.pid, signal.SIGCONT)
    assert a.wait(timeout=120) != 0
    text = log.read_text()
    assert re.search(r"error: the output lease of .* (lost to|expired at) .* wrote nothing after", text), text
    assert {p.name: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name not in LEASE_FILES} == after_b
    lease = json.loads((out / "_LEASE.json").read_text())
    assert lease["generation"] == 2 and lease["released"]
    assert_exactly_once(str(out), [f"r{i:04d}" for i in range(300)])


def test_mixed_id_types_across_files_assemble_as_strings(cluster, demo_model_dir, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    write_corpus(folder / "a.parquet", clean_corpus(12), ids=[f"a{i}" for i in range(12)])
    pq.write_table(pa.table({"text": clean_corpus(8)}), folder / "b.parquet")  # no id column
    pq.write_table(pa.table({"id": pa.array(range(5), pa.int64()), "text": clean_corpus(5)}), folder / "c.parquet")
    main(job(demo_model_dir, folder, tmp_path / "out.parquet", "--unit-rows", "10"))
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.field("id").type == pa.string()
    assert table.column("id").to_pylist() == [f"a{i}" for i in range(12)] + [str(r) for r in range(12, 20)] + [
        str(i) for i in range(5)]
    main(job(demo_model_dir, folder, tmp_path / "out.txt", "--unit-rows", "10"))
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")[:-1]) == 25


@pytest.mark.parametrize("kind", ["parquet", "txt", "directory"])
def test_empty_inputs_give_an_empty_output_with_success(cluster, demo_model_dir, tmp_path, capsys, kind):
    if kind == "txt":
        src = tmp_path / "in.txt"
        src.write_text("")
    else:
        folder = tmp_path / "in" if kind == "directory" else tmp_path
        folder.mkdir(exist_ok=True)
        src = folder / "empty.parquet"
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), src)
        src = folder if kind == "directory" else src
    main(job(demo_model_dir, src, tmp_path / "out.txt"))
    assert "translated 0 rows in 0 units" in capsys.readouterr().out
    assert (tmp_path / "out.txt").read_text() == ""
    assert json.loads((tmp_path / "out.txt.parts" / "_SUCCESS").read_text())["rows"] == 0


def scrape(port: int) -> str:
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return ""


def test_progress_and_metrics_move_inside_a_unit(cluster, demo_model_dir, tmp_path):
    """One 1200-row unit: the driver prints rows and decoding speed and Prometheus shows the raymt_* metrics
    before the unit commits; the unit's stats row carries its time slices."""
    src = write_corpus(tmp_path / "in.parquet", clean_corpus(1200))
    out = tmp_path / "out"
    proc = spawn_driver(cluster, job(demo_model_dir, src, out, "--beam-size", "4", "--decoders", "1",
                                     "--progress-every", "2"),
                        tmp_path / "driver.log")
    try:
        metrics = wait_until(lambda: "ray_raymt_decoded_tokens_total{" in (m := scrape(METRICS_PORT)) and m, proc,
                             timeout=120, what="the live metrics")
        inside = committed(out) == 0
        assert proc.wait(timeout=300) == 0, (tmp_path / "driver.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert inside, "the metrics appeared only after the unit committed"
    for name in ("ray_raymt_tokens_per_second", "ray_raymt_batch_occupancy"):
        assert name in metrics
    for name in ("ray_raymt_sentences_total", "ray_raymt_target_tokens_total", "ray_raymt_pruned_fraction"):
        assert name in wait_until(lambda: name in (m := scrape(METRICS_PORT)) and m, proc=_Done(), timeout=30,
                                  what=name)
    log = (tmp_path / "driver.log").read_text()
    assert "(units 0/1 committed)  decoding" in log and "ETA ~" in log
    stats = OutputStore(str(out)).read_stats().to_pylist()
    slices = json.loads(stats[0]["slices"])
    assert len(slices) >= 2 and sum(s["tokens"] for s in slices) >= stats[0]["target_tokens"]
    assert all(0 < s["occupancy"] <= 1 for s in slices)


class _Done:
    def poll(self) -> None:
        return None


def test_a_decoder_no_node_can_hold_fails_at_once_unless_autoscaling(cluster, demo_model_dir, tmp_path):
    from raymt.pipeline.orchestration.driver import ResourcesUnavailable, check_placeable
    start = time.time()
    with pytest.raises(SystemExit, match=r"asks for 1 GPU\(s\) and 1 CPU\(s\), and no node .*0 GPU\(s\) in all"):
        main(job(demo_model_dir, write_corpus(tmp_path / "in.parquet", clean_corpus(5)), tmp_path / "out",
                 "--gpus-per-decoder", "1"))
    assert time.time() - start < 30
    gpu_node = {"Alive": True, "Resources": {"CPU": 8, "GPU": 1}}
    check_placeable(2, 1, [{"Alive": True, "Resources": {"CPU": 2}}, gpu_node], autoscaling=False)
    check_placeable(2, 1, [{"Alive": True, "Resources": {"CPU": 2}}], autoscaling=True)  # the autoscaler may add one
    with pytest.raises(ResourcesUnavailable, match="at most 8 CPUs on one node"):
        check_placeable(16, 0, [gpu_node, {"Alive": False, "Resources": {"CPU": 64}}], autoscaling=False)


def test_no_decoder_within_decoder_wait_fails_naming_the_units_left(cluster, demo_model_dir, tmp_path):
    src = write_corpus(tmp_path / "in.parquet", clean_corpus(5))
    start = time.time()
    with pytest.raises(SystemExit, match=r"no decoder actor has been ready for \d+s \(--decoder-wait\); 1 unit\(s\) "
                                         r"left: 00000-0000000000\. The job asks for 1 GPU\(s\) per decoder; the "
                                         r"cluster has 0 GPU\(s\)\..*rerunning the same command resumes"):
        main(job(demo_model_dir, src, tmp_path / "out", "--gpus-per-decoder", "1", "--min-decoders", "1",
                 "--max-decoders", "1", "--decoder-wait", "5"))  # autoscaling asked: waits, but only so long
    assert time.time() - start < 60


def test_ctrl_c_stops_cleanly_and_a_rerun_resumes(cluster, demo_model_dir, tmp_path, capsys, monkeypatch):
    """Ctrl-C while the job runs: its decoders are held after their first unit (``tests/hold_gates.py``), so
    the signal lands mid-job however fast the machine decodes."""
    src = write_corpus(tmp_path / "in.parquet", clean_corpus(400))
    out, gate = tmp_path / "out", tmp_path / "gate"
    args = job(demo_model_dir, src, out, "--unit-rows", "20", "--beam-size", "4")
    gate.touch()
    for name, value in gate_env(AFTER_COMMIT, gate).items():
        monkeypatch.setenv(name, value)
    proc = spawn_driver(cluster, args, tmp_path / "driver.log")
    wait_for_commits(str(out), 1, proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 1
    gate.unlink()
    log = (tmp_path / "driver.log").read_text()
    assert "interrupted: every committed unit is kept; rerun the same command to resume" in log
    assert "Traceback" not in log
    assert json.loads((out / "_LEASE.json").read_text())["released"]  # released on the way out
    capsys.readouterr()
    main(args)
    assert int(re.search(r"\((\d+) already committed\)", capsys.readouterr().out).group(1)) >= 1
    assert_exactly_once(str(out), [f"r{i:04d}" for i in range(400)])


def test_a_hung_encoder_is_given_up_after_the_stall_timeout(cluster, demo_model_dir, tmp_path, monkeypatch):
    """A stopped (SIGSTOP) encoder never fails: Ray Data waits on it forever. Once every decoder has
    waited --stall-timeout on the empty stream, the units go to the decoders raw; nothing is lost."""
    n = 600  # the encoder is held before its first block (``tests/hold_gates.py``) and stopped there
    src = write_corpus(tmp_path / "in.parquet", clean_corpus(n))
    out, gate = tmp_path / "out", tmp_path / "gate"
    stale = frozenset(ray_processes("MapWorker"))
    gate.touch()
    for name, value in gate_env(BEFORE_ENCODE, gate).items():
        monkeypatch.setenv(name, value)
    proc = spawn_driver(cluster, job(demo_model_dir, src, out, "--unit-rows", "30", "--decoders", "1",
                                     "--stall-timeout", "20"), tmp_path / "driver.log")
    encoder = set()
    try:
        encoder = wait_until(lambda: ray_processes("MapWorker", stale), proc, what="the encoder actor")
        for p in encoder:
            os.kill(p, signal.SIGSTOP)
        gate.unlink()  # (the stopped encoder stays where it is)
        assert proc.wait(timeout=300) == 0, (tmp_path / "driver.log").read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in encoder:
            kill(p)
    assert "the encoder stream delivered nothing" in (tmp_path / "driver.log").read_text(errors="replace")
    assert_exactly_once(str(out), [f"r{i:04d}" for i in range(n)])


def test_an_input_changed_on_ray_is_one_error_line(cluster, demo_model_dir, tmp_path, monkeypatch):
    """The stop's reason once, as the in-process route says it: no remote stack, no line per unit."""
    src = tmp_path / "in.txt"
    src.write_text("".join(f"Ein Hund läuft über die Wiese Nummer {i:05d}.\n" for i in range(600)))
    out, gate = tmp_path / "out", tmp_path / "gate"
    stale = frozenset(ray_processes("MapWorker"))
    gate.touch()
    for name, value in gate_env(BEFORE_ENCODE, gate).items():
        monkeypatch.setenv(name, value)  # the encoder waits before its first block: planned, not read
    proc = spawn_driver(cluster, job(demo_model_dir, src, out, "--unit-rows", "50", "--decoders", "1"),
                        tmp_path / "driver.log")
    try:
        wait_until(lambda: ray_processes("MapWorker", stale), proc, what="the encoder actor")
        src.write_text(src.read_text().replace("Hund", "Katz"))  # same size, other text
        gate.unlink()
        assert proc.wait(timeout=300) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = (tmp_path / "driver.log").read_text(errors="replace").splitlines()
    [error] = [x for x in lines if x.startswith("error:")]
    assert f"input {src} changed since the job planned it" in error
    logged = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\[\d{4}-\d\d-\d\d |\[\s*\d+\.\d+s\] rows )")
    assert [x for x in lines if not logged.match(x)] == [error], lines  # nothing but log records and the reason
    assert not any("cannot encode unit" in x or "Traceback" in x or "Unhandled error" in x for x in lines), lines
    assert not (out / "_SUCCESS").exists()
