"""The actor shells: EncoderWorker (read, clean, tokenise, cut to fit) and DecoderWorker (decode a
unit with the engine, commit its part, return its stats row).

EncoderWorker is a callable class Ray Data runs in an actor pool (Arrow batches of work units, one
row a unit). DecoderWorker is a plain Ray actor the driver feeds (``pipeline/orchestration/run.py``): plain
actors run their methods on the process's main thread, where torch's intra-op threads decode at the
in-process engine's speed. The math lives in ``workers/``; these classes only move rows between
Arrow and lists and time things.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict

import pyarrow as pa
import torch

from raymt.pipeline.errors import JobStopped
from raymt.pipeline.reports.evaluate import EvalStats, sufficient_stats
from raymt.pipeline.formats import mark_invalid
from raymt.pipeline.decoders.heap import trim_heap
from raymt.pipeline import hooks
from raymt.pipeline.decoders.metrics import Metrics
from raymt.pipeline.inputs.passthrough import read_passthrough, with_passthrough
from raymt.pipeline.outputs.records import EncodedUnit, UnitStats
from raymt.pipeline.orchestration.settings import DecoderSettings, PartColumns  # noqa: F401  (PartColumns: re-exported)
from raymt.pipeline.outputs.sink import OUTPUT_SCHEMA, OutputStore, output_table
from raymt.pipeline.decoders.loading import load_decoder
from raymt.pipeline.storage import model_reader
from raymt.pipeline.reports.timeline import Counters, Sampler, Slice, Snapshot
from raymt.pipeline.orchestration.units import Columns, UnitRows, WorkUnit, read_unit
from raymt.workers.checkpoints.checkpoint import load_tokenizer
from raymt.workers.decoder.device import DeviceUnavailable, resolve_device
from raymt.workers.decoder.engine import DecodeStats
from raymt.workers.text.lang_tokenizer import row_language_problems, source_encoder
from raymt.workers.text.inputs import MAX_ROW_CHARS
from raymt.workers.kernels.native import decoder_kernels
from raymt.workers.text.rows import join_rows, prepare_rows
from raymt.workers.search.selection import Hypothesis
from raymt.workers.decoder.core_decoder import CoreDecoder

logger = logging.getLogger(__name__)


def unit_to_row(unit: WorkUnit) -> dict:
    return {"unit": json.dumps(asdict(unit))}


class EncoderWorker:
    """unit rows -> encoded unit rows: cleaned text, statuses, token-id pieces that fit the model."""

    def __init__(self, model: str | CoreDecoder, columns: Columns, source_lang: str | None = None,
                 target_lang: str | None = None, max_row_chars: int = MAX_ROW_CHARS,
                 split_sentences: bool = True) -> None:
        if isinstance(model, CoreDecoder):
            self.tokenizer, config = model.checkpoint.tokenizer, model.checkpoint.model.config
        else:  # an encoder actor needs the tokenizer, not the weights
            self.tokenizer, config, _ = load_tokenizer(model_reader(model))
        self.source_lang, self.target_lang, self.columns = source_lang, target_lang, columns
        self._encoders: dict[str | None, Callable[[str], list[int]]] = {}
        self.encode = None if columns.source_lang else self.encoder(source_lang)  # (per-row: ``encoder`` per row)
        self.limit, self.max_row_chars, self.split = config.max_position_embeddings, max_row_chars, split_sentences
        self.language = source_lang or getattr(self.tokenizer, "source_lang", None)  # the splitter's rules

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Ray Data's call. A unit that cannot be read (a corrupt row group) comes back as a row with
        its ``error``: the decoder skips it, and the driver's sweep retries it and reports it."""
        hooks.point(hooks.BEFORE_ENCODE)  # observation point (pipeline/hooks.py)
        rows = []
        for u in batch.column("unit").to_pylist():
            try:
                rows.append({**self.encode_unit(WorkUnit(**json.loads(u))).to_row(), "error": None})
            except Exception as e:  # noqa: BLE001 - one unreadable unit must not stop the stream
                # a stop (input changed, ...) is said once, by the driver; an unreadable unit here
                log = logger.debug if isinstance(e, JobStopped) else logger.warning
                log("cannot encode unit %s: %s", json.loads(u)["name"], e)
                rows.append({"unit": u, "error": f"{type(e).__name__}: {e}"})
        keys = dict.fromkeys(k for r in rows for k in r)  # error rows: the other columns null
        return pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows])

    def encode_unit(self, unit: WorkUnit) -> EncodedUnit:
        start = time.perf_counter()
        return self.encode_rows(unit, read_unit(unit, self.columns), start)

    def encode_rows(self, unit: WorkUnit, rows: UnitRows, start: float | None = None) -> EncodedUnit:
        """The unit's rows, as read, made ready to decode (the job's units and a stream's batches alike)."""
        start = time.perf_counter() if start is None else start
        bad = row_language_problems(self.tokenizer, rows.source_langs, rows.target_langs, self.source_lang,
                                    self.target_lang)  # (a row with an unusable code: ``invalid``, not translated)
        texts = rows.texts if not bad or not any(bad) else [None if b else t for t, b in zip(rows.texts, bad)]
        encode = self.encode if rows.source_langs is None else [
            None if bad and bad[i] else self.encoder(lang or self.source_lang) for i, lang in enumerate(rows.source_langs)]
        languages = self.language if rows.source_langs is None else [lang or self.language for lang in rows.source_langs]
        prepared = prepare_rows(texts, encode, self.limit, self.max_row_chars, languages, self.split)
        problems = bad if not rows.problems else [p or b for p, b in zip(rows.problems, bad or [None] * len(rows.problems))]
        statuses, reasons = mark_invalid(prepared.statuses, prepared.reasons, problems)  # unparsable lines, bad codes
        return EncodedUnit(unit, rows.ids, rows.rows,
                           [t.decode("utf-8", "replace") if isinstance(t, bytes) else t for t in rows.texts],
                           rows.references, statuses, reasons, prepared.pieces, prepared.piece_row,
                           time.perf_counter() - start, rows.target_langs, prepared.piece_space)

    def encoder(self, source_lang: str | None) -> Callable[[str], list[int]]:
        """``tokenizer.encode`` with a source language bound (M2M100 / NLLB; checked once per language)."""
        if source_lang not in self._encoders:
            self._encoders[source_lang] = source_encoder(self.tokenizer, source_lang)
        return self._encoders[source_lang]


