"""The float32 FMA peak this process's cores reach, measured: the ISA's theoretical peak at the clock
the cores really run (under a hypervisor /proc/cpuinfo's ``cpu MHz`` is often the nominal clock, and
a GEMM probe then reads above the "peak" computed from it).

Each thread runs a loop of independent fused multiply-adds on vector registers (``kChains`` chains,
more than two FMA units x 4 cycles of latency need), nothing from memory; FLOP/s = threads x
iterations x chains x lanes x 2 / seconds, best of a few windows. Built once with
``torch.utils.cpp_extension`` for the same instruction set as the native decode operators
(``raymt.workers.kernels.native``), so an emulated AVX2 run measures the AVX2 peak.
"""
from __future__ import annotations

import functools
import time

import torch

from raymt.workers.kernels.isa import CpuIsa
from raymt.workers.kernels.native import MARCH_FLAGS, build_target

SOURCE = r"""
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/extension.h>

using Vec = at::vec::Vectorized<float>;
constexpr int kChains = 12;

// iters x kChains FMAs per thread on every torch thread; the sum keeps the compiler from dropping them
double fma_loop(int64_t iters) {
  const int threads = at::get_num_threads();
  std::vector<float> sums(threads, 0.f);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      Vec acc[kChains];
      for (int c = 0; c < kChains; ++c) acc[c] = Vec(static_cast<float>(c + t));
      const Vec x(0.999999f), y(1e-7f);
      for (int64_t i = 0; i < iters; ++i)
        for (int c = 0; c < kChains; ++c) acc[c] = at::vec::fmadd(acc[c], x, y);
      Vec total(0.f);
      for (int c = 0; c < kChains; ++c) total = total + acc[c];
      float lanes[Vec::size()];
      total.store(lanes);
      for (int l = 0; l < Vec::size(); ++l) sums[t] += lanes[l];
    }
  });
  double s = 0;
  for (float v : sums) s += v;
  return s;
}

int64_t lanes() { return Vec::size(); }
int64_t chains() { return kChains; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fma_loop", &fma_loop);
  m.def("lanes", &lanes);
  m.def("chains", &chains);
}
"""


@functools.cache
def _module():
    from torch.utils.cpp_extension import load_inline
    target = build_target()
    return load_inline(f"raymt_fma_probe_{target.replace('-', '_')}", cpp_sources=[SOURCE],
                       extra_cflags=["-O3", "-fopenmp", *MARCH_FLAGS[target]], extra_ldflags=["-fopenmp"])


def fma_peak_gflops(threads: int, seconds: float = 0.5, windows: int = 5) -> float:
    """The best of ``windows`` timings of the FMA loop on ``threads`` torch threads, in GFLOP/s."""
    mod = _module()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        iters, best = 1 << 16, 0.0
        while True:  # grow to about seconds / windows a window
            start = time.perf_counter()
            mod.fma_loop(iters)
            took = time.perf_counter() - start
            if took >= seconds / windows / 4:
                break
            iters *= 4
        flops = threads * iters * mod.chains() * mod.lanes() * 2.0
        for _ in range(windows):
            start = time.perf_counter()
            mod.fma_loop(iters)
            best = max(best, flops / (time.perf_counter() - start) / 1e9)
        return best
    finally:
        torch.set_num_threads(before)


def isa_peak(threads: int, isa: CpuIsa, fma_units: int = 2) -> tuple[float, str]:
    """(measured FMA peak in GFLOP/s, how it reads: cores x the clock it implies x FLOP/cycle)."""
    peak = fma_peak_gflops(threads)
    per_cycle = isa.fp32_flops_per_cycle(fma_units)
    return peak, (f"{threads} cores x {peak / threads / per_cycle:.2f} GHz x {per_cycle} FLOP/cycle ({isa.level}, "
                  f"{fma_units} FMA units), measured by an FMA loop on registers (the clock it implies)")
