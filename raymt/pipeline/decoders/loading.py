"""The one way a decoder is made from a model and a ``DecodeConfig``: the Python API
(``raymt.Translator``), the decoder actors and the stream path all call ``load_decoder``, so the
threads, the batch size, batch tuning and the shortlist follow the same rules everywhere.

    decoder = load_decoder("models/demo-de-en", decode)          # decode: a DecodeConfig
    request = decode.request(decoder.shortlist)                  # built once, passed to every call
    decoder.translator.decode_ids(pieces, request)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from raymt.pipeline.storage import model_reader
from raymt.workers.checkpoints.checkpoint import Reader
from raymt.workers.decoder.decode_config import DecodeConfig
from raymt.workers.decoder.device import resolve_device
from raymt.workers.search.shortlist import AnyShortlist
from raymt.workers.decoder.core_decoder import CoreDecoder


@dataclass(frozen=True)
class LoadedDecoder:
    """A model loaded for one ``DecodeConfig``: its translator and the shortlist it decodes with (or None)."""

    translator: CoreDecoder
    shortlist: AnyShortlist | None


def load_decoder(model: str | Reader, decode: DecodeConfig, *, device: torch.device | None = None,
                 pins: tuple[tuple[str, str], ...] = ()) -> LoadedDecoder:
    """``model`` (a directory, URL or hub id, or a reader ``model_reader`` already opened) loaded as
    ``decode`` says: ``decode.runtime``'s threads (0: torch's own default), precision and device
    (``device`` overrides it: a Ray actor's assigned GPU), ``decode.batching``'s batch size (tuned here
    when ``tune`` is set), ``decode.shortlist``'s table. ``pins``: (file name, SHA-256) of the model
    files a job planned with (a path or id only); a file that differs raises ``ModelChanged``
    (``raymt.pipeline.storage.model_reader``)."""
    rt = decode.runtime
    reader = model_reader(model, pins) if isinstance(model, str) else model
    translator = CoreDecoder.load(reader, threads=rt.threads or None, speedups=rt.speedups,
                                 max_batch_size=decode.batching.max_batch_size,
                                 device=device if device is not None else resolve_device(rt.device))
    if decode.batching.tune:
        translator.tune_batches(decode.search)
    shortlist = None
    if decode.shortlist:
        from raymt.pipeline.decoders.shortlist_files import load_shortlist

        shortlist = load_shortlist(decode.shortlist.path, translator.checkpoint.tokenizer, top_m=decode.shortlist.top_m,
                                   top_n=decode.shortlist.top_n, special_ids=translator.special_target_ids())
    return LoadedDecoder(translator, shortlist)