class DecoderWorker:
    """encoded units (or raw ones, tokenised here) -> each unit's part committed to the output and
    its stats row returned. Its stats are also cut into time slices as it decodes
    (``pipeline/reports/timeline.py``): each unit's stats row carries its slices, and each slice goes to the
    Ray metrics and, given ``report``, as ``report(name, snapshot)`` (to the driver's progress board
    on Ray, to a progress printer in-process)."""

    def __init__(self, settings: DecoderSettings, columns: Columns, name: str = "",
                 report: Callable[[str, Snapshot], None] | None = None) -> None:
        self.settings = settings
        device = _device(settings.decode.runtime.device)
        loaded = load_decoder(settings.model, settings.decode, device=device, pins=settings.model_pins)
        self.translator = loaded.translator
        self.request = settings.decode.request(loaded.shortlist)  # what every unit decodes with
        logger.info("decoder on %s%s", device, f" (Ray GPU ids {_gpu_ids()})" if device.type == "cuda" else "")
        self.store = OutputStore(settings.output, plan=settings.plan, fence=settings.fence)
        self.actor = f"{socket.gethostname()}:{os.getpid()}"
        self.node = _node_id()
        self.last_done = time.time()
        self.metrics = Metrics() if _in_ray() else None
        self.phase = "starting"  # what it is doing now, for a progress line when no decoding step moves
        self.encoder = EncoderWorker(self.translator, columns, settings.source_lang, settings.target_lang,
                                     settings.decode.max_row_chars, settings.decode.split_sentences)
        if not columns.target_lang:  # (a missing or unknown language: one line, here)
            self.translator.forced_first(settings.target_lang, 1)
        self.name, self.report = name or self.actor, report
        self.lock = threading.Lock()
        self.base = Counters()  # earlier units' counters
        self.unit: dict = {}  # the unit being decoded: name, rows, source tokens, counters at its start
        self.live = DecodeStats()  # the unit being decoded: the engine adds to it, the sampler reads it
        self.sampler = Sampler(self._counters, self._capacity, settings.slice_s, self._on_slice)

    def _live(self) -> Counters:
        st = self.live  # (batch mode's batches are not refills: its scheduler admits each one whole)
        return Counters(st.steps, st.sentence_steps, st.scheduler.refills if self.settings.decode.batching.schedule else 0)

    def _counters(self) -> Counters:
        with self.lock:
            return self.base + self._live()

    def _capacity(self) -> int:
        b = self.settings.decode.batching.schedule
        return b.max_batch_sentences if b else (self.translator.tuner.size if self.translator.tuner
                                                 else self.translator.max_batch_size)

    def _on_slice(self, s: Slice) -> None:
        if self.metrics is not None:
            self.metrics.record_slice(self.actor, s)
        if self.report is not None:
            unit = dict(self.unit)
            total = self._counters()
            self.report(self.name, Snapshot(time=s.end, tokens=total.tokens, tokens_per_s=s.tokens_per_s,
                                            unit=unit.get("name"), unit_rows=unit.get("rows", 0),
                                            unit_source_tokens=unit.get("source_tokens", 0),
                                            unit_tokens=total.tokens - unit.get("start_tokens", total.tokens)))

    def decode(self, item: pa.Table | list[WorkUnit]) -> list[UnitStats]:
        """An encoder's output block, or units to read and tokenise here -> each unit's stats."""
        if isinstance(item, pa.Table):  # an encoder's unreadable unit (``error``) is skipped: the sweep retries it
            encoded = [EncodedUnit.from_row(r) for r in item.to_pylist() if not r.get("error")]
        else:
            encoded = []
            for u in item:
                self.phase = f"reading and tokenising unit {u.name}"
                encoded.append(self.encoder.encode_unit(u))
        stats = []
        for e in encoded:
            self.phase = f"decoding unit {e.unit.name}"
            stats.append(self.decode_unit(e))
        self.phase = "between units"
        trim_heap()  # the units' freed tensor memory back to the system: else the heap's RSS creeps up unit by unit
        return stats

    def decode_unit(self, enc: EncodedUnit) -> UnitStats:
        started = time.time()
        wait_s = started - self.last_done
        unit, tr = enc.unit, self.translator
        with self.lock:  # this unit's counters start at zero; the sampler's totals carry on
            self.base = self.base + self._live()
            self.live = DecodeStats()
            self.unit = {"name": unit.name, "rows": len(enc.rows), "source_tokens": enc.source_tokens,
                         "start_tokens": self.base.tokens}
        t0 = time.perf_counter()
        decoded = tr.decode_ids(enc.pieces, self.request, stats=self.live,
                                forced_first=tr.forced_first(piece_targets(enc, self.settings.target_lang), len(enc.pieces)))
        hyps = decoded.hypotheses
        decode_s = time.perf_counter() - t0
        self.sampler.sample()  # the unit's last slice ends with its last step
        table, texts = self._output_table(enc, hyps)
        if self.settings.parts.keep_reference:
            table = table.append_column("reference", pa.array(enc.references or [None] * len(texts), pa.string()))
        if self.settings.parts.token_logprobs:
            table = table.append_column("token_logprobs", self._token_logprobs(enc, hyps))
        if self.settings.parts.passthrough:  # read again from the pinned unit, not carried through decoding
            table = with_passthrough(table, read_passthrough(unit, self.encoder.columns))
        evaluation = None
        if self.settings.parts.evaluate and enc.references is not None:
            evaluation = sufficient_stats(texts, enc.references)
        stats = self._stats(enc, decoded.stats, started, wait_s, decode_s, evaluation)
        self.store.commit(unit.name, table, pa.Table.from_pylist([stats.to_row()]),
                          {"unit": unit.name, "rows": len(texts), "actor": self.actor, "signature": self.settings.signature})
        if self.metrics is not None:
            self.metrics.record_unit(stats)
        hooks.point(hooks.AFTER_COMMIT)  # observation point (pipeline/hooks.py)
        self.last_done = time.time()
        return stats

    def _output_table(self, enc: EncodedUnit, hyps: list) -> tuple[pa.Table, list[str]]:
        return decoded_table(enc, hyps, self.translator.checkpoint.tokenizer, self.settings.signature)

    def _token_logprobs(self, enc: EncodedUnit, hyps: list) -> pa.Array:
        """Per row: the teacher's log-prob of each token of its best translation (pieces joined)."""
        scores = self.translator.score_ids(enc.pieces, [list(h[0].tokens) for h in hyps])
        per_row: list[list[float]] = [[] for _ in enc.rows]
        for i, s in zip(enc.piece_row, scores):
            per_row[i] += s
        return pa.array(per_row, pa.list_(pa.float32()))

    def _stats(self, enc: EncodedUnit, st: DecodeStats, started: float, wait_s: float, decode_s: float,
               evaluation: EvalStats | None) -> UnitStats:
        tr, batching = self.translator, self.settings.decode.batching.schedule
        sizes = st.shortlist_sizes
        capacity = batching.max_batch_sentences if batching else tr.max_batch_size
        statuses: dict[str, int] = {}
        for s in enc.statuses:
            statuses[s] = statuses.get(s, 0) + 1
        return UnitStats(
            unit=enc.unit.name, actor=self.actor, node=self.node, started=started, finished=time.time(),
            wait_s=wait_s, encode_s=enc.encode_s, decode_s=decode_s, sentences=len(enc.rows), pieces=len(enc.pieces),
            source_tokens=enc.source_tokens, target_tokens=st.target_tokens, steps=st.steps, row_steps=st.row_steps,
            occupancy=st.sentence_steps / max(st.steps * capacity, 1), refills=st.scheduler.refills if batching else 0,
            batch_size=tr.tuner.size if tr.tuner else capacity,
            pruned_fraction=st.pruned / max(st.pruned + st.row_steps, 1),
            shortlist_size=sum(sizes) / len(sizes) if sizes else 0.0,
            statuses=statuses, batch_histogram=dict(sorted(st.batch_sizes.items())),
            bleu_stats=list(evaluation.bleu) if evaluation else None,
            chrf_stats=list(evaluation.chrf) if evaluation else None,
            slices=tuple(self.sampler.take(since=started)), kernels=decoder_kernels(tr.checkpoint.model.ops))


