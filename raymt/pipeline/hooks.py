"""Observation points: named places in a job where an outside module may be called.

``RAYMT_HOOKS`` names an importable module (``package.module``). When it is set, each
``point(name)`` the job passes calls that module's ``at(name: str)``; whatever ``at`` does (record,
wait, signal) happens at that place in the job, on the thread that reached it. The module is
imported once per process, at its first point, and an import error is raised there. Unset, as in an
ordinary job, a point costs one environment lookup.

The variable travels to every Ray worker with the job's runtime environment
(``pipeline/orchestration/ray_session.py``), together with the variables the module lists in its optional
``ENV`` tuple, so a hook reads the same settings in an actor as in the driver. The module must be
importable on every node (Ray puts the driver's working directory on its workers' path).

Points passed:

    after_commit    a decoder, after committing each unit (before taking the next)
    before_encode   an encoder, before reading each block of units
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

HOOKS = "RAYMT_HOOKS"
AFTER_COMMIT = "after_commit"
BEFORE_ENCODE = "before_encode"

_loaded: dict[str, ModuleType] = {}


def _module(name: str) -> ModuleType:
    module = _loaded.get(name)
    if module is None:
        module = _loaded[name] = importlib.import_module(name)
    return module


def point(name: str) -> None:
    """Call the ``RAYMT_HOOKS`` module's ``at(name)``; nothing when the variable is unset."""
    module = os.environ.get(HOOKS)
    if module:
        _module(module).at(name)


def worker_env() -> dict[str, str]:
    """The variables a Ray worker needs to call the same hooks: ``RAYMT_HOOKS`` and those of the
    module's ``ENV`` that are set here (empty when no hooks module is named)."""
    module = os.environ.get(HOOKS)
    if not module:
        return {}
    names = (HOOKS, *getattr(_module(module), "ENV", ()))
    return {k: os.environ[k] for k in names if k in os.environ}
