"""The translate pipeline on Ray: check -> plan -> claim the output -> encoder pool -> decoder actors.

    resolve_model(model)                         # a hub id fetched here, pinned to a commit (pipeline/hub.py)
    check_model(model)                           # every problem of the model directory, before Ray starts
    plan = plan_units(input)                     # footers only; bad columns fail here, before any work
    lease + plan record                          # one job per output; a rerun must have the same plan
    units = plan.units - store.committed()       # resume: committed units are skipped
    ray.data.from_items(units)                   # one block per unit
      .map_batches(EncoderWorker, pool of E)     # read rows, clean, tokenise, cut to fit
    driver (pipeline/orchestration/driver.py): each encoded block -> the least loaded ready decoder actor, which
            commits part + marker per unit; dead / stalled actors probed, restarted, replaced
    sweep:  units not committed (a block or actor failed) -> sent again as raw units, counted
    _SUCCESS once every planned row is in a committed part

A small job (at most ``local_rows`` rows) with no cluster to join runs the same worker code
(``DecoderWorker``) in this process instead: no Ray start-up for a 12-line file. The decoders are
plain Ray actors, not a Ray Data stage: a plain actor runs its method on its process's main thread
and decodes at the in-process engine's speed, where a Ray Data map worker measured ~0.8 of it.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, replace
from typing import Callable

import pyarrow as pa

from raymt.pipeline.orchestration.actors import DecoderWorker
from raymt.pipeline.orchestration.driver import DecodersUnavailable, Driver, check_placeable
from raymt.pipeline.errors import JobStopped, stop_for, stopping_cause
from raymt.pipeline.reports.evaluate import EvalStats, Scores, score
from raymt.pipeline.formats import unread_ids
from raymt.pipeline.outputs.guards import check_output, check_output_format, check_owned, check_writable
from raymt.pipeline.outputs.lease import Lease, LeaseLost
from raymt.pipeline.hub import ResolvedModel, hub_id, resolve_model
from raymt.pipeline.outputs.ledger import PlanMismatch, PlanRecord, model_files, model_pins, snapshot_files
from raymt.pipeline.decoders.model_check import check_model
from raymt.pipeline.outputs.records import JobSummary, UnitMarker
from raymt.pipeline.orchestration.settings import ACTOR_THREADS, PipelineConfig, PipelineResult
from raymt.pipeline.outputs.sink import OutputStore, assemble, output_table
from raymt.pipeline.orchestration.ray_session import init_ray
from raymt.pipeline.reports.timeline import Progress, Snapshot, Ticker
from raymt.pipeline.orchestration.units import Plan, WorkUnit, auto_unit_rows, plan_units
from raymt.workers.decoder.device import on_gpu

__all__ = ["DecodersUnavailable", "check_placeable", "JobStopped", "PipelineConfig", "PipelineResult", "PlanMismatch",
           "UnitsFailed", "run_pipeline"]
logger = logging.getLogger(__name__)
def _decoder_pool(cfg: PipelineConfig, cluster_cpus: float, cluster_gpus: float) -> tuple[int, int, float, float]:
    gpus = cfg.gpus_per_decoder
    cpus = cfg.cpus_per_decoder or float(cfg.decoder.decode.runtime.threads)
    if isinstance(cfg.decoders, tuple):
        return cfg.decoders[0], cfg.decoders[1], cpus, gpus
    n = cfg.decoders or max(1, math.floor(cluster_gpus / gpus) if gpus else math.floor(cluster_cpus / cpus))
    return n, n, cpus, gpus


def plan_record(cfg: PipelineConfig, plan: Plan, source: ResolvedModel | None = None) -> PlanRecord:
    """The plan's record; ``source``: the model as resolved here (a hub snapshot's files are recorded
    as ``hf://org/name@<commit>/<file>``, wherever this machine's cache is)."""
    source = source or ResolvedModel(cfg.decoder.model)
    model = snapshot_files(source.path, source.url, source.commit) if source.hub else model_files(source.path)
    shortlist = cfg.decoder.decode.shortlist
    model += model_files(shortlist.path) if shortlist else []
    columns = {k: v for k, v in asdict(cfg.columns).items()  # earlier plans lack these at their defaults
               if (k, v) not in (("tsv_column", 1), ("source_lang", None), ("target_lang", None))}
    return PlanRecord(inputs=plan.versions, columns=columns,  # the versions the units are pinned to
                      unit_rows=plan.unit_rows, units=len(plan.units), rows=plan.rows,
                      signature=cfg.decoder.signature, model=tuple(model))


