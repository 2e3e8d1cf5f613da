"""The decoder: the decode configuration and the per-call ``DecodeRequest`` (``decode_config``), the device decided once (``device``), the scheduler that owns the slots (``scheduler``, no torch), the one step loop ``schedule(); step(); update()`` (``engine``), what every decode call reuses (``runner``), the one-shape step (``static_step``), the batch-size tuner (``tuning``) and ``CoreDecoder``: a checkpoint plus a request -> translations.

Imports every other ``raymt.workers`` room; no ray, fsspec or pyarrow."""
