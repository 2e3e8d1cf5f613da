"""A job end to end: check -> plan the work units (``units``) -> claim the output -> encoders -> decoders -> commit (``run``, ``driver``, ``dispatch``, ``feeds``), the job's settings and results (``settings``), the Ray session (``ray_session``), the thin actor shells (``actors``) and the in-process stream (``stream``).

The top room: imports every other ``raymt.pipeline`` room and ``raymt.workers``; none imports it."""
