"""The translate pipeline on Ray: plan units -> encoder actor pool -> decoder actor pool -> output.

    plan = plan_units(input)                     # footers only; bad columns fail here, before any work
    units = plan.units - store.committed()       # resume: committed units are skipped
    ray.data.from_items(units)                   # one block per unit
      .map_batches(EncoderWorker, pool of E)     # read rows, clean, tokenise, cut to fit, sort
      .map_batches(DecoderWorker, pool of D)     # decode, commit part + marker, return stats row
    for stats_row in dataset.iter_rows(): progress

Ray Data runs encoding ahead of decoding (its streaming executor keeps encoded units queued in
front of each decoder, the top-up idea at unit granularity) and restarts a dead actor and retries
its unit; the sink's fixed part names keep a retried unit from being written twice.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field

import pyarrow as pa

from pipeline.actors import DecoderSettings, DecoderWorker, EncoderWorker, unit_to_row
from pipeline.evaluate import EvalStats, Scores, score
from pipeline.sink import OutputStore
from pipeline.units import Columns, Plan, plan_units

logger = logging.getLogger(__name__)
_AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
             "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION")


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    input: str
    columns: Columns
    decoder: DecoderSettings
    unit_rows: int = 1000
    decoders: int | tuple[int, int] = 0  # 0: as many as the cluster's CPUs (or GPUs) allow; (min, max): autoscale
    encoders: int = 1  # 0: decoder actors tokenise their units themselves
    cpus_per_decoder: float = 0.0  # 0: the decoder's thread count
    gpus_per_decoder: float = 0.0
    encoder_cpus: float = 0.0  # encoders only tokenise: they share the decoders' cores by default
    skip_corrupt: bool = False
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
    """Translate ``cfg.input`` into ``cfg.decoder.output``; resumes a partial output of the same job."""
    import ray
    from ray.data import ActorPoolStrategy

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
        resources = ray.cluster_resources()
        lo, hi, cpus, gpus = _decoder_pool(cfg, resources.get("CPU", 1), resources.get("GPU", 0))
        # Ray Data's actor pools restart dead actors and retry their tasks forever by default
        # (max_restarts=-1, max_task_retries=-1): a killed decoder's unit is decoded again.
        ds = ray.data.from_items([unit_to_row(u) for u in todo], override_num_blocks=len(todo))
        if cfg.encoders:
            ds = ds.map_batches(EncoderWorker, fn_constructor_kwargs={"model": cfg.decoder.model, "columns": cfg.columns},
                                batch_size=1, batch_format="pyarrow", compute=ActorPoolStrategy(size=cfg.encoders),
                                num_cpus=cfg.encoder_cpus)
        decoder_args = {"settings": cfg.decoder, "columns": None if cfg.encoders else cfg.columns}
        ds = ds.map_batches(DecoderWorker, fn_constructor_kwargs=decoder_args, batch_size=1,
                            batch_format="pyarrow", compute=ActorPoolStrategy(min_size=lo, max_size=hi),
                            num_cpus=cpus, num_gpus=gpus or None)
        last = time.perf_counter()
        for row in ds.iter_rows():
            result.stats.append(dict(row))
            result.target_tokens += row["target_tokens"]
            if time.perf_counter() - last >= cfg.progress_every_s or len(result.stats) == len(todo):
                last = time.perf_counter()
                _progress(result, len(todo), last - start)
    result.seconds = time.perf_counter() - start
    result.scores = _evaluate(store) if cfg.decoder.evaluate else None
    store.write_success({"units": result.units, "rows": plan.rows, "skipped_units": result.skipped_units,
                         "skipped_files": [list(x) for x in plan.skipped_files], "signature": cfg.decoder.signature,
                         "scores": str(result.scores) if result.scores else None})
    return result


def _progress(result: PipelineResult, total: int, elapsed: float) -> None:
    sentences = sum(r["sentences"] for r in result.stats)
    print(f"[{elapsed:7.1f}s] units {len(result.stats)}/{total}  sentences {sentences}  "
          f"{result.target_tokens / max(elapsed, 1e-9):.0f} target tokens/s", flush=True)


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
