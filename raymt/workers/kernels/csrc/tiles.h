// The register tile of the native float32 products (small_linear.cpp, head_top.cpp): R rows of x
// times B blocks of a weight packed as (ceil(N / W), K, W), W = Vec::size() floats per register.
// Sums run over k in order with FMA. Dimension letters: M rows, K inputs, N outputs.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cstdint>
#include <utility>

namespace raymt_tiles {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kW = Vec::size();
// register tiles: 6 x 4 = 24 accumulators + 4 weight vectors + 1 broadcast within AVX512's 32
// registers; 4 x 3 = 12 + 3 + 1 fill AVX2's 16 (two FMA units of 4-cycle latency need at least 8
// independent sums; measured on 2 AMD EPYC threads under AVX2, (160 x 512) x (512 x 512): 4 x 2
// 214 GFLOP/s, 6 x 2 229, 4 x 3 233-239, 3 x 4 236-242; under AVX-512 6 x 4 stays the best of
// 6 x 4, 8 x 3, 4 x 6, 12 x 2)
constexpr int kMaxRows = kW >= 16 ? 6 : 4, kBlocks = kW >= 16 ? 4 : 3;
enum Act { kNone = 0, kSwish = 1, kRelu = 2 };  // the activation applied to the output tile

// R rows of x (stride K) times B consecutive weight blocks (block b at w + b * K * kW) -> y (stride
// N); the last block writes its first ``last`` columns only (kW where it is whole).
template <int R, int B>
void tile(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t N, int act, int last) {
  Vec acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = Vec(0.f);
  for (int64_t k = 0; k < K; ++k) {
    Vec wv[B];
    for (int b = 0; b < B; ++b) wv[b] = Vec::loadu(w + (b * K + k) * kW);
    for (int r = 0; r < R; ++r) {
      const Vec xv(x[r * K + k]);
      for (int b = 0; b < B; ++b) acc[r][b] = at::vec::fmadd(xv, wv[b], acc[r][b]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) {
      const int width = b == B - 1 ? last : static_cast<int>(kW);
      Vec out = acc[r][b];
      if (bias) out = out + Vec::loadu(bias + b * kW, width);
      if (act == kSwish) out = out / (Vec(1.f) + out.neg().exp());  // x * sigmoid(x)
      if (act == kRelu) out = at::vec::maximum(out, Vec(0.f));
      out.store(y + r * N + b * kW, width);
    }
}

using TileFn = void (*)(const float*, int64_t, const float*, const float*, float*, int64_t, int, int);

// The tile of ``rows`` x ``blocks`` (1..kMaxRows x 1..kBlocks), from a table the compiler builds.
template <int... I>
TileFn tile_of(int rows, int blocks, std::integer_sequence<int, I...>) {
  static constexpr TileFn fns[] = {&tile<I / kBlocks + 1, I % kBlocks + 1>...};
  return fns[(rows - 1) * kBlocks + blocks - 1];
}

inline TileFn tile_fn(int rows, int blocks) {
  return tile_of(rows, blocks, std::make_integer_sequence<int, kMaxRows * kBlocks>{});
}

}  // namespace raymt_tiles
