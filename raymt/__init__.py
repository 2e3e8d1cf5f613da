"""raymt: Ray-distributed neural machine translation for whole corpora.

The package's parts live in the project's top-level folders and install as ``raymt.workers``
(tensor math: model, search, scheduler, engine), ``raymt.pipeline`` (Ray actors, storage, the
job's driver) and ``raymt.jobs`` (the command lines); ``raymt`` is the command (``raymt.cli``). In a
checkout ``raymt/workers``, ``raymt/pipeline`` and ``raymt/jobs`` are links to those folders, so
Python, editors and type checkers resolve ``raymt.*`` alike (``tests/test_package_layout.py``).

    from raymt import Translator
    translator = Translator.load("models/demo-de-en")          # or an s3:// URL; device="cuda"
    translator.translate(["Ein Hund läuft."])                   # ['A dog is running.']
    translator.translate(["Ein Hund läuft."], nbest=2)          # [[(hypothesis, score), (..., ...)]]
"""
from __future__ import annotations

import os

__version__ = "0.1.0"

# A copy of a checkout without its links (``ray job submit --working-dir .`` packs the working
# directory without following them; a file system without links): the parts are its top-level folders.
_checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(os.path.dirname(__file__), "workers")) and \
        os.path.isfile(os.path.join(_checkout, "workers", "__init__.py")):
    __path__.append(_checkout)  # noqa: F821  (the package's own __path__)


def __getattr__(name: str):
    if name == "Translator":  # imported on first use: ``import raymt`` stays light
        from raymt.pipeline.api import Translator
        return Translator
    raise AttributeError(f"module 'raymt' has no attribute {name!r}")


__all__ = ["Translator", "__version__"]