def piece_targets(enc: EncodedUnit, default: str | None) -> str | list[str | None] | None:
    """Each piece's target language: its row's (a per-row column), else the job's ``default``."""
    if enc.target_langs is None:
        return default
    return [enc.target_langs[row] or default for row in enc.piece_row]


def decoded_table(enc: EncodedUnit, hyps: list[list[Hypothesis]], tokenizer, signature: str) -> tuple[pa.Table, list[str]]:
    """A decoded unit's output part and its rows' translations. Per row: its piece's best
    hypothesis and n-best; a row cut into pieces (its sentences), their best joined with the source's
    whitespace between them (score: the sum), n-best that
    one; a row with no piece (not translatable), "" and no n-best. Every hypothesis is detokenised in
    one call and the n-best column built from flat arrays: on a GPU the device waits for this
    (25,000 WMT22-length rows, 2 cores: 0.28 s with a dict per hypothesis, now 0.14)."""
    j = join_rows(len(enc.rows), enc.piece_row, hyps, tokenizer.decode_all, enc.piece_space)
    entry = OUTPUT_SCHEMA.field("nbest").type.value_type
    nbest = pa.ListArray.from_arrays(pa.array(j.offsets, pa.int32()), pa.StructArray.from_arrays(
        [pa.array(j.nbest_text, pa.string()), pa.array(j.nbest_score, pa.float32())], fields=list(entry)))
    table = output_table(enc.ids, enc.rows, enc.sources, j.texts, j.scores, nbest, enc.statuses, enc.reasons, signature)
    return table, j.texts


