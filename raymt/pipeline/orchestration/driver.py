"""The driver loop that feeds plain decoder actors, with a bound on every wait.

    loop: scale the pool; probe dead actors (back-off); restart stalled ones;
          send items (retries first, then encoded blocks) to the least loaded ready actor;
          wait <= 1 s for a result or a probe; fail if no decoder has been ready for decoder_wait_s
    then: sweep -- every unit not committed goes again as a raw unit, until committed or out of attempts

Encoded blocks come from Ray Data's encoder pool through a bounded queue filled by a feeder thread,
so the loop never blocks on the encoder: if the encoder stream fails (its actor killed and Ray Data
gives up), the loop carries on and the sweep sends the units it did not deliver as raw units
(decoders tokenise them). Decoder health is ``raymt.pipeline.orchestration.dispatch.Pool``'s (no Ray there): one death
counted however many items it lost, a restarting actor probed with back-off and replaced after
``restart_timeout_s``, a stalled one killed so Ray restarts it. Every handle the driver lets go is
killed first (``no_restart``), so a forgotten actor never holds the cores a replacement needs.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from raymt.pipeline.orchestration.actors import DecoderActor, EncoderWorker, unit_to_row
from raymt.pipeline.orchestration.dispatch import Pool, Verdict
from raymt.pipeline.errors import JobStopped, last_line, stopping_cause
from raymt.pipeline.orchestration.feeds import DRAINED, BlockFeed, ListFeed
from raymt.pipeline.orchestration.settings import PipelineConfig, PipelineResult
from raymt.pipeline.reports.timeline import Board, Progress
from raymt.pipeline.orchestration.units import WorkUnit
from raymt.workers.decoder.device import DeviceUnavailable

if TYPE_CHECKING:
    from raymt.pipeline.outputs.ledger import Lease
    from raymt.pipeline.outputs.sink import OutputStore

logger = logging.getLogger(__name__)


class DecodersUnavailable(RuntimeError):
    """No decoder actor could be had within ``decoder_wait_s``; rerunning resumes."""


class ResourcesUnavailable(RuntimeError):
    """A decoder actor asks for more than any node of the cluster has, and no autoscaling was asked for."""


def check_placeable(cpus: float, gpus: float, nodes: list[dict], autoscaling: bool) -> None:
    """Fail at once if no node can ever hold one decoder actor (``nodes``: ``ray.nodes()``), unless the
    job asked to autoscale (then the autoscaler may add such a node, and ``decoder_wait_s`` bounds it)."""
    if autoscaling:
        return
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    if any(r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus for r in alive):
        return
    total_gpus, most_cpus = sum(r.get("GPU", 0) for r in alive), max((r.get("CPU", 0) for r in alive), default=0)
    asked = f"{gpus:g} GPU(s) and {cpus:g} CPU(s)" if gpus else f"{cpus:g} CPU(s)"
    raise ResourcesUnavailable(
        f"each decoder actor asks for {asked}, and no node of this cluster has that ({len(alive)} node(s), "
        f"{total_gpus:g} GPU(s) in all, at most {most_cpus:g} CPUs on one node). Lower --gpus-per-decoder / "
        f"--cpus-per-decoder / --threads, run on a cluster that has them, or pass --min-decoders/--max-decoders to "
        f"wait for an autoscaler (at most --decoder-wait seconds).")


class Driver:
    def __init__(self, cfg: PipelineConfig, result: PipelineResult, store: OutputStore, todo: list[WorkUnit],
                 start: float, pool_shape: tuple[int, int, float, float], lease: Lease | None = None) -> None:
        import ray
        self.cfg, self.result, self.store, self.todo, self.start, self.lease = cfg, result, store, todo, start, lease
        lo, hi, cpus, gpus = pool_shape
        self.gpus = gpus
        self.pool = Pool(lo, hi, max_attempts=cfg.max_attempts, health=cfg.health)
        # Ray restarts a dead decoder actor (max_restarts=-1); its lost items come back to the driver
        # as errors (max_task_retries=0) and are sent again, counted per unit.
        self.actor_class = ray.remote(DecoderActor).options(num_cpus=cpus, num_gpus=gpus or None, max_restarts=-1,
                                                            max_task_retries=0)
        self.handles: dict[str, object] = {}
        self.probes: dict[object, str] = {}  # setup() ref -> actor
        self.in_flight: dict[object, tuple[str, int, list[WorkUnit]]] = {}  # ref -> (actor, incarnation, raw units)
        self.retry: deque[WorkUnit] = deque()
        self.not_before: dict[str, float] = {}  # a failed unit's next attempt waits (back-off: 0.5 s doubling to 8 s)
        self.finished_units = 0
        self.created = self.start_failures = 0
        self.last_problem = ""
        self.last_progress = time.monotonic()
        self.starved_since: float | None = None  # since when every decoder waits on an empty encoder stream
        self.progress = Progress(sum(u.stop - u.start for u in todo), cfg.decoder.slice_s)
        # decoders report their time slices here: live progress inside a unit, and their liveness
        self.board = ray.remote(Board).options(num_cpus=0, max_restarts=-1).remote()

    def run(self) -> None:
        feed = BlockFeed(self._encoded_blocks, maxsize=2 * max(self.pool.hi, 1) + 2) if self.cfg.encoders \
            else ListFeed([[u] for u in self.todo])
        swept = drained = False
        try:
            while True:
                now = time.monotonic()
                if self.lease is not None:
                    self.lease.check()  # a lost lease: stop now, write nothing more
                self._scale()
                self._probe_down(now)
                self._restart_stalled(now)
                while (actor := self.pool.next_actor(self._waiting())) is not None:  # retries first, then the stream
                    due = self.retry and self.not_before.get(self.retry[0].name, 0.0) <= now
                    item = [self.retry.popleft()] if due else None if drained else feed.next()
                    if item is DRAINED:
                        drained = True
                        if feed.error:
                            logger.warning("the encoder stream stopped (%s): its undelivered units go to the decoders "
                                           "as raw units", feed.error)
                        continue
                    if item is None:  # nothing to send now
                        if not drained and self._stream_stalled(now):
                            feed.close()
                            drained = True
                            continue
                        break
                    self.starved_since = None
                    self._send(actor, item)
                if drained and not self.in_flight and not self.retry:
                    if swept:
                        break
                    swept = True
                    self._sweep()
                    continue
                self._check_decoders(now)
                self._wait()
        finally:
            feed.close()
            self._kill_all()
            self._settle_abandoned()
        self.result.failed = dict(self.pool.failed)
        self.result.lost = self.pool.lost & set(self.pool.failed)

    # -- feeding ----------------------------------------------------------------------------------------
    def _encoded_blocks(self) -> Iterator[object]:
        """Ray Data's encoder pool, run ahead of the decoders: object refs of encoded blocks."""
        import ray
        from ray.data import ActorPoolStrategy
        ds = ray.data.from_items([unit_to_row(u) for u in self.todo], override_num_blocks=len(self.todo))
        ds = ds.map_batches(EncoderWorker, fn_constructor_kwargs={"model": self.cfg.decoder.model,
                                                                  "columns": self.cfg.columns,
                                                                  "source_lang": self.cfg.decoder.source_lang,
                                                                  "target_lang": self.cfg.decoder.target_lang,
                                                                  "max_row_chars": self.cfg.decoder.decode.max_row_chars,
                                                                  "split_sentences": self.cfg.decoder.decode.split_sentences},
                            batch_size=1, batch_format="pyarrow", compute=ActorPoolStrategy(size=self.cfg.encoders),
                            num_cpus=self.cfg.encoder_cpus)
        for bundle in ds.iter_internal_ref_bundles():
            yield from bundle.block_refs

    def _stream_stalled(self, now: float) -> bool:
        """Whether the encoder stream has given nothing for ``--stall-timeout`` while every decoder
        waited: a hung encoder (Ray Data retries its tasks without end, so the stream never fails)."""
        if self.in_flight:
            self.starved_since = None
            return False
        if self.starved_since is None:
            self.starved_since = now
        if now - self.starved_since < self.pool.health.stall_timeout_s:
            return False
        logger.warning("the encoder stream delivered nothing for %.0fs while every decoder waited (--stall-timeout): "
                       "its undelivered units go to the decoders as raw units", now - self.starved_since)
        return True

    def _sweep(self) -> None:
        """Units not committed after the stream (their block or actor failed) go again as raw units."""
        committed = self.store.committed()
        self.retry.extend(u for u in self.todo if u.name not in committed and u.name not in self.pool.failed)
        if self.retry:
            logger.warning("%d unit(s) not committed after the first pass: sending them again", len(self.retry))

    def _waiting(self) -> int:
        """Units not yet sent (about: an encoded block may carry part of one)."""
        return max(0, len(self.todo) - self.finished_units - len(self.in_flight))

    def _send(self, actor: str, item: object) -> None:
        ref = self.handles[actor].decode.remote(item)
        self.in_flight[ref] = (actor, self.pool.incarnation[actor], item if isinstance(item, list) else [])
        self.pool.sent(actor, time.monotonic())

    # -- the pool -----------------------------------------------------------------------------------------
    def _scale(self) -> None:
        left = len(self.todo) - self.finished_units
        for _ in range(self.pool.to_start(left)):
            name, self.created = f"decoder-{self.created}", self.created + 1
            handle = self.actor_class.remote()
            self.handles[name] = handle
            self.probes[self._setup(name)] = name
            self.pool.started(name)
        for name in self.pool.to_stop(left):  # idle actors give their resources back (autoscaling down)
            self._retire(name)

    def _retire(self, actor: str) -> None:
        import ray
        handle = self.handles.pop(actor, None)
        if handle is not None:
            ray.kill(handle, no_restart=True)
        self.pool.stopped(actor)

    def _probe_down(self, now: float) -> None:
        for actor in self.pool.probes_due(now):
            self.probes[self._setup(actor)] = actor

    def _setup(self, actor: str) -> object:
        """The probe: loads the model where it is not loaded yet (a new or restarted actor), then answers."""
        return self.handles[actor].setup.remote(self.cfg.decoder, self.cfg.columns, actor, self.board)

    def _restart_stalled(self, now: float) -> None:
        import ray
        for actor in self.pool.stalled(now):
            logger.warning("decoder %s has shown no progress for %.0fs: killing it (Ray restarts it; its units are "
                           "sent again)", actor, self.pool.health.stall_timeout_s)
            ray.kill(self.handles[actor], no_restart=False)
            self.pool.last_alive[actor] = now  # its lost items arrive as errors and mark it dead

    def _check_decoders(self, now: float) -> None:
        left = len(self.todo) - self.finished_units
        waited = self.pool.waited_for_decoders(now, left)
        if waited < self.pool.health.decoder_wait_s:
            return
        committed = self.store.committed()
        units = [u.name for u in self.todo if u.name not in committed]
        hint = ""
        if self.gpus:
            import ray
            hint = (f" The job asks for {self.gpus:g} GPU(s) per decoder; the cluster has "
                    f"{ray.cluster_resources().get('GPU', 0):g} GPU(s).")
        raise DecodersUnavailable(
            f"no decoder actor has been ready for {waited:.0f}s (--decoder-wait); {len(units)} unit(s) left: "
            f"{', '.join(units[:8])}{' ...' if len(units) > 8 else ''}.{hint} Last problem: "
            f"{self.last_problem or 'none reported (actors pending: not enough resources?)'}. "
            f"Every committed unit is kept: rerunning the same command resumes.")

    def _kill_all(self) -> None:
        import ray
        try:
            ray.kill(self.board)
        except Exception:  # noqa: BLE001
            pass
        for actor in list(self.handles):
            try:
                self._retire(actor)
            except Exception:  # noqa: BLE001 - the cluster may be gone already
                pass

    def _settle_abandoned(self, timeout_s: float = 5.0) -> None:
        """Fetch the results left in flight when the job stops (their actors are killed): an error
        nobody fetched is printed by Ray with its remote stack when its reference is dropped, after
        the job's own one-line reason. Nothing is left in flight when the job ends normally."""
        import ray
        refs = [*self.in_flight, *self.probes]
        if not refs:
            return
        for ref in ray.wait(refs, num_returns=len(refs), timeout=timeout_s)[0]:
            try:
                ray.get(ref, timeout=0)
            except Exception:  # noqa: BLE001 - the job is stopping for its own reason; these follow from it
                pass

    # -- results --------------------------------------------------------------------------------------------
    def _wait(self) -> None:
        import ray
        refs = [*self.in_flight, *self.probes]
        ready = ray.wait(refs, num_returns=1, timeout=1.0)[0] if refs else []
        if ready:
            ready = ray.wait(refs, num_returns=len(refs), timeout=0)[0]
        if not refs:
            time.sleep(0.1)  # waiting for the encoder stream or a probe's back-off
        for ref in ready:
            if ref in self.probes:
                self._probed(ref, self.probes.pop(ref))
            else:
                self._returned(ref, *self.in_flight.pop(ref))
        self._progress()

    def _progress(self) -> None:
        """Every ``progress_every_s``: read the board (liveness), print rows done (estimated inside units),
        decoding speed now and an ETA."""
        import ray
        now = time.monotonic()
        if now - self.last_progress < self.cfg.progress_every_s:
            return
        self.last_progress = now
        try:
            reports = ray.get(self.board.read.remote(), timeout=5)
        except ray.exceptions.RayError:
            reports = {}
        wall = time.time()
        for actor, r in reports.items():
            if actor in self.pool.ready:  # a slice is a sign of life (stall detection)
                self.pool.last_alive[actor] = max(self.pool.last_alive.get(actor, now), now - (wall - r.time))
            self.progress.report(actor, r)
        line = self.progress.line(time.perf_counter() - self.start, len(self.todo))
        print(f"{line}  decoders {len(self.pool.ready)} ready / {self.pool.size}", flush=True)

    def _probed(self, ref: object, actor: str) -> None:
        import ray
        now = time.monotonic()
        try:
            ray.get(ref)
        except ray.exceptions.RayError as e:
            self.last_problem = f"{actor}: {last_line(e)}"
            permanent = bool(getattr(e, "actor_init_failed", False)) or not isinstance(e, ray.exceptions.RayActorError)
            if isinstance(getattr(e, "cause", None), (DeviceUnavailable, JobStopped)):  # no retry can mend it
                raise e.cause from None
            if actor in self.pool.starting:
                if permanent:
                    self._retire(actor)
                    self.start_failures += 1
                    if self.start_failures >= 3:
                        raise RuntimeError(f"decoder actors fail to start: {e}") from e
                    logger.warning("decoder actor %s failed to start: %s", actor, last_line(e))
                else:  # killed while loading the model: Ray restarts it, probe it again with back-off
                    self.pool.starting.discard(actor)
                    self.pool.down_since(actor, now)
                return
            if self.pool.probe_failed(actor, now, permanent) is Verdict.REPLACE:
                logger.warning("decoder %s did not come back (%s): replacing it", actor, last_line(e))
                self._retire(actor)
            return
        if actor in self.pool.starting:
            self.pool.became_ready(actor)
            self.pool.last_alive[actor] = now
        elif self.pool.probe_ok(actor, now) is Verdict.REPLACE:
            logger.warning("decoder %s died %d times: replacing it with a fresh actor", actor, self.pool.deaths[actor])
            self._retire(actor)
        else:
            logger.info("decoder %s is back", actor)

    def _returned(self, ref: object, actor: str, incarnation: int, units: list[WorkUnit]) -> None:
        import ray
        now = time.monotonic()
        self.pool.returned(actor, incarnation, now)
        try:
            rows = ray.get(ref)
        except ray.exceptions.RayError as e:
            if stop := stopping_cause(e):  # lease lost, input changed, no space: no attempt can mend it
                raise stop from None
            reason = last_line(e)
            self.last_problem = f"{actor}: {reason}"
            logger.warning("decoder %s lost %s: %s", actor, [u.name for u in units] or "an encoded block", reason)
            lost = not isinstance(e, ray.exceptions.RayTaskError)  # the actor died: not the unit's own error
            for u in units:
                if self.pool.failed_attempt(u.name, reason, lost):
                    self.retry.append(u)
                    self.not_before[u.name] = now + min(0.5 * 2 ** (self.pool.attempts[u.name] - 1), 8.0)
            self.finished_units += sum(u.name in self.pool.failed for u in units)
            if isinstance(e, ray.exceptions.RayActorError) and self.pool.died(actor, incarnation, now):
                logger.warning("decoder %s died (%d so far): probing it until Ray has restarted it", actor,
                               self.pool.deaths[actor])
            return
        for stats in rows:
            self.result.stats.append(stats)
            self.result.target_tokens += stats.target_tokens
            self.progress.committed(stats.unit, stats.sentences)
        self.finished_units += len(rows)