def plan_refusal(store: OutputStore, record: PlanRecord, restart: bool) -> PlanMismatch | None:
    """Why a job of ``record`` may not write the output as it is (None: it may). It only reads, so a
    job is refused before it takes the output's lease, and leaves no file behind."""
    if restart:
        return None
    earlier = store.read_plan()
    if earlier is None and store.has_output():
        return PlanMismatch(f"{store.url} holds output without a plan record (_PLAN.json): written by an older raymt "
                            f"or another tool, so its units cannot be checked. Write to another --output, or pass "
                            f"--restart to translate afresh (it removes only the files raymt's records name; "
                            f"others are kept).")
    if earlier is not None and earlier.digest != record.digest:
        changes = "\n  - ".join(record.differences(earlier))
        return PlanMismatch(f"{store.url} was started by another plan, and resuming would mix the two:\n  - {changes}\n"
                            f"Rerun with the original options and input, write to another --output, or pass --restart "
                            f"to discard it and translate afresh.")
    return None


def claim(store: OutputStore, record: PlanRecord, restart: bool) -> None:
    """Record the plan in the output, or check it equals the recorded one (``PlanMismatch``, before
    anything is written); ``restart`` discards the output's own files (``OutputStore.clear``) first."""
    if (refused := plan_refusal(store, record, restart)) is not None:
        raise refused
    earlier = store.read_plan()
    if restart and (earlier is not None or store.has_output()):
        logger.warning("--restart: discarding the output at %s", store.url)
        store.clear()
        earlier = None
    if earlier is None:
        store.write_plan(record)


def _unit_rows(cfg: PipelineConfig) -> int | Callable[[int], int]:
    """``cfg.unit_rows``; unset, what the output's plan record says (a resume keeps its units, whichever
    device it resumes on), else the default for the decoders' device and count by the input's size."""
    if cfg.unit_rows is not None:
        return cfg.unit_rows
    earlier = None if cfg.restart else OutputStore(cfg.decoder.output).read_plan()
    if earlier is not None:
        return earlier.unit_rows
    gpu, decoders = on_gpu(cfg.decoder.decode.runtime.device, cfg.gpus_per_decoder), _expected_decoders(cfg)
    return lambda rows: auto_unit_rows(rows, gpu, decoders=1 if _runs_here(cfg, rows) else decoders)


def _expected_decoders(cfg: PipelineConfig) -> int:
    """The decoders the job will run (``_decoder_pool``'s most), where known before its decoders
    start: over the CPUs of the cluster this process has joined, or this machine's for a Ray started
    here; 0 where only the cluster knows (an address not yet joined, GPUs)."""
    if not cfg.decoders and cfg.gpus_per_decoder:
        return 0
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():  # joined already: the cluster's CPUs
        cpus = ray.cluster_resources().get("CPU", 1)
    elif not cfg.decoders and (os.environ.get("RAY_ADDRESS") or os.environ.get("RAY_JOB_ID")):
        return 0
    else:
        cpus = os.cpu_count() or 1
    return _decoder_pool(_with_default_threads(cfg), cpus, 0)[1]


def _with_default_threads(cfg: PipelineConfig) -> PipelineConfig:
    return replace(cfg, decoder=cfg.decoder.with_threads(cfg.decoder.decode.runtime.threads or ACTOR_THREADS))


