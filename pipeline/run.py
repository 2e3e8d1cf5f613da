"""The translate pipeline on Ray: plan units -> encoder actor pool -> decoder actors -> output.

    plan = plan_units(input)                     # footers only; bad columns fail here, before any work
    units = plan.units - store.committed()       # resume: committed units are skipped
    ray.data.from_items(units)                   # one block per unit
      .map_batches(EncoderWorker, pool of E)     # read rows, clean, tokenise, cut to fit
      .iter_internal_ref_bundles()               # refs of encoded blocks, encoding runs ahead
    driver: each block ref -> DecoderWorker.decode.remote(ref) on the least loaded decoder actor
            (two items an actor: one decoding, one waiting), which commits part + marker per unit
    sweep:  units not committed (a block or actor failed) -> sent again as raw units, counted

The decoders are plain Ray actors, not a Ray Data stage: a plain actor runs its method on its
process's main thread and decodes at the in-process engine's speed, where a Ray Data map worker
measured ~0.8 of it. Ray restarts a dead decoder; the driver resends what it lost. The sink's fixed
part names keep a retried unit from being written twice.
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from pipeline.actors import DecoderSettings, DecoderWorker, EncoderWorker, unit_to_row
from pipeline.dispatch import Pool
from pipeline.evaluate import EvalStats, Scores, score
from pipeline.sink import OUTPUT_SCHEMA, OutputStore
from pipeline.units import Columns, Plan, WorkUnit, plan_units

logger = logging.getLogger(__name__)
_AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
             "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION")


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    input: str
    columns: Columns
    decoder: DecoderSettings
    unit_rows: int = 2500
    decoders: int | tuple[int, int] = 0  # 0: as many as the cluster's CPUs (or GPUs) allow; (min, max): autoscale
    encoders: int = 1  # 0: decoder actors tokenise their units themselves
    cpus_per_decoder: float = 0.0  # 0: the decoder's thread count
    gpus_per_decoder: float = 0.0
    encoder_cpus: float = 0.0  # encoders only tokenise: they share the decoders' cores by default
    skip_corrupt: bool = False
    max_attempts: int = 3  # a unit that fails this often (its actor died, or it raised) is reported failed
    progress_every_s: float = 10.0


@dataclass
class PipelineResult:
    units: int
    skipped_units: int  # already committed by an earlier run
    rows: int
    target_tokens: int = 0
    seconds: float = 0.0
    scores: Scores | None = None
    stats: list[dict] = field(default_factory=list)
    skipped_files: tuple = ()
    failed: dict[str, str] = field(default_factory=dict)  # unit -> reason, after max_attempts
    unreadable: dict[str, str] = field(default_factory=dict)  # failed units written as rows saying so (skip_corrupt)

    @property
    def tokens_per_second(self) -> float:
        return self.target_tokens / max(self.seconds, 1e-9)


def init_ray(**kwargs) -> None:
    """Join ``RAY_ADDRESS`` (or the job's cluster under ``ray job submit``), else start a local one.

    The AWS variables of the driver are passed to every worker, so s3:// works the same in actors.
    """
    import ray
    from ray.data import DataContext
    DataContext.get_current().enable_progress_bars = False  # the job prints its own progress lines
    if ray.is_initialized():
        return
    env = {k: os.environ[k] for k in _AWS_VARS if k in os.environ}
    ray.init(runtime_env={"env_vars": env} if env else None, **kwargs)


def _decoder_pool(cfg: PipelineConfig, cluster_cpus: float, cluster_gpus: float) -> tuple[int, int, float, float]:
    gpus = cfg.gpus_per_decoder
    cpus = cfg.cpus_per_decoder or float(cfg.decoder.threads)
    if isinstance(cfg.decoders, tuple):
        return cfg.decoders[0], cfg.decoders[1], cpus, gpus
    n = cfg.decoders or max(1, math.floor(cluster_gpus / gpus) if gpus else math.floor(cluster_cpus / cpus))
    return n, n, cpus, gpus


def run_pipeline(cfg: PipelineConfig) -> PipelineResult:
    """Translate ``cfg.input`` into ``cfg.decoder.output``; resumes a partial output of the same job.

    Raises ``UnitsFailed`` (after every other unit is committed) if some units failed every attempt.
    """
    plan: Plan = plan_units(cfg.input, cfg.columns, cfg.unit_rows, skip_corrupt=cfg.skip_corrupt)
    store = OutputStore(cfg.decoder.output)
    done = store.committed()
    todo = [u for u in plan.units if u.name not in done]
    result = PipelineResult(len(plan.units), len(plan.units) - len(todo), plan.rows, skipped_files=plan.skipped_files)
    if result.skipped_units:
        logger.info("resuming: %d of %d units already committed", result.skipped_units, len(plan.units))
    init_ray()
    start = time.perf_counter()
    if todo:
        _Driver(cfg, result, store, todo, start).run()
    result.seconds = time.perf_counter() - start
    if result.failed and cfg.skip_corrupt:  # every row still gets an output row, saying why it has no translation
        units = {u.name: u for u in todo}
        for name, reason in result.failed.items():
            store.commit(name, _unreadable_part(units[name], reason, cfg.decoder.signature), None,
                         {"unit": name, "rows": units[name].stop - units[name].start, "actor": "driver",
                          "unreadable": reason, "signature": cfg.decoder.signature})
        result.unreadable, result.failed = result.failed, {}
    if result.failed:
        raise UnitsFailed(result.failed)
    result.scores = _evaluate(store) if cfg.decoder.evaluate else None
    store.write_success({"units": result.units, "rows": plan.rows, "skipped_units": result.skipped_units,
                         "skipped_files": [list(x) for x in plan.skipped_files], "unreadable_units": result.unreadable,
                         "signature": cfg.decoder.signature,
                         "scores": str(result.scores) if result.scores else None})
    return result


def _unreadable_part(unit: WorkUnit, reason: str, signature: str) -> pa.Table:
    """Rows of a unit that failed every attempt: ids as far as known (row numbers), status ``unreadable``."""
    n = unit.stop - unit.start
    rows = list(range(unit.offset, unit.offset + n))
    return pa.table({"id": pa.array(rows if unit.id_column is None else [None] * n), "row": pa.array(rows, pa.int64()),
                     "source": pa.array([None] * n, pa.string()), "translation": [""] * n,
                     "score": pa.array([0.0] * n, pa.float32()),
                     "nbest": pa.array([[]] * n, OUTPUT_SCHEMA.field("nbest").type),
                     "status": ["unreadable"] * n, "reason": [f"unit {unit.name} could not be read: {reason}"] * n,
                     "signature": [signature] * n})


class UnitsFailed(RuntimeError):
    def __init__(self, failed: dict[str, str]) -> None:
        lines = "\n".join(f"  {unit}: {reason}" for unit, reason in sorted(failed.items()))
        super().__init__(f"{len(failed)} unit(s) failed every attempt; every other unit is committed and "
                         f"rerunning the same command retries only these:\n{lines}")
        self.failed = failed


class _Driver:
    """Feeds plain decoder actors: encoded blocks from Ray Data's encoder pool (or raw units with
    ``--encoders 0``), at most ``Pool.depth`` items an actor; then a sweep that sends every unit not
    yet committed again as raw units (its block failed or its actor died), until it is committed or
    has failed ``max_attempts`` times."""

    def __init__(self, cfg: PipelineConfig, result: PipelineResult, store: OutputStore, todo: list[WorkUnit],
                 start: float) -> None:
        import ray
        self.cfg, self.result, self.store, self.todo, self.start = cfg, result, store, todo, start
        resources = ray.cluster_resources()
        lo, hi, cpus, gpus = _decoder_pool(cfg, resources.get("CPU", 1), resources.get("GPU", 0))
        if gpus:  # say so rather than let reserved GPUs sit idle unnoticed
            logger.warning("--gpus-per-decoder %s reserves GPUs for placement only: decoding runs on the CPU "
                           "(the CUDA decode path is not built yet)", gpus)
        self.pool = Pool(lo, hi, max_attempts=cfg.max_attempts)
        # Ray restarts a dead decoder actor (max_restarts=-1); its lost items come back to the driver
        # as errors (max_task_retries=0) and are sent again as raw units, counted per unit.
        self.actor_class = ray.remote(DecoderWorker).options(num_cpus=cpus, num_gpus=gpus or None, max_restarts=-1,
                                                             max_task_retries=0)
        self.handles: dict[str, object] = {}
        self.probes: dict[object, str] = {}  # ready() ref -> actor
        self.in_flight: dict[object, tuple[str, list[WorkUnit]]] = {}  # decode ref -> (actor, raw units or [])
        self.retry: deque[WorkUnit] = deque()
        self.finished_units = 0
        self.created = self.start_failures = 0
        self.last_progress = start

    def run(self) -> None:
        import ray
        source = self._encoded_blocks() if self.cfg.encoders else ([u] for u in self.todo)
        swept = drained = False
        while True:
            self._scale()
            while (actor := self.pool.next_actor()) is not None:
                item = [self.retry.popleft()] if self.retry else next(source, None)
                if item is None:
                    drained = True
                    break
                self._send(actor, item)
            if drained and not self.in_flight and not self.retry:
                if swept:
                    break
                swept = True
                self._sweep()
                continue
            self._wait()
        for handle in self.handles.values():
            ray.kill(handle, no_restart=True)
        self.result.failed = dict(self.pool.failed)

    def _encoded_blocks(self) -> Iterator[object]:
        """Ray Data's encoder pool, run ahead of the decoders: object refs of encoded blocks."""
        import ray
        from ray.data import ActorPoolStrategy
        ds = ray.data.from_items([unit_to_row(u) for u in self.todo], override_num_blocks=len(self.todo))
        ds = ds.map_batches(EncoderWorker, fn_constructor_kwargs={"model": self.cfg.decoder.model,
                                                                  "columns": self.cfg.columns},
                            batch_size=1, batch_format="pyarrow", compute=ActorPoolStrategy(size=self.cfg.encoders),
                            num_cpus=self.cfg.encoder_cpus)
        for bundle in ds.iter_internal_ref_bundles():
            yield from bundle.block_refs

    def _sweep(self) -> None:
        """Units not committed after the stream (their block or actor failed) go again as raw units."""
        committed = self.store.committed()
        self.retry.extend(u for u in self.todo if u.name not in committed and u.name not in self.pool.failed)
        if self.retry:
            logger.warning("%d unit(s) not committed after the first pass: sending them again", len(self.retry))

    def _scale(self) -> None:
        import ray
        left = len(self.todo) - self.finished_units
        for _ in range(self.pool.to_start(left)):
            name, self.created = f"decoder-{self.created}", self.created + 1
            handle = self.actor_class.remote(self.cfg.decoder, self.cfg.columns)
            self.handles[name] = handle
            self.probes[handle.ready.remote()] = name
            self.pool.started(name)
        for name in self.pool.to_stop(left):  # idle actors give their resources back (autoscaling down)
            ray.kill(self.handles.pop(name), no_restart=True)
            self.pool.stopped(name)

    def _send(self, actor: str, item: object) -> None:
        ref = self.handles[actor].decode.remote(item)
        self.in_flight[ref] = (actor, item if isinstance(item, list) else [])
        self.pool.sent(actor)

    def _wait(self) -> None:
        import ray
        refs = [*self.in_flight, *self.probes]
        ready = ray.wait(refs, num_returns=1, timeout=self.cfg.progress_every_s)[0] if refs else []
        for ref in ready:
            if ref in self.probes:
                self._probed(ref, self.probes.pop(ref))
            else:
                self._returned(ref, *self.in_flight.pop(ref))
        self._progress()

    def _probed(self, ref: object, actor: str) -> None:
        import ray
        try:
            ray.get(ref)
            self.pool.became_ready(actor)
        except ray.exceptions.RayError as e:
            self.pool.stopped(actor)
            self.handles.pop(actor, None)
            self.start_failures += 1
            if self.start_failures >= 3:
                raise RuntimeError(f"decoder actors fail to start: {e}") from e
            logger.warning("decoder actor %s failed to start: %s", actor, _first_line(e))

    def _returned(self, ref: object, actor: str, units: list[WorkUnit]) -> None:
        import ray
        self.pool.returned(actor)
        try:
            rows = ray.get(ref)
        except ray.exceptions.RayError as e:
            reason = _first_line(e)
            logger.warning("decoder %s lost %s: %s", actor, [u.name for u in units] or "an encoded block", reason)
            self.retry.extend(u for u in units if self.pool.failed_attempt(u.name, reason))
            self.finished_units += sum(u.name in self.pool.failed for u in units)
            if isinstance(e, ray.exceptions.RayActorError) and actor in self.handles:
                self.pool.stopped(actor)  # probe it again: a restarted actor comes back, a dead one is dropped
                self.pool.started(actor)
                self.probes[self.handles[actor].ready.remote()] = actor
            return
        for row in rows:
            self.result.stats.append(row)
            self.result.target_tokens += row["target_tokens"]
        self.finished_units += len(rows)

    def _progress(self) -> None:
        now = time.perf_counter()
        if now - self.last_progress < self.cfg.progress_every_s and self.in_flight:
            return
        self.last_progress = now
        elapsed, stats = now - self.start, self.result.stats
        print(f"[{elapsed:7.1f}s] units {len(stats)}/{len(self.todo)}  sentences {sum(r['sentences'] for r in stats)}"
              f"  {self.result.target_tokens / max(elapsed, 1e-9):.0f} target tokens/s  decoders {self.pool.size}",
              flush=True)


