// Small float32 products y = x W^T + b, a decoder step's few rows (torch.ops.raymt.small_linear).
//
// oneDNN's prepacked linear costs ~10-20 us per call before any arithmetic (primitive lookup,
// memory wrappers; measured on 2 AMD EPYC threads: 23 us for 1 row of 256 x 256, single-threaded
// too), which a greedy step at ~20 rows pays 15 times. This kernel takes the weight packed once
// into column blocks of one vector register, (ceil(N / W), K, W) with W = Vec::size() (the last
// block zero-padded where W does not divide N, e.g. an 8001-word output layer), and computes tiles
// of up to kMaxRows rows x kBlocks blocks in registers: per k, kBlocks weight loads and one
// broadcast per row feed rows x kBlocks fused multiply-adds. Sums run over k in order with FMA, so
// results equal x W^T + b to float32 rounding (another order than oneDNN's or MKL's).
// Dimension letters: M rows, K inputs, N outputs, W floats per vector register.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "tiles.h"

#include <algorithm>

namespace {

using namespace raymt_tiles;

constexpr int64_t kSerialWork = 1 << 18;  // multiply-adds below which one thread does it all
// Under AVX2 each thread prefetches its next panel of weights while the row groups of the current
// one compute: the first row group over a panel otherwise waits on memory (the decoder's weights,
// ~100 MB, do not stay cached between steps). Measured on 2 AMD EPYC threads, base-size model,
// Multi30k x300, beam 5: 0.7-3.8% less wall time under AVX2 in four alternating pairs; under
// AVX-512, whose panels are 2.7x larger and whose hardware prefetch keeps up, 3% more.
#if defined(CPU_CAPABILITY_AVX2)
constexpr bool kPrefetchNext = true;
#else
constexpr bool kPrefetchNext = false;  // AVX-512, and the portable build (unmeasured there)
#endif
constexpr int64_t kLine = 64;  // bytes per cache line, the prefetch's stride

}  // namespace

// x (M, K) float32 contiguous; packed (ceil(N / W), K, W) float32 contiguous (the weight (N, K),
// zero-padded to whole blocks, as ``weight.view(N / W, W, K).transpose(1, 2).contiguous()``); bias (N,)
// or None; act 0 none, 1 swish, 2 relu (applied after the bias); n the outputs N (-1: all the
// blocks' columns) -> y (M, N).
at::Tensor small_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                        int64_t act, int64_t n_out) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "small_linear: x must be a contiguous float32 (M, K) tensor");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kFloat && packed.is_contiguous() &&
              packed.size(1) == x.size(1) && packed.size(2) == kW,
              "small_linear: packed must be a contiguous float32 (ceil(N / W), K, W) tensor, W = ", kW);
  TORCH_CHECK(act >= kNone && act <= kRelu, "small_linear: act must be 0 (none), 1 (swish) or 2 (relu)");
  const int64_t m = x.size(0), k = x.size(1), blocks = packed.size(0), n = n_out < 0 ? blocks * kW : n_out;
  TORCH_CHECK(n > (blocks - 1) * kW && n <= blocks * kW, "small_linear: ", n, " outputs do not fill the last of ",
              blocks, " blocks of ", kW);
  const float* bias_p = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "small_linear: bias must be a contiguous float32 (N,) tensor");
    bias_p = bias->data_ptr<float>();
  }
  auto y = at::empty({m, n}, x.options());
  const float *x_p = x.data_ptr<float>(), *w_p = packed.data_ptr<float>();
  float* y_p = y.data_ptr<float>();
  const int64_t panels = (blocks + kBlocks - 1) / kBlocks;
  const int64_t grain = m * k * n < kSerialWork ? panels : 1;
  at::parallel_for(0, panels, grain, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t b0 = p * kBlocks;
      const int nb = static_cast<int>(std::min<int64_t>(kBlocks, blocks - b0));
      const int last = static_cast<int>(std::min<int64_t>(kW, n - (b0 + nb - 1) * kW));  // the tile's last block
      // the next panel's bytes, fetched a share per row group (none: kPrefetchNext off, or the thread's last panel)
      const int64_t next_bytes = kPrefetchNext && p + 1 < end
          ? std::min<int64_t>(kBlocks, blocks - b0 - kBlocks) * k * kW * static_cast<int64_t>(sizeof(float)) : 0;
      const char* next = next_bytes ? reinterpret_cast<const char*>(w_p + (b0 + kBlocks) * k * kW) : nullptr;
      const int64_t share = (next_bytes + m - 1) / m * kMaxRows;  // bytes per row group, rounded up
      int64_t fetched = 0;
      for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m - r0));
        for (const int64_t stop = std::min(next_bytes, fetched + share); fetched < stop; fetched += kLine)
          __builtin_prefetch(next + fetched, 0, 2);  // one line, for reading, into L2
        tile_fn(rows, nb)(x_p + r0 * k, k, w_p + b0 * k * kW, bias_p ? bias_p + b0 * kW : nullptr,
                          y_p + r0 * n + b0 * kW, n, static_cast<int>(act), last);
      }
    }
  });
  return y;
}

TORCH_LIBRARY_FRAGMENT(raymt, m) {
  m.def("small_linear(Tensor x, Tensor packed, Tensor? bias, int act, int n=-1) -> Tensor");
}

TORCH_LIBRARY_IMPL(raymt, CPU, m) { m.impl("small_linear", &small_linear); }