def run_pipeline(cfg: PipelineConfig, finish: Callable[[OutputStore], object] | None = None) -> PipelineResult:
    """Translate ``cfg.input`` into ``cfg.decoder.output``; resumes a partial output of the same plan.

    Raises ``ModelError`` / ``InputError`` before anything starts, ``OutputBusy`` if another job holds
    the output, ``PlanMismatch`` if it was started by another plan, ``DecodersUnavailable`` if no
    decoder could be had for ``health.decoder_wait_s``, and ``UnitsFailed`` (after every other unit
    is committed) if some units failed every attempt.
    """
    source = job_model(cfg)
    cfg = replace(cfg, decoder=replace(cfg.decoder, model=source.ref))  # what every actor loads, pinned
    check_model(source.path, name=f"{source.ref} ({source.path})" if source.hub else None)
    fmt = check_output_format(cfg.assemble_to, cfg.decoder.decode.search.num_hypotheses, cfg.columns.text) \
        if cfg.assemble_to else None  # a name asking for a format the job does not write: refused here
    check_output(cfg.input, cfg.decoder.output, cfg.assemble_to, source.path)
    check_owned(cfg.decoder.output, cfg.assemble_to, cfg.overwrite)  # never a user's file replaced
    plan: Plan = plan_units(cfg.input, cfg.columns, _unit_rows(cfg), skip_corrupt=cfg.skip_corrupt)
    record = plan_record(cfg, plan, source)
    check_writable(cfg.decoder.output, cfg.assemble_to)
    probe = OutputStore(cfg.decoder.output)
    if not cfg.restart and (earlier := probe.read_plan()) is not None and not earlier.pins_content:
        record = record.without_content()  # recorded by an older version: compared, and resumed, as it was
    if (refused := plan_refusal(probe, record, cfg.restart)) is not None:
        raise refused  # before the lease: a refused job leaves no file here (checked again under the lease)
    lease = Lease(probe.fs, probe.root, ttl_s=cfg.lease_ttl_s, url=probe.url)
    try:
        lease.acquire()
    except OSError as e:
        raise stop_for(e, f"taking the output lease in {probe.url}") or e from None
    store = OutputStore(cfg.decoder.output, plan=record.digest, fence=lease.fence)
    refused = False  # by claim, under the lease (another job recorded a plan meanwhile): nothing written
    try:
        claim(store, record, cfg.restart)
        pins = model_pins(record.model, source.url)
        result = _run(replace(cfg, decoder=replace(cfg.decoder, plan=record.digest, fence=lease.fence, model_pins=pins)), plan,
                      store, lease)
        if cfg.assemble_to:
            assemble(store, cfg.assemble_to, fmt)
        if finish is not None:  # files derived from the output (e.g. distillation's), written under the lease
            finish(store)
        return result
    except Exception as e:
        refused = isinstance(e, PlanMismatch)
        if isinstance(stopping_cause(e), LeaseLost) or lease.lost:  # say the lease, not what it broke
            raise LeaseLost(lease.lost or str(stopping_cause(e))) from None
        raise
    finally:
        lease.release(discard=refused)  # a job that wrote nothing leaves no lease files it created


def job_model(cfg: PipelineConfig) -> ResolvedModel:
    """The job's model resolved here (``pipeline/hub.py``): a hub id is pinned to one commit for the
    whole job; resuming an output, to the commit its plan recorded when the id names no revision (a
    branch that moved since does not change a resumed job's model), else to what it names now."""
    earlier = None if cfg.restart or not hub_id(cfg.decoder.model) else OutputStore(cfg.decoder.output).read_plan()
    return resolve_model(cfg.decoder.model, recorded=[f["path"] for f in earlier.model] if earlier else ())


