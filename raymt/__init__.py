"""raymt: Ray-distributed neural machine translation for whole corpora.

Its parts: ``raymt.workers`` (tensor math: model, search, scheduler, engine), ``raymt.pipeline`` (Ray
actors, storage, the job's driver) and ``raymt.jobs`` (the command lines); ``raymt`` is the command
(``raymt.cli``). The checkout's top-level ``workers/``, ``pipeline/`` and ``jobs/`` are links to them,
and every tool resolves ``raymt.*`` with no import hook (``tests/test_package_layout.py``).

    from raymt import Translator
    translator = Translator.load("models/demo-de-en")          # or an s3:// URL; device="cuda"
    translator.translate(["Ein Hund läuft."])                   # ['A dog is running.']
    translator.translate(["Ein Hund läuft."], nbest=2)          # [[(hypothesis, score), (..., ...)]]
"""
from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "Translator":  # imported on first use: ``import raymt`` stays light
        from raymt.pipeline.decoders.api import Translator
        return Translator
    raise AttributeError(f"module 'raymt' has no attribute {name!r}")


__all__ = ["Translator", "__version__"]
