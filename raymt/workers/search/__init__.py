"""The search: pure step math, a row's top candidates and their selection (``selection``), the beam rules in one place (``beam_rules``: finished pools, the stop test, pruning, length normalisation), the slots' beam state on the device (``beams``), sampling as a step's candidates (``sampling``), the shortlist vocabulary (``shortlist``), one step's indices (``step_index``) and the whole step after the decoder's hidden states (``search_step``).

Imports torch, ``raymt.workers.config`` and ``raymt.workers.model.model``: never the decoder, ray, fsspec or pyarrow."""