def _run(cfg: PipelineConfig, plan: Plan, store: OutputStore, lease: Lease) -> PipelineResult:
    done = store.committed()
    todo = [u for u in plan.units if u.name not in done]
    result = PipelineResult(len(plan.units), len(plan.units) - len(todo), plan.rows, skipped_files=plan.skipped_files)
    if result.skipped_units:
        logger.info("resuming: %d of %d units already committed", result.skipped_units, len(plan.units))
    start = time.perf_counter()
    if not todo:
        result.where = "nothing to do"
    elif _runs_here(cfg, plan.rows):
        result.where = "in-process"
        logger.info("small job (%d rows, no cluster address): decoding in this process", plan.rows)
        _decode_here(cfg, result, store, todo, lease)
    else:
        _decode_on_ray(cfg, result, store, todo, start, lease)
    result.seconds = time.perf_counter() - start
    if result.failed and cfg.skip_corrupt:  # every row still gets an output row, saying why it has no translation
        units = {u.name: u for u in todo}
        # only a unit's own errors make it unreadable: one whose actors kept dying is not bad data
        unreadable = {name: reason for name, reason in result.failed.items() if name not in result.lost}
        for name, reason in unreadable.items():
            store.commit(name, _unreadable_part(units[name], reason, cfg.decoder.signature), None,
                         UnitMarker(name, actor="driver", unreadable=reason, signature=cfg.decoder.signature))
        result.unreadable = unreadable
        result.failed = {name: reason for name, reason in result.failed.items() if name not in unreadable}
    if result.failed:
        raise UnitsFailed(result.failed, result.lost)
    markers = store.markers()
    present = sum(m.rows for m in markers)
    if present != plan.rows:  # never a _SUCCESS over missing rows
        raise RuntimeError(f"{store.url}: committed parts hold {present} rows, the plan has {plan.rows}; not marking "
                           f"success (rerun to retry, or --restart to start afresh)")
    lease.check()
    if (recorded := store.read_plan()) is None or recorded.digest != cfg.decoder.plan:
        raise LeaseLost(f"{store.url}: its plan record changed under this job (now "
                        f"{recorded.digest if recorded else 'none'}, this job's {cfg.decoder.plan}): another job "
                        f"wrote this output; this job removes nothing and writes no _SUCCESS")
    if pruned := store.prune():
        logger.warning("removed %d file(s) of another plan (late commits of a killed job)", pruned)
    result.scores = _evaluate(store) if cfg.decoder.parts.evaluate else None
    unreadable = {m.unit: m.unreadable for m in markers if m.unreadable}  # this run's and earlier ones
    result.statuses = dict(sum((Counter(m.statuses) for m in markers), Counter()))
    store.write_success(JobSummary(
        units=result.units, rows=present, skipped_units=result.skipped_units,
        skipped_files=tuple(tuple(x) for x in plan.skipped_files), unreadable_units=unreadable,
        rows_by_status=result.statuses, signature=cfg.decoder.signature, plan=cfg.decoder.plan or "",
        lease_generation=lease.generation, scores=str(result.scores) if result.scores else None))
    return result


def _runs_here(cfg: PipelineConfig, rows: int) -> bool:
    """Whether a job of ``rows`` rows decodes in this process (one decoder) rather than on Ray: a
    small job with no cluster to join, where Ray's start-up would cost more than the decoding."""
    if cfg.in_process:
        return True
    if cfg.local_rows <= 0 or rows > cfg.local_rows or cfg.gpus_per_decoder:
        return False
    import ray
    return not ray.is_initialized() and not os.environ.get("RAY_ADDRESS") and not os.environ.get("RAY_JOB_ID")


def _decode_here(cfg: PipelineConfig, result: PipelineResult, store: OutputStore, todo: list[WorkUnit],
                 lease: Lease) -> None:
    """The decoder actor's code, run in this process: each unit committed as the actors commit it."""
    cfg = replace(cfg, decoder=cfg.decoder.with_threads(cfg.decoder.decode.runtime.threads or os.cpu_count() or 1))
    progress, start, last = Progress(sum(u.stop - u.start for u in todo), cfg.decoder.slice_s), time.perf_counter(), [0.0]

    def report(actor: str, snapshot: Snapshot) -> None:  # from the worker's sampler thread, every slice
        progress.report(actor, snapshot)
        if time.perf_counter() - last[0] >= cfg.progress_every_s:
            last[0] = time.perf_counter()
            print(progress.line(last[0] - start, len(todo)), flush=True)

    def tick() -> None:  # no slice (a huge row being read, tokenised and split): the line says what it does
        if time.perf_counter() - last[0] >= cfg.progress_every_s:
            last[0] = time.perf_counter()
            print(f"{progress.line(last[0] - start, len(todo))}  ({worker.phase})", flush=True)

    worker = DecoderWorker(cfg.decoder, cfg.columns, report=report)
    with Ticker(cfg.progress_every_s, tick):
        _decode_units_here(cfg, result, todo, lease, worker, progress)