def _first_line(e: Exception) -> str:
    lines = [x for x in str(e).splitlines() if x.strip()]
    return lines[-1][:300] if lines else type(e).__name__


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


def actor_table(stats: list[dict] | pa.Table) -> list[dict]:
    """Per-actor summary rows: units, sentences, tokens/s, occupancy, refills, pruned, shortlist, wait."""
    rows = stats.to_pylist() if isinstance(stats, pa.Table) else stats
    by_actor: dict[str, list[dict]] = {}
    for r in rows:
        by_actor.setdefault(r["actor"], []).append(r)
    out = []
    for actor, rs in sorted(by_actor.items()):
        busy = sum(r["decode_s"] for r in rs)
        out.append({"actor": actor, "node": rs[0]["node"][:12], "units": len(rs),
                    "sentences": sum(r["sentences"] for r in rs),
                    "src_tok_per_s": round(sum(r["source_tokens"] for r in rs) / max(busy, 1e-9), 1),
                    "tgt_tok_per_s": round(sum(r["target_tokens"] for r in rs) / max(busy, 1e-9), 1),
                    "sent_per_s": round(sum(r["sentences"] for r in rs) / max(busy, 1e-9), 2),
                    "occupancy": round(sum(r["occupancy"] for r in rs) / len(rs), 3),
                    "refills": sum(r["refills"] for r in rs),
                    "pruned_fraction": round(sum(r["pruned_fraction"] for r in rs) / len(rs), 4),
                    "shortlist_size": round(sum(r["shortlist_size"] for r in rs) / len(rs), 1),
                    "wait_s": round(sum(max(r["wait_s"], 0) for r in rs), 2), "decode_s": round(busy, 2)})
    return out