class DecoderActor:
    """The Ray actor shell of ``DecoderWorker``. It takes no constructor arguments, so a restarted actor
    never depends on arguments kept in the object store; the driver's probe, ``setup``, loads the
    model (again after a restart) and answers when the actor can decode."""

    def __init__(self) -> None:
        self.worker: DecoderWorker | None = None

    def setup(self, settings: DecoderSettings, columns: Columns, name: str, board) -> str:
        if self.worker is None:
            self.worker = DecoderWorker(settings, columns, name, lambda actor, snapshot: board.report.remote(actor, snapshot))
        return self.worker.actor

    def decode(self, item: pa.Table | list[WorkUnit]) -> list[UnitStats]:
        if self.worker is None:
            raise RuntimeError("decoder actor not set up (restarted): its items are sent again")
        return self.worker.decode(item)


def _gpu_ids() -> list:
    if not _in_ray():
        return []
    import ray
    return ray.get_gpu_ids()


def _device(name: str) -> torch.device:
    """``DecoderSettings.device`` resolved here, once; on a Ray GPU actor the message names the GPU Ray
    assigned when torch cannot see it."""
    try:
        return resolve_device(name)
    except DeviceUnavailable as e:
        ids, visible = _gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES", "")
        where = f"; Ray assigned this actor GPU ids {ids} (CUDA_VISIBLE_DEVICES={visible!r})" if ids else ""
        raise DeviceUnavailable(f"{e}{where}") from None


def _in_ray() -> bool:
    """Whether this process is a Ray worker or driver (never starts Ray: the in-process route must not)."""
    try:
        import ray
        return ray.is_initialized()
    except ImportError:
        return False


def _node_id() -> str:
    if not _in_ray():  # the in-process route (a small job, --in-process, tests calling the worker)
        return socket.gethostname()
    import ray
    return ray.get_runtime_context().get_node_id()
