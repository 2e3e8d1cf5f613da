"""Kernels: the CPU's instruction set detected once (``isa``), the native C++ step operators (``csrc/``, built and loaded by ``native_build`` / ``native``), the CPU speed-ups that rewrite a loaded model (``speedups``) and the GPU's Triton kernels (``triton_ops``).

Imports torch and ``raymt.workers.model.model``: never the search, the decoder, ray, fsspec or pyarrow."""
