"""A decoder as the pipeline makes it: the model directory checked before any actor starts (``model_check``), shortlist files and word alignments (``shortlist_files``, ``alignment``), the one way a decoder is loaded (``loading``), the Python API (``api``), the Ray Data operator (``data_operator``), the heap trimmed between units (``heap``) and a decoder's Ray metrics (``metrics``).

Imports ``raymt.workers``, the shared modules, ``raymt.pipeline.outputs`` and ``raymt.pipeline.reports``."""
