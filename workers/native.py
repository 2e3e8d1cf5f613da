"""Native decode-step operators (``workers/csrc/decode_ops.cpp``), built on first use and cached.

At decoding shapes a step's non-GEMM work is many small ATen calls, each paying dispatch and
allocation; these three fuse the costliest chains (measured on this 2-core AVX512 VM, 160 rows):

* ``row_top_log_softmax``: log-softmax + ``<pad>`` ban + top-k over the vocabulary as one top-k
  scan and one exp-sum scan per row, the (N, V) log-probs never written (the top-up paper's fused
  softmax + top-k). Bit-equal to ATen's ``log_softmax`` + ``topk`` (same vectorised max, exp-sum
  and log); 4x faster at (160, 8001).
* ``self_attention``: one query per row over the time-major self-attention cache; ~2x.
* ``cross_attention``: one query per row over its sentence's cached source K/V; ~1.7x.

The attention kernels sum in another order than MKL's batched GEMMs: float32 results equal to
~1e-6, as the oneDNN layers are. The extension is compiled for the instruction set ATen itself
dispatches to (``torch.backends.cpu.get_cpu_capability()``), with torch's own vector types and
thread pool, and registered as torch operators (``torch.ops.raymt.*``, named in profiles), by ``torch.utils.cpp_extension`` (g++ and ninja; cached under
``TORCH_EXTENSIONS_DIR``, rebuilt when the source changes). Where it cannot be built, ``load``
says why once and returns None, and the decoder runs the ATen path.
"""
from __future__ import annotations

import functools
import logging
import os
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

SOURCE = os.path.join(os.path.dirname(__file__), "csrc", "decode_ops.cpp")
ISA_FLAGS = {  # ATen's own per-capability compile flags (its CPU_CAPABILITY kernels)
    "AVX512": ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl",
               "-mavx512dq", "-mfma"],
    "AVX2": ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"],
}


@functools.cache
def load() -> ModuleType | None:
    """The compiled operators (``torch.ops.raymt``), or None (with one warning saying why) where they cannot be built."""
    capability = torch.backends.cpu.get_cpu_capability()
    try:
        from torch.utils.cpp_extension import load as build

        build(f"raymt_decode_ops_{capability.lower()}", [SOURCE], verbose=False, is_python_module=False,
              extra_cflags=["-O3", "-fopenmp", *ISA_FLAGS.get(capability, [])], extra_ldflags=["-fopenmp"])
        return torch.ops.raymt
    except Exception as err:  # no compiler, no ninja, unwritable cache: the ATen path still decodes
        logger.warning("native decode operators unavailable (%s: %s); decoding with ATen operators",
                       type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        return None
