"""The Python API, ``raymt.Translator``: load a model once, translate lists of strings.

    from raymt import Translator
    translator = Translator.load("models/opus-mt-de-en")        # a directory, URL (s3://...) or hub id; device="cuda"
    translator.translate(["Ein Hund rennt über die Wiese."])      # ['A dog runs across the meadow.']
    translator.translate(texts, beam_size=2, nbest=2)             # per text [(hypothesis, score), ...]

It decodes with the command line's defaults (``raymt.workers.decoder.decode_config.DEFAULTS``: the same
search, with an M2M100 / NLLB directory's own generation settings over it, the device's batching)
and prepares rows as the job does (``raymt.workers.text.rows``: bad cells translate to "" with a status,
cells longer than the model's positions are split and joined), so a line translates the same
through ``raymt translate``, this API and the Ray Data operator.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from raymt.pipeline.decoders.loading import load_decoder
from raymt.pipeline.storage import model_reader
from raymt.workers.checkpoints.checkpoint import Reader
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.decode_config import (DEFAULTS, DecodeConfig, DecodeRequest, RuntimeConfig, ShortlistSource,
                                         batching_for)
from raymt.workers.decoder.device import resolve_device
from raymt.workers.decoder.engine import DecodeStats
from raymt.workers.checkpoints.generation import effective_search, read_generation
from raymt.workers.text.lang_tokenizer import per_row_languages, source_encoder
from raymt.workers.text.rows import join_rows, prepare_rows
from raymt.workers.search.shortlist import LanguageShortlists, Shortlist
from raymt.workers.kernels.speedups import EXACT, CpuSpeedups
from raymt.workers.decoder.core_decoder import CoreDecoder

# ``compute_type`` as CTranslate2 names it -> the CPU rewrites (``workers/kernels/speedups.py``). bfloat16 needs
# a CPU with native bf16 (``workers/kernels/isa.py`` refuses it in one line elsewhere) or a GPU.
COMPUTE_TYPES = {"float32": EXACT, "int8": replace(EXACT, int8=True), "bfloat16": replace(EXACT, bf16=True),
                 "float16": replace(EXACT, fp16=True)}


def speedups_for(compute_type: str) -> CpuSpeedups:
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"compute_type {compute_type!r}: choose one of {', '.join(COMPUTE_TYPES)}")
    return COMPUTE_TYPES[compute_type]


@dataclass(frozen=True, slots=True)
class RowTranslation:
    """One input cell's outcome: its translation ("" when the cell is null or empty), the score
    (sum of log-probs / length**length_penalty), its ``status`` (``ok``, ``null``, ``empty``,
    ``normalised``, ``split``, ``too_long``; ``raymt.workers.text.inputs``) with the reason, and its n-best (best first)."""

    text: str
    score: float
    status: str
    reason: str
    nbest: tuple[tuple[str, float], ...]


@dataclass
class Translator:
    """A model loaded once (``load``), the decoding it was loaded for (``decode``) and the request
    every call decodes with (``request``: ``decode.request(shortlist)``, built here once)."""

    core: CoreDecoder
    decode: DecodeConfig
    shortlist: Shortlist | LanguageShortlists | None = None
    stats: DecodeStats = field(default_factory=DecodeStats)  # every call's counters, added up
    request: DecodeRequest = field(init=False)

    def __post_init__(self) -> None:
        self.request = self.decode.request(self.shortlist)

    @classmethod
    def load(cls, model: str, *, device: str = "cpu", compute_type: str = "float32", threads: int = 0,
             shortlist: str | ShortlistSource | None = None, search: SearchConfig | None = None,
             max_batch_tokens: int = 0, max_row_chars: int = DEFAULTS.max_row_chars,
             split_sentences: bool = DEFAULTS.split_sentences) -> Translator:
        """``model``: a model directory, local or a URL (``s3://``, ``gs://``, any fsspec URL), or a
        Hugging Face hub id (``org/name[@revision]``: fetched into the hub cache, ``pipeline/hub.py``).
        ``device``: cpu | cuda | cuda:N | auto. ``compute_type``: float32 | int8 | bfloat16 | float16.
        ``threads``: torch intra-op threads (0: torch's default). ``shortlist``: a lex.s2t or .vmap
        file (``raymt build-shortlist``; M2M100 / NLLB: or a directory of ``<code>.s2t`` per target language), or a ``ShortlistSource`` to set its top_m / top_n too. ``search``: the default search of ``translate``;
        None: the model's own (``generation.effective_search``: an M2M100 / NLLB directory's generation
        settings, the command line's defaults for a Marian one), read before the weights load.
        ``max_batch_tokens`` > 0: cap each decode step by source tokens instead of sentences.
        ``max_row_chars``: a longer text translates to "" with status ``too_long`` (0: no limit).
        ``split_sentences``: a text of several sentences is translated a sentence at a time and
        rejoined with its whitespace (``workers/text/sentences.py``); False: as one sequence."""
        on_gpu = resolve_device(device).type == "cuda"
        speedups = speedups_for(compute_type)
        read = model_reader(model)
        decode = DecodeConfig(search=search or effective_search(read_generation(read)),
                              batching=batching_for(on_gpu, shortlist=bool(shortlist), max_batch_tokens=max_batch_tokens,
                                                    precision=speedups.precision),
                              runtime=RuntimeConfig(device=device, threads=threads, speedups=speedups),
                              shortlist=ShortlistSource(shortlist) if isinstance(shortlist, str) else shortlist,
                              max_row_chars=max_row_chars, split_sentences=split_sentences)
        return cls.from_config(read, decode)

    @classmethod
    def from_config(cls, model: str | Reader, decode: DecodeConfig) -> Translator:
        """A model (a path, URL or hub id, or its opened reader) loaded for one ``DecodeConfig`` (what
        the command line builds from its flags)."""
        loaded = load_decoder(model, decode)
        return cls(loaded.translator, decode, loaded.shortlist)

    def translate(self, texts: Sequence[str], *, nbest: int | None = None, source_lang: str | Sequence[str] | None = None,
                  target_lang: str | Sequence[str] | None = None, **search):
        """Texts -> their translations, in order. ``nbest`` N: per text its N best ``(hypothesis,
        score)``, best first, instead (N <= beam_size). ``search``: any ``SearchConfig`` field for
        this call (``beam_size``, ``length_penalty``, ``max_decoding_length``, ``max_length_a``, ...).
        ``source_lang`` / ``target_lang``: an M2M100 / NLLB model's languages (required there), each one
        code or one per text (a list with unknown codes: one ValueError naming those rows)."""
        rows = self.translate_rows(texts, nbest=nbest, source_lang=source_lang, target_lang=target_lang, **search)
        if nbest is None:
            return [r.text for r in rows]
        return [list(r.nbest) for r in rows]

    def translate_rows(self, cells: Sequence[str | bytes | None], *, nbest: int | None = None,
                       source_lang: str | Sequence[str] | None = None, target_lang: str | Sequence[str] | None = None,
                       **search) -> list[RowTranslation]:
        """Cells (text, UTF-8 bytes or None) -> one ``RowTranslation`` each, in order."""
        request = self.request
        if search or nbest:  # (this call's own search over the translator's)
            call = replace(request.search, **search, **({"num_hypotheses": nbest} if nbest else {}))
            request = replace(request, search=call)
        tok = self.core.checkpoint.tokenizer
        encode = source_encoder(tok, source_lang) if source_lang is None or isinstance(source_lang, str) \
            else _per_row_encoders(tok, source_lang, len(cells))  # (M2M100 / NLLB: the source language bound)
        forced = self.core.forced_first(target_lang, len(cells))  # per row (None: a Marian model)
        language = source_lang or getattr(tok, "source_lang", None)  # (the sentence splitter's rules)
        prepared = prepare_rows(cells, encode, self.core.checkpoint.model.config.max_position_embeddings,
                                self.decode.max_row_chars, language, self.decode.split_sentences)
        forced = None if forced is None else [forced[row] for row in prepared.piece_row]
        hyps = self.core.decode_ids(prepared.pieces, request, stats=self.stats,
                                    forced_first=forced).hypotheses if prepared.pieces else []
        joined = join_rows(len(cells), prepared.piece_row, hyps, tok.decode_all, prepared.piece_space)
        return [RowTranslation(joined.texts[i], joined.scores[i], prepared.statuses[i], prepared.reasons[i],
                               tuple(joined.nbest(i))) for i in range(len(cells))]

    def close(self) -> None:
        """Frees the decoder's buffers (the KV cache, graphs); the weights go with the object."""
        self.core.close()

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _per_row_encoders(tok, source_langs: Sequence[str], n: int) -> list:
    """One ``encode`` per text, its source language bound (codes checked once, unknown ones in one error)."""
    langs = per_row_languages(tok, source_langs, n, "source_lang")
    encoders = {code: source_encoder(tok, code) for code in set(langs)}
    return [encoders[code] for code in langs]