def _decode_units_here(cfg: PipelineConfig, result: PipelineResult, todo: list[WorkUnit], lease: Lease,
                       worker: DecoderWorker, progress: Progress) -> None:
    for unit in todo:
        for attempt in range(1, cfg.max_attempts + 1):
            lease.check()
            try:
                rows = worker.decode([unit])
            except Exception as e:  # noqa: BLE001 - an unreadable unit: retried, then reported by name
                if stop := stopping_cause(e) or stop_for(e, f"decoding unit {unit.name}"):
                    raise stop from None  # lease lost, input changed, no space: no attempt can mend it
                logger.warning("unit %s failed (attempt %d): %s", unit.name, attempt, e)
                if attempt == cfg.max_attempts:
                    result.failed[unit.name] = f"{type(e).__name__}: {e}"
                else:
                    time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
                continue
            result.stats += rows
            result.target_tokens += sum(r.target_tokens for r in rows)
            for r in rows:
                progress.committed(r.unit, r.sentences)
            break


def _decode_on_ray(cfg: PipelineConfig, result: PipelineResult, store: OutputStore, todo: list[WorkUnit],
                   start: float, lease: Lease) -> None:
    """Decoder actors on the cluster (joined or started here), fed by ``raymt.pipeline.orchestration.driver.Driver``."""
    init_ray()
    import ray
    if cfg.decoder.decode.runtime.speedups.native:  # built once here, so no decoder builds (or can be killed building) it
        from raymt.workers.kernels.native import prebuild
        prebuild()
    cfg = _with_default_threads(cfg)
    resources = ray.cluster_resources()
    shape = _decoder_pool(cfg, resources.get("CPU", 1), resources.get("GPU", 0))
    if not isinstance(cfg.decoders, tuple) and len(todo) < shape[1]:  # a fixed pool: no decoder without a unit
        shape = (len(todo), len(todo), *shape[2:])
    if cfg.encoders and len(todo) <= shape[1]:  # one unit per decoder: nothing to tokenise ahead, an encoder
        cfg = replace(cfg, encoders=0)          # actor would only add its start-up (a small job's seconds)
    check_placeable(shape[2], shape[3], ray.nodes(), autoscaling=isinstance(cfg.decoders, tuple))
    if cfg.gpus_per_decoder and not resources.get("GPU"):
        logger.warning("each decoder actor asks for %s GPU(s) and the cluster has none now: the job waits at most "
                       "%.0fs for one (--decoder-wait)", cfg.gpus_per_decoder, cfg.health.decoder_wait_s)
    Driver(cfg, result, store, todo, start, shape, lease).run()


def _unreadable_part(unit: WorkUnit, reason: str, signature: str) -> pa.Table:
    """Rows of a unit that failed every attempt: ids as far as known (``formats.unread_ids``), status ``unreadable``."""
    n = unit.stop - unit.start
    rows = list(range(unit.offset, unit.offset + n))
    return output_table(unread_ids(unit.path, unit.id_column, rows), rows, [None] * n, [""] * n, [0.0] * n,
                        [[]] * n, ["unreadable"] * n, [f"unit {unit.name} could not be read: {reason}"] * n, signature)


class UnitsFailed(RuntimeError):
    def __init__(self, failed: dict[str, str], lost: set[str] = frozenset()) -> None:
        lines = "\n".join(f"  {unit}: {'lost with its decoder (not bad data): ' if unit in lost else ''}{reason}"
                          for unit, reason in sorted(failed.items()))
        super().__init__(f"{len(failed)} unit(s) failed every attempt; every other unit is committed and "
                         f"rerunning the same command retries only these:\n{lines}")
        self.failed = failed


def _evaluate(store: OutputStore) -> Scores | None:
    """Corpus BLEU / chrF from every committed unit's summed statistics (this run's and earlier ones)."""
    stats = store.read_stats()
    if stats is None or "bleu_stats" not in stats.column_names:
        return None
    total = None
    for bleu, chrf, n in zip(stats.column("bleu_stats").to_pylist(), stats.column("chrf_stats").to_pylist(),
                             stats.column("sentences").to_pylist()):
        if bleu is None:
            continue
        part = EvalStats(tuple(bleu), tuple(chrf), n)
        total = part if total is None else total + part
    return score(total) if total else None

