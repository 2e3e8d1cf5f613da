"""``Translate``: a Ray Data operator that translates one column of a ``Dataset``.

    ds = ray.data.read_parquet("corpus/")
    ds = ds.map_batches(Translate, fn_constructor_kwargs={"model": "models/demo-de-en", "column": "text"},
                        concurrency=4)
    ds.write_parquet("translated/")

Every other column passes through; a ``translation`` column (``output_column``) and a
``translation_error`` column (null, or why the row was not translated) are added. Search settings
and batching default to the command line's (``raymt.workers.decoder.decode_config``; an M2M100 / NLLB
directory's own generation settings, ``raymt.workers.checkpoints.generation``). One model per actor,
loaded in the constructor; on a GPU pass ``num_gpus=1`` to ``map_batches`` and ``device="cuda"``.
Unlike the job (``raymt translate``) the operator has no ledger: no exactly-once commits, no resume.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from raymt.workers.config import SearchConfig
from raymt.workers.text.inputs import MAX_ROW_CHARS, too_long
from raymt.workers.text.lang_tokenizer import LanguageError, LanguageTokenizer, per_row_languages, row_language_problems

logger = logging.getLogger(__name__)

ERROR_COLUMN = "translation_error"


@dataclass(frozen=True)
class TranslateStats:
    """One actor's totals: sentences translated, target tokens generated, seconds spent decoding."""

    sentences: int = 0
    target_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.target_tokens / self.seconds if self.seconds else 0.0


def row_error(value, max_chars: int = MAX_ROW_CHARS) -> str | None:
    """Why a cell cannot be translated, or None when it can (``max_chars``: the row limit, 0: none)."""
    if value is None or type(value).__name__ == "NAType" or (isinstance(value, float) and np.isnan(value)):
        return "null"
    if not isinstance(value, str):
        return f"not a string: {type(value).__name__}"
    if not value.strip():
        return "empty"
    if reason := too_long(value, max_chars):
        return f"too_long: {reason}"
    return None


def _code(cell) -> str | None:
    """A language cell's code (None where it is null, NaN or empty: the fixed code applies)."""
    return cell if isinstance(cell, str) and cell else None


@dataclass(frozen=True, slots=True)
class _Languages:
    """The operator's languages: a fixed code and / or a column of codes, per side."""

    source: str | None = None
    target: str | None = None
    source_column: str | None = None
    target_column: str | None = None

    def check(self, tok) -> None:
        """One line at construction: languages an M2M100 / NLLB model lacks, or a Marian model is given."""
        for name, code, column in (("source_lang", self.source, self.source_column),
                                   ("target_lang", self.target, self.target_column)):
            if column and not isinstance(tok, LanguageTokenizer):
                raise LanguageError(f"Translate: {name}_column applies to M2M100 / NLLB models; this Marian model "
                                    "takes no languages")
            if code is not None or not column:
                try:
                    per_row_languages(tok, code, 1, name)
                except LanguageError as e:
                    raise LanguageError(f"Translate: {e}" + ("" if code else f"; or {name}_column=, a column of "
                                                             "codes per row")) from None

    def per_row(self, sources: list | None, targets: list | None, n: int) -> tuple:
        """The codes ``translate`` takes: the fixed one, or per row (an empty cell: the fixed one)."""
        return tuple(fixed if cells is None else [c or fixed for c in cells]
                     for fixed, cells in ((self.source, sources), (self.target, targets)))


