"""Outputs: parts committed per unit, exactly once (``sink``), what crosses actors or lands on disk (``records``), the plan record and the output's lease with its fence (``ledger``, ``lease``, ``disklock``), paths refused before any work (``guards``) and distillation columns from committed parts (``distill_columns``).

Imports fsspec, pyarrow, the shared modules, ``raymt.pipeline.inputs`` and ``raymt.pipeline.reports``; no ray, no torch."""
