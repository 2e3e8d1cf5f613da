"""``Translate``: a Ray Data operator that translates one column of a ``Dataset``.

    ds = ray.data.read_parquet("corpus/")
    ds = ds.map_batches(Translate, fn_constructor_kwargs={"model": "models/demo-de-en", "column": "text"},
                        concurrency=4)
    ds.write_parquet("translated/")

Every other column passes through; a ``translation`` column (``output_column``) and a
``translation_error`` column (null, or why the row was not translated) are added. Search settings
and batching default to the command line's (``raymt.workers.decode_config``). One model per actor,
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
from raymt.workers.decode_config import DEFAULTS

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


def row_error(value) -> str | None:
    """Why a cell cannot be translated, or None when it can."""
    if value is None or type(value).__name__ == "NAType" or (isinstance(value, float) and np.isnan(value)):
        return "null"
    if not isinstance(value, str):
        return f"not a string: {type(value).__name__}"
    if not value.strip():
        return "empty"
    return None


class Translate:
    """A callable class for ``Dataset.map_batches``: translates ``column`` into ``output_column``.

    The model loads once per actor through the Python API (``raymt.Translator.load``: ``model`` a
    directory or URL, ``device`` cpu | cuda | cuda:N | auto, ``compute_type`` float32 | int8 |
    bfloat16 | float16, ``threads``, ``shortlist``, ``max_batch_tokens``); ``search``: the beam search
    (default: the command line's). Cells go through the job's row path (``raymt.workers.rows``): a
    cell longer than the model's positions is split and joined, control characters are removed.
    Rows arrive in any batch format (pyarrow, pandas, numpy dicts) and leave in the same one.
    """

    def __init__(self, model: str, column: str = "text", *, output_column: str = "translation",
                 search: SearchConfig | None = None, device: str = "cpu", compute_type: str = "float32",
                 threads: int = 0, shortlist: str | None = None, max_batch_tokens: int = 0) -> None:
        from raymt.pipeline.api import Translator  # (torch: only inside the actor)

        self.column, self.output_column = column, output_column
        self.translator = Translator.load(model, device=device, compute_type=compute_type, threads=threads,
                                          shortlist=shortlist, search=search or DEFAULTS.search,
                                          max_batch_tokens=max_batch_tokens)
        self.search, self.device = self.translator.decode.search, self.translator.core.checkpoint.model.device
        self.batching = self.translator.decode.batching
        self.stats = TranslateStats()
        self._closed = False
        logger.info("Translate: %s on %s (%s), column %r -> %r", model, self.device, compute_type, column, output_column)

    def __call__(self, batch):
        if isinstance(batch, pa.Table):
            texts = batch.column(self.column).to_pylist()
            out, errors = self.translate_texts(texts)
            return (batch.append_column(self.output_column, pa.array(out, pa.string()))
                    .append_column(ERROR_COLUMN, pa.array(errors, pa.string())))
        if isinstance(batch, dict):
            texts = list(batch[self.column])
            out, errors = self.translate_texts(texts)
            return {**batch, self.output_column: np.array(out, dtype=object),
                    ERROR_COLUMN: np.array(errors, dtype=object)}
        texts = batch[self.column].tolist()  # pandas
        out, errors = self.translate_texts(texts)
        return batch.assign(**{self.output_column: out, ERROR_COLUMN: errors})

    def translate_texts(self, texts: list) -> tuple[list[str], list[str | None]]:
        """Cells -> (translations, per-row error or None). A bad cell gives "" and its reason; a
        batch that fails to decode is retried row by row, so one row never fails the others."""
        errors = [row_error(t) for t in texts]
        good = [i for i, e in enumerate(errors) if e is None]
        out = [""] * len(texts)
        try:
            translated = self._decode([texts[i] for i in good])
        except Exception:  # noqa: BLE001  (retried one by one below: the failing rows get the reason)
            logger.exception("a batch of %d rows failed to decode; retrying row by row", len(good))
            translated = []
            for i in good:
                try:
                    translated.extend(self._decode([texts[i]]))
                except Exception as e:  # noqa: BLE001
                    translated.append("")
                    errors[i] = f"decode failed: {type(e).__name__}: {e}"[:500]
        for i, text in zip(good, translated):
            out[i] = text
        return out, errors

    def _decode(self, texts: list[str]) -> list[str]:
        if not texts:
            return []
        t0, tokens = time.perf_counter(), self.translator.stats.target_tokens
        out = self.translator.translate(texts)
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
