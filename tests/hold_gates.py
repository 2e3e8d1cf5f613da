"""Gates that hold a job at a known point while a file exists: the hooks module of the fault tests.

A fault test that signals a job (Ctrl-C, SIGSTOP of an encoder) or changes its input must act while
the job is at a known point, not race its speed: on a fast machine a 400-row job can finish before
the signal lands. The test sets ``RAYMT_HOOKS=tests.hold_gates`` (``gate_env``) and a gate's
variable to a file's path; while that file exists, the job waits at the gate's observation point
(``raymt/pipeline/hooks.py``), polling every 50 ms, and the test removes the file to let it go on.
Both variables reach the job's Ray workers with its runtime environment (``ENV`` below).

    RAYMT_HOLD_AFTER_COMMIT   a decoder, after committing each unit (before reading the next)
    RAYMT_HOLD_BEFORE_ENCODE  an encoder, before reading each block of units
"""
from __future__ import annotations

import os
import time

from raymt.pipeline import hooks

AFTER_COMMIT = "RAYMT_HOLD_AFTER_COMMIT"
BEFORE_ENCODE = "RAYMT_HOLD_BEFORE_ENCODE"
ENV = (AFTER_COMMIT, BEFORE_ENCODE)
_GATES = {hooks.AFTER_COMMIT: AFTER_COMMIT, hooks.BEFORE_ENCODE: BEFORE_ENCODE}


def gate_env(gate: str, path: os.PathLike | str) -> dict[str, str]:
    """The variables that hold a job at ``gate`` (``AFTER_COMMIT`` or ``BEFORE_ENCODE``) while ``path`` exists."""
    return {hooks.HOOKS: __name__, gate: str(path)}


def at(point: str) -> None:
    """Wait while the file named by the point's gate variable exists (not at all when unset)."""
    gate = _GATES.get(point)
    path = os.environ.get(gate) if gate else None
    while path and os.path.exists(path):
        time.sleep(0.05)
