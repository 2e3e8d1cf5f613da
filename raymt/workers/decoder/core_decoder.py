"""In-process ``CoreDecoder``: a checkpoint + search config -> translations of a list of strings.

Sentences are sorted by length and decoded in batches of ``max_batch_size``; results come back
in input order. Empty input gives an empty translation without running the model.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

import torch

from raymt.workers.checkpoints.checkpoint import Checkpoint, Reader, load_checkpoint, local_reader
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.decode_config import DEFAULTS, DecodeRequest
from raymt.workers.decoder.device import batching_defaults_for
from raymt.workers.decoder.engine import DecodeStats, Engine, batch_schedule
from raymt.workers.checkpoints.generation import GenerationDefaults, effective_search, language_code
from raymt.workers.text.lang_tokenizer import per_row_languages
from raymt.workers.checkpoints.model_formats import open_model
from raymt.workers.decoder.runner import DecodeRunner, source_capacity
from raymt.workers.decoder.scheduler import CapacityUnit, SchedulerConfig
from raymt.workers.search.selection import Hypothesis
from raymt.workers.search.shortlist import AnyShortlist, batch_candidates
from raymt.workers.kernels.speedups import EXACT, CpuSpeedups, apply_speedups, precision_refusal
from raymt.workers.model.batch import collate
from raymt.workers.decoder.tuning import BatchTuner, TunerConfig, available_memory, bytes_per_sentence, fit_slots

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Translation:
    text: str
    score: float
    nbest: tuple[tuple[str, float], ...]  # (text, score), best first
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Decoded:
    """One decode call's result: per source its hypotheses (best first) and the engine's counters
    (steps, occupancy, refills, pruned, shortlist sizes, host syncs)."""

    hypotheses: list[list[Hypothesis]]
    stats: DecodeStats


@dataclass
class CoreDecoder:
    checkpoint: Checkpoint
    max_batch_size: int = DEFAULTS.batching.max_batch_size
    sort_by_length: bool = True  # streaming: feed sources sorted by length (bucketing) or as given
    tuner: BatchTuner | None = None  # closed-loop batch size (batch mode); None: max_batch_size
    # the decoder's long-lived state (KV cache, beam state, graphs, staging): built on the first
    # decode, reused by every later one (``workers/decoder/runner.py``) and by copies made with
    # ``dataclasses.replace`` (one cache per model); ``close`` frees it
    _runner: DecodeRunner | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, model: str | Reader, *, threads: int | None = None, max_batch_size: int | None = None,
             speedups: CpuSpeedups = EXACT, device: torch.device | str = "cpu") -> "CoreDecoder":
        """``model``: a local directory, or a reader (e.g. ``raymt.pipeline.storage.model_reader(url)``).
        ``speedups``: the CPU rewrites (``workers/kernels/speedups.py``); the default keeps float32 outputs.
        ``device``: where the weights live and every decode tensor is created; the CPU rewrites
        apply on the CPU only (elsewhere they are skipped, and the log says so); a GPU decoder gets
        the fused Triton output step (``workers/kernels/triton_ops.py``) where Triton imports. int8 off the
        CPU is refused (``ValueError``) before anything loads: it would decode in float32.
        ``max_batch_size`` None: the device's and precision's default (``device.batching_defaults_for``)."""
        device = torch.device(device)
        if max_batch_size is None:
            max_batch_size = batching_defaults_for(device.type == "cuda", speedups.precision).max_batch_size
        if why := precision_refusal(speedups, device):
            raise ValueError(why)
        if threads:
            torch.set_num_threads(threads)
        reader = local_reader(model) if isinstance(model, str) else model
        reader = open_model(reader, model if isinstance(model, str) else "")  # HF dir as is, Marian .npz adapted
        checkpoint = load_checkpoint(reader, device=device)
        if device.type == "cpu":
            apply_speedups(checkpoint.model, speedups)
        else:
            if speedups.dtype != torch.float32:  # the one rewrite that is a dtype, not a CPU kernel
                checkpoint.model.to(speedups.dtype)
            from raymt.workers.kernels.triton_ops import device_ops  # (imports Triton: only where a GPU may decode)
            checkpoint.model.model.decoder.ops = device_ops(device)  # the fused Triton output step on a GPU
            if replace(speedups, bf16=False, fp16=False) != CpuSpeedups():
                logger.info("CPU speed-ups (%s) skipped on %s", speedups.signature(), device)
        return cls(checkpoint, max_batch_size=max_batch_size)

    @property
    def forced_eos(self) -> bool:
        """Force EOS at the length cap when the checkpoint asks for it: OPUS-MT's ``forced_eos_token_id``
        (``config.json``), an M2M100 / NLLB directory's generation settings' (``workers/checkpoints/generation.py``)."""
        if self.checkpoint.multilingual:
            return self.checkpoint.generation.get("forced_eos_token_id") not in (None, [])
        return self.checkpoint.hf_config.get("forced_eos_token_id") is not None

    @property
    def default_target_lang(self) -> str | None:
        """The target language an M2M100 / NLLB directory's generation settings force
        (``forced_bos_token_id``, when it is a language code's id): ``forced_first``'s default."""
        return language_code(self.checkpoint.tokenizer, self.checkpoint.generation.get("forced_bos_token_id"))

    def encode(self, texts: list[str], source_lang: str | list[str] | None = None) -> list[list[int]]:
        """Source ids with ``</s>``; inputs longer than the model's positions are truncated (EOS kept).
        ``source_lang``: M2M100 / NLLB source language, one code or one per text (``[code] ids </s>``)."""
        tok = self.checkpoint.tokenizer
        limit = self.checkpoint.model.config.max_position_embeddings
        langs = self._languages(source_lang, len(texts), "source_lang")
        out = []
        for text, lang in zip(texts, langs):
            ids = tok.encode(text) if lang is None else tok.encode(text, lang)
            if len(ids) > limit:
                logger.warning("truncating a %d-token input to the model's %d positions", len(ids), limit)
                ids = ids[: limit - 1] + [ids[-1]]
            out.append(ids)
        return out

    def _languages(self, codes: str | list[str] | None, n: int, name: str) -> list[str | None]:
        """One language code per text (``lang_tokenizer.per_row_languages``): required on an M2M100 / NLLB
        model, refused on a Marian one."""
        return per_row_languages(self.checkpoint.tokenizer, codes, n, name)

    def forced_first(self, target_lang: str | list[str] | None, n: int) -> list[int] | None:
        """Per text the token its translation must start with: the target language's id on an M2M100 /
        NLLB model (HF's ``forced_bos_token_id``, per row; ``target_lang`` None: ``default_target_lang``),
        None on a Marian model."""
        tok = self.checkpoint.tokenizer
        if target_lang is None:
            target_lang = self.default_target_lang
        langs = self._languages(target_lang, n, "target_lang")
        ids = {code: tok.lang_id(code) for code in set(langs) if code is not None}  # (an unknown code: ValueError)
        return [ids[code] for code in langs] if ids else None

    def generation_defaults(self) -> GenerationDefaults | None:
        """An M2M100 / NLLB directory's own generation defaults (``workers/checkpoints/generation.py``: its
        ``generation_config.json``); None for a Marian directory. Settings this decoder does not
        implement raise ``UnsupportedGeneration`` (one line naming them)."""
        if not self.checkpoint.multilingual:
            return None
        return GenerationDefaults.parse(self.checkpoint.generation, self.checkpoint.model.config)

    def model_search_config(self) -> SearchConfig:
        """The search this model decodes with unless told otherwise: an M2M100 / NLLB directory's own
        (``generation_defaults``: what HF ``generate(**inputs)`` runs there, ``max_length - 1`` generated
        tokens, ``num_beams``, ``length_penalty``, ``early_stopping``), the product's defaults
        (``DEFAULTS.search``) for a Marian one (``generation.effective_search``)."""
        return effective_search(self.generation_defaults())

    def decode_ids(self, sources: list[list[int]], request: DecodeRequest, *, stats: DecodeStats | None = None,
                   forced_first: list[int] | None = None) -> Decoded:
        """Token ids -> hypotheses (input order) and the engine's counters of this call, decoded as
        ``request`` says (``DecodeConfig.request``: search, shortlist, schedule, static step).

        Without ``request.schedule``: batch decoding, the sources sorted by length into batches of
        ``max_batch_size`` (or the tuner's size), each decoded to its end (the FIXED policy; with a
        shortlist, over its own candidate set). With a schedule: the engine under that policy over the
        length-sorted sources (one candidate set for the whole call); out of memory (and without a
        shortlist), the call falls back to batches, which give the same translations. ``stats``:
        counters to add to (read live by the actors' time slices); a fresh ``DecodeStats`` by default.
        ``request.static``: the engine's one-shape step (``raymt.workers.decoder.static_step.StaticStep``: a
        CUDA graph on a GPU); batch decoding then runs its batches on one engine (without a shortlist
        or a tuner, whose batches differ), one capture per call. ``forced_first``: per source the token
        its translation starts with (``forced_first()``: M2M100 / NLLB target languages), rows of
        different target languages decoded in the same batches.
        """
        stats = stats if stats is not None else DecodeStats()
        schedule = request.schedule
        if schedule is None and request.static is not None and request.shortlist is None and not self.tuner \
                and self.sort_by_length:
            # the same batches on one engine (FIXED: admit one, no refill until it is done), so every
            # batch runs in the one bucket whose CUDA graph the runner captured (once per runner)
            schedule = batch_schedule(self.max_batch_size)
        if schedule is not None:
            try:
                return Decoded(self._stream(sources, request, schedule, stats, forced_first), stats)
            except (torch.OutOfMemoryError, MemoryError):
                if request.shortlist is not None or len(sources) < 2:  # (a shortlist's candidate set is per call)
                    raise
                logger.warning("out of memory streaming %d sentences in %d slots: decoding them in batches instead "
                               "(the same translations; a batch that runs out too is split)", len(sources),
                               schedule.max_batch_sentences)
                request = replace(request, static=None)  # (the dynamic step: only the rows that run take memory)
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        out: list[list[Hypothesis]] = [[] for _ in sources]
        start = 0
        while start < len(order):
            size = self.tuner.next_size() if self.tuner else self.max_batch_size
            idx = order[start: start + size]
            tokens, t0 = stats.target_tokens, time.perf_counter()
            forced = None if forced_first is None else [forced_first[i] for i in idx]
            for i, hyps in zip(idx, self._decode_batch([sources[i] for i in idx], request, stats, forced)):
                out[i] = hyps
            if self.tuner:
                self.tuner.record(len(idx), stats.target_tokens - tokens, time.perf_counter() - t0)
            start += len(idx)
        return Decoded(out, stats)

    def tune_batches(self, cfg: SearchConfig, tuner: TunerConfig | None = None) -> BatchTuner:
        """Closed-loop batch size from here on, starting at ``max_batch_size``, capped by free memory."""
        mc = self.checkpoint.model.config
        self.tuner = BatchTuner(tuner or TunerConfig(start=self.max_batch_size))
        free = available_memory()
        if free:
            self.tuner.limit_memory(free, bytes_per_sentence(
                layers=mc.decoder_layers, d_model=mc.d_model, vocab=mc.decoder_vocab_size, beam=cfg.beam_size,
                max_target=min(cfg.max_decoding_length, mc.max_position_embeddings),
                max_source=mc.max_position_embeddings))
        return self.tuner

    def _decode_batch(self, sources: list[list[int]], request: DecodeRequest, stats: DecodeStats,
                      forced: list[int] | None = None) -> list[list[Hypothesis]]:
        """One batch; out of memory, it is split in halves and retried (and the tuner's cap lowered)."""
        try:
            return self._search(sources, request, stats, forced)
        except (torch.OutOfMemoryError, MemoryError):
            if len(sources) == 1:
                raise
            logger.warning("out of memory with a batch of %d sentences: splitting it", len(sources))
            if self.tuner:
                self.tuner.out_of_memory(len(sources))
            half = len(sources) // 2
            first, second = (None, None) if forced is None else (forced[:half], forced[half:])
            return (self._decode_batch(sources[:half], request, stats, first)
                    + self._decode_batch(sources[half:], request, stats, second))

    @property
    def runner(self) -> DecodeRunner:
        """The one runner of this translator's model, built on first use."""
        model = self.checkpoint.model
        if self._runner is None or self._runner.model is not model:
            self._runner = DecodeRunner(model)
        return self._runner

    def close(self) -> None:
        """Frees the decoder's cache, graphs and buffers now (a later decode builds them again)."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def _engine(self, request: DecodeRequest, sources: list[list[int]], schedule: SchedulerConfig,
                stats: DecodeStats, forced: list[int] | None = None) -> Engine:
        """``request.shortlist``: a ``Shortlist``, or ``LanguageShortlists`` picked by the rows' ``forced``
        languages."""
        model = self.checkpoint.model
        candidates = batch_candidates(request.shortlist, sources, forced)
        candidates = None if candidates is None else candidates.to(model.device)
        if model.device.type == "cuda":
            schedule = self._fit_to_memory(schedule, sources, request.search, candidates)
        return Engine(model, request.search, schedule, forced_eos=self.forced_eos, candidates=candidates, stats=stats,
                      static=request.static, runner=self.runner)

    def _fit_to_memory(self, batching: SchedulerConfig, sources: list[list[int]], cfg: SearchConfig,
                       candidates: torch.Tensor | None) -> SchedulerConfig:
        """A GPU's slots: as many as asked, or as many as fill half its free memory when fewer, each
        holding K/V of every layer for its beams to the call's length cap and to the source capacity
        the cache is allocated for (the longest source rounded up, ``runner.source_capacity``), and
        its rows' logits (a slot count the GPU's defaults ask for may not fit a smaller GPU or model).
        Free memory leaves captured graphs' pools out (``graphs.free_memory``)."""
        from raymt.workers.model import graphs  # (CUDA only)
        mc, model = self.checkpoint.model.config, self.checkpoint.model
        longest = max(len(s) for s in sources)
        per_slot = bytes_per_sentence(
            layers=mc.decoder_layers, d_model=mc.d_model, beam=cfg.beam_size,
            vocab=int(candidates.numel()) if candidates is not None else mc.decoder_vocab_size,
            max_target=min(cfg.max_length_for(longest), mc.max_position_embeddings) + 1,
            max_source=source_capacity(longest, mc.max_position_embeddings),
            bytes_per_value=model.model.shared.weight.element_size())
        free = graphs.free_memory(model.device) + self.runner.held_bytes()  # (the held cache is reused or freed)
        slots = fit_slots(batching.max_batch_sentences, free, per_slot)
        if slots == batching.max_batch_sentences:
            return batching
        logger.info("decoding with %d slots, not %d: that many fit half the GPU's free memory (%.1f MB a slot)",
                    slots, batching.max_batch_sentences, per_slot / 2**20)
        sentences = batching.capacity_unit is CapacityUnit.SENTENCES
        return replace(batching, max_batch_sentences=slots,
                       capacity=min(batching.capacity, slots) if sentences else batching.capacity)

    def _search(self, sources: list[list[int]], request: DecodeRequest, stats: DecodeStats,
                forced: list[int] | None = None) -> list[list[Hypothesis]]:
        """One length-sorted batch, decoded to its end: the FIXED policy over exactly these sentences."""
        return self._engine(request, sources, batch_schedule(len(sources)), stats, forced).decode(sources, forced)

    def _stream(self, sources: list[list[int]], request: DecodeRequest, schedule: SchedulerConfig,
                stats: DecodeStats, forced_first: list[int] | None = None) -> list[list[Hypothesis]]:
        order = sorted(range(len(sources)), key=lambda i: len(sources[i])) if self.sort_by_length else list(range(len(sources)))
        forced = None if forced_first is None else [forced_first[i] for i in order]
        ordered = [sources[i] for i in order]
        hyps = self._engine(request, ordered, schedule, stats, forced).decode(ordered, forced)
        out: list[list[Hypothesis]] = [[] for _ in sources]
        for i, h in zip(order, hyps):
            out[i] = h
        return out

    @torch.inference_mode()
    def score_ids(self, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probability of every target token (its EOS included) given its source:
        the model's own distribution, without the search's shortlist or forced EOS."""
        mc = self.checkpoint.model.config
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]) + len(targets[i]))
        out: list[list[float]] = [[] for _ in sources]
        for start in range(0, len(order), self.max_batch_size):
            idx = order[start: start + self.max_batch_size]
            batch = collate([(sources[i], targets[i]) for i in idx], mc.pad_token_id, mc.decoder_start_token_id)
            logits = self.checkpoint.model(batch.src_ids, batch.src_mask, batch.tgt_in)  # (B, T, V)
            lprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.labels[..., None]).squeeze(-1)  # (B, T)
            for row, i in enumerate(idx):
                out[i] = lprobs[row, : len(targets[i])].tolist()
        return out

    def special_target_ids(self) -> tuple[int, ...]:
        """Targets every shortlist keeps: EOS, UNK and PAD (PAD stays banned; it keeps the normaliser)."""
        s = self.checkpoint.tokenizer.target_special
        return (s.eos, s.unk, s.pad)

    def translate(self, texts: list[str], cfg: SearchConfig | None = None, shortlist: AnyShortlist | None = None,
                  batching: SchedulerConfig | None = None, *, stats: DecodeStats | None = None,
                  source_lang: str | list[str] | None = None,
                  target_lang: str | list[str] | None = None) -> list[Translation]:
        """Texts -> translations (input order), decoded with ``cfg`` (None: the model's defaults,
        ``model_search_config``, as the command line's), ``shortlist`` and ``batching`` (the streaming
        schedule; None: batches) as one ``DecodeRequest``; ``stats``: counters to add this call's to. ``source_lang`` /
        ``target_lang``: an M2M100 / NLLB model's languages (required there, refused on a Marian model),
        one code for all texts or one per text; texts of different target languages share batches
        (``forced_first``)."""
        cfg = cfg or self.model_search_config()
        tok = self.checkpoint.tokenizer
        nonempty = [i for i, t in enumerate(texts) if t.strip()]
        sources = self._languages(source_lang, len(texts), "source_lang")
        forced = self.forced_first(target_lang, len(texts))
        if self.checkpoint.multilingual:
            source_lang = [sources[i] for i in nonempty]
        forced = None if forced is None else [forced[i] for i in nonempty]
        request = DecodeRequest(cfg, shortlist, batching)
        hyps = self.decode_ids(self.encode([texts[i] for i in nonempty], source_lang), request,
                               stats=stats, forced_first=forced).hypotheses
        out = [Translation("", 0.0, (("", 0.0),), ()) for _ in texts]
        for i, h in zip(nonempty, hyps):
            nbest = tuple((tok.decode(list(x.tokens)), x.score) for x in h)
            out[i] = Translation(nbest[0][0], nbest[0][1], nbest, h[0].tokens)
        return out
