"""The job's Ray session: joined or started once per driver, stopped on the way out.

    init_ray()    # join RAY_ADDRESS (or the submitted job's cluster), else start a local one
    stop_ray()    # disconnect; a local cluster this process started is stopped with it

Ctrl-C is held while Ray starts (cut short, a starting local cluster leaves its dashboard and agents
running) and ignored while it stops (Ray's own exit hook, interrupted, prints a traceback).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Iterator

from raymt.pipeline import hooks
from raymt.pipeline.hub import WORKER_VARS

_started_here = False  # whether init_ray started a local cluster (not joined one)
_AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
             "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION")


def init_ray(**kwargs) -> None:
    """Join ``RAY_ADDRESS`` (or the job's cluster under ``ray job submit``), else start a local one.

    The AWS variables of the driver are passed to every worker, so s3:// works the same in actors
    (and the job's observation hooks, ``pipeline/hooks.py``), and so are ``HF_TOKEN`` and ``HF_ENDPOINT``
    (each node fetches a hub model into its own cache: ``pipeline/hub.py``).
    """
    import ray
    from ray.data import DataContext
    DataContext.get_current().enable_progress_bars = False  # the job prints its own progress lines
    for name, level in (("ray.data._internal.progress", logging.ERROR), ("ray.data", logging.WARNING)):
        logging.getLogger(name).setLevel(level)  # "progress bars disabled", per-dataset INFO lines
    if ray.is_initialized():
        return
    env = {**{k: os.environ[k] for k in _AWS_VARS + WORKER_VARS if k in os.environ}, **hooks.worker_env()}
    global _started_here
    _started_here = not (kwargs.get("address") or os.environ.get("RAY_ADDRESS") or os.environ.get("RAY_JOB_ID"))
    with interrupts_deferred():  # cut short, a starting local cluster leaves its dashboard and agents running
        ray.init(runtime_env={"env_vars": env} if env else None, **kwargs)


@contextlib.contextmanager
def interrupts_deferred(ignore: bool = False) -> Iterator[None]:
    """Ctrl-C held while the block runs (Ray starting or stopping), then raised as ``KeyboardInterrupt``
    when it ends; ``ignore``: dropped instead (a second Ctrl-C while the job stops). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if ignore else lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def stop_ray() -> None:
    """Stop the local cluster this process started, with further Ctrl-C ignored meanwhile
    (interrupted, Ray's own exit hook would print a traceback and leave processes); a joined
    cluster is left to Ray's exit hook, as it runs on without this process."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or not _started_here:
        return
    with interrupts_deferred(ignore=True):
        ray.shutdown()