class Translate:
    """A callable class for ``Dataset.map_batches``: translates ``column`` into ``output_column``.

    The model loads once per actor through the Python API (``raymt.Translator.load``: ``model`` a
    directory, URL or Hugging Face hub id, which each actor fetches into its node's hub cache:
    ``org/name@<commit>`` pins every actor to one revision), ``device`` cpu | cuda | cuda:N | auto,
    ``compute_type`` float32 | int8 | bfloat16 | float16, ``threads``, ``shortlist``,
    ``max_batch_tokens``); ``search``: the beam search (default: the command line's, an M2M100 /
    NLLB directory's own generation settings over it). Cells go through the job's row path
    (``raymt.workers.text.rows``): a cell of several sentences is translated a sentence at a time and
    rejoined with its whitespace (``split_sentences=False``: as one sequence), a cell longer than the
    model's positions is split and joined, control
    characters are removed, and a cell of more than ``max_row_chars`` characters (0: no limit) gets
    "" and ``too_long: <n> characters, ...`` in ``translation_error`` without being decoded.
    Rows arrive in any batch format (pyarrow, pandas, numpy dicts) and leave in the same one.

    An M2M100 / NLLB model needs its languages: ``source_lang`` / ``target_lang`` a code for every
    row, or ``source_lang_column`` / ``target_lang_column`` a column of codes per row (an empty cell
    takes the fixed code when one is given too); without them the constructor raises one line (a
    target language the model's generation settings force, ``forced_bos_token_id``, is the default
    ``target_lang``). A row whose code is unknown (or missing) gets "" and the reason in
    ``translation_error``.
    """

    def __init__(self, model: str, column: str = "text", *, output_column: str = "translation",
                 search: SearchConfig | None = None, device: str = "cpu", compute_type: str = "float32",
                 threads: int = 0, shortlist: str | None = None, max_batch_tokens: int = 0,
                 source_lang: str | None = None, target_lang: str | None = None,
                 source_lang_column: str | None = None, target_lang_column: str | None = None,
                 max_row_chars: int = MAX_ROW_CHARS, split_sentences: bool = True) -> None:
        from raymt.pipeline.decoders.api import Translator  # (torch: only inside the actor)

        self.column, self.output_column = column, output_column
        self._closed, self.stats = False, TranslateStats()
        self.translator = Translator.load(model, device=device, compute_type=compute_type, threads=threads,
                                          shortlist=shortlist, search=search,
                                          max_batch_tokens=max_batch_tokens, max_row_chars=max_row_chars,
                                          split_sentences=split_sentences)
        target_lang = target_lang or self.translator.core.default_target_lang  # (the model's forced_bos_token_id)
        self.languages = _Languages(source_lang, target_lang, source_lang_column, target_lang_column)
        self.languages.check(self.translator.core.checkpoint.tokenizer)
        self.search, self.device = self.translator.decode.search, self.translator.core.checkpoint.model.device
        self.batching = self.translator.decode.batching
        logger.info("Translate: %s on %s (%s), column %r -> %r", model, self.device, compute_type, column, output_column)

    def __call__(self, batch):
        if isinstance(batch, pa.Table):
            get = lambda name: batch.column(name).to_pylist()  # noqa: E731
        elif isinstance(batch, dict):
            get = lambda name: list(batch[name])  # noqa: E731
        else:  # pandas
            get = lambda name: batch[name].tolist()  # noqa: E731
        sources, targets = (None if not name else [_code(c) for c in get(name)]
                            for name in (self.languages.source_column, self.languages.target_column))
        out, errors = self.translate_texts(get(self.column), sources, targets)
        if isinstance(batch, pa.Table):
            return (batch.append_column(self.output_column, pa.array(out, pa.string()))
                    .append_column(ERROR_COLUMN, pa.array(errors, pa.string())))
        if isinstance(batch, dict):
            return {**batch, self.output_column: np.array(out, dtype=object),
                    ERROR_COLUMN: np.array(errors, dtype=object)}
        return batch.assign(**{self.output_column: out, ERROR_COLUMN: errors})

    def translate_texts(self, texts: list, source_langs: list[str | None] | None = None,
                        target_langs: list[str | None] | None = None) -> tuple[list[str], list[str | None]]:
        """Cells (and their rows' language cells) -> (translations, per-row error or None). A bad cell
        or language code gives "" and its reason; a batch that fails to decode is retried row by row,
        so one row never fails the others."""
        lang = self.languages
        tok = self.translator.core.checkpoint.tokenizer
        bad = row_language_problems(tok, source_langs, target_langs, lang.source, lang.target) or [None] * len(texts)
        errors = [row_error(t, self.translator.decode.max_row_chars) or b for t, b in zip(texts, bad)]
        good = [i for i, e in enumerate(errors) if e is None]
        src, tgt = lang.per_row(source_langs, target_langs, len(texts))
        pick = lambda codes, rows: codes if codes is None or isinstance(codes, str) else [codes[i] for i in rows]  # noqa: E731
        out = [""] * len(texts)
        try:
            translated = self._decode([texts[i] for i in good], pick(src, good), pick(tgt, good))
        except Exception:  # noqa: BLE001  (retried one by one below: the failing rows get the reason)
            logger.exception("a batch of %d rows failed to decode; retrying row by row", len(good))
            translated = []
            for i in good:
                try:
                    translated.extend(self._decode([texts[i]], pick(src, [i]), pick(tgt, [i])))
                except Exception as e:  # noqa: BLE001
                    translated.append("")
                    errors[i] = f"decode failed: {type(e).__name__}: {e}"[:500]
        for i, text in zip(good, translated):
            out[i] = text
        return out, errors

    def _decode(self, texts: list[str], source_lang=None, target_lang=None) -> list[str]:
        if not texts:
            return []
        t0, tokens = time.perf_counter(), self.translator.stats.target_tokens
        out = self.translator.translate(texts, source_lang=source_lang, target_lang=target_lang)
        self.stats = TranslateStats(self.stats.sentences + len(texts),
                                    self.stats.target_tokens + self.translator.stats.target_tokens - tokens,
                                    self.stats.seconds + time.perf_counter() - t0)
        return out

    def close(self) -> None:
        """Logs this actor's totals and frees the decoder's buffers (Ray calls it at actor teardown)."""
        if self._closed:
            return
        self._closed = True
        s = self.stats
        logger.info("Translate actor done: %d sentences, %d target tokens, %.1f s (%.1f tokens/s)",
                    s.sentences, s.target_tokens, s.seconds, s.tokens_per_second)
        self.translator.close()

    def __del__(self) -> None:
        if getattr(self, "translator", None) is not None:
            self.close()
