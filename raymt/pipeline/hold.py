"""Gates that hold a job at a known point while a file exists, for fault tests.

A fault test that signals a job (Ctrl-C, SIGSTOP of an encoder) or changes its input must act while
the job is at a known point, not race its speed: on a fast machine a 400-row job can finish before
the signal lands. Each gate is an environment variable naming a file; while that file exists, the
job waits at the gate's point (polling every 50 ms), and the test removes the file to let it go on.
The variables travel to every Ray worker with the job's runtime environment (``pipeline/run.py``).
Unset, as in every real job, a gate costs one environment lookup.

    RAYMT_HOLD_AFTER_COMMIT   a decoder, after committing each unit (before reading the next)
    RAYMT_HOLD_BEFORE_ENCODE  an encoder, before reading each block of units
"""
from __future__ import annotations

import os
import time

AFTER_COMMIT = "RAYMT_HOLD_AFTER_COMMIT"
BEFORE_ENCODE = "RAYMT_HOLD_BEFORE_ENCODE"
GATES = (AFTER_COMMIT, BEFORE_ENCODE)


def hold(gate: str) -> None:
    """Wait while the file named by the environment variable ``gate`` exists (not at all when unset)."""
    path = os.environ.get(gate)
    while path and os.path.exists(path):
        time.sleep(0.05)
