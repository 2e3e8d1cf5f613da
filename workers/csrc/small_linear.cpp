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
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kW = Vec::size();
// register tiles: 6 x 4 = 24 accumulators + 4 weight vectors + 1 broadcast within AVX512's 32
// registers; 4 x 3 = 12 + 3 + 1 fill AVX2's 16 (two FMA units of 4-cycle latency need at least 8
// independent sums; measured on 2 AMD EPYC threads under AVX2, (160 x 512) x (512 x 512): 4 x 2
// 214 GFLOP/s, 6 x 2 229, 4 x 3 233-239, 3 x 4 236-242; under AVX-512 6 x 4 stays the best of
// 6 x 4, 8 x 3, 4 x 6, 12 x 2)
constexpr int kMaxRows = kW >= 16 ? 6 : 4, kBlocks = kW >= 16 ? 4 : 3;
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

TileFn tile_fn(int rows, int blocks) {
  return tile_of(rows, blocks, std::make_integer_sequence<int, kMaxRows * kBlocks>{});
}

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

// The output layer and the search's first step in one pass: logits = x W^T + b, then each row's
// log-softmax, one column banned (<pad>) from the top-k but kept in the normaliser, and its k best
// (head_top_log_softmax). The (M, N) logits are never written: over a 58k-word vocabulary at 160
// rows they are 37 MB a step, written by the product and read again by the softmax, on 2 cores
// ~25% of the output layer's time. Each panel of kBlocks blocks computes its row groups' tiles into
// a buffer that stays in L1 and folds them, while hot, into
//   * the panel's maximum and its sum of exp(logit - panel max), per row: (M, panels) partials,
//     combined after the product in panel order (max, then sum of psum * exp(pmax - max)), so the
//     normaliser does not depend on how the panels were split over threads;
//   * a top-k per row and thread (only lanes above the thread's k-th best are looked at), merged
//     after the product with ties going to the lower column, as a single scan would.
// The log-probs equal ATen's log_softmax + topk on the same logits to float32 rounding of the
// normaliser (another summation order), and the columns are the same ones.
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// (value, index) into best/where (descending, length k) if it beats the last entry; ties go to the
// lower index (entries arrive in no particular order when threads' lists merge).
inline void insert_ranked(float value, int64_t index, float* best, int64_t* where, int64_t k) {
  if (!(value > best[k - 1] || (value == best[k - 1] && index < where[k - 1]))) return;
  int64_t p = k - 1;
  while (p > 0 && (value > best[p - 1] || (value == best[p - 1] && index < where[p - 1]))) {
    best[p] = best[p - 1];
    where[p] = where[p - 1];
    --p;
  }
  best[p] = value;
  where[p] = index;
}

}  // namespace

// x (M, K), packed and bias as small_linear's; k best per row; skip a column (or -1) -> (log_probs
// (M, k), columns (M, k) int64), best first. Slots no column fills hold -inf and ``skip`` (or 0).
std::tuple<at::Tensor, at::Tensor> head_top_log_softmax(const at::Tensor& x, const at::Tensor& packed,
                                                        const c10::optional<at::Tensor>& bias, int64_t k_top,
                                                        int64_t skip, int64_t n_out) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "head_top_log_softmax: x must be a contiguous float32 (M, K) tensor");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kFloat && packed.is_contiguous() &&
              packed.size(1) == x.size(1) && packed.size(2) == kW,
              "head_top_log_softmax: packed must be a contiguous float32 (ceil(N / W), K, W) tensor, W = ", kW);
  const int64_t m = x.size(0), k = x.size(1), blocks = packed.size(0), n = n_out < 0 ? blocks * kW : n_out;
  TORCH_CHECK(n > (blocks - 1) * kW && n <= blocks * kW, "head_top_log_softmax: ", n,
              " outputs do not fill the last of ", blocks, " blocks of ", kW);
  TORCH_CHECK(k_top >= 1 && k_top <= n, "head_top_log_softmax: k must be in [1, N]");
  const float* bias_p = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "head_top_log_softmax: bias must be a contiguous float32 (N,) tensor");
    bias_p = bias->data_ptr<float>();
  }
  const int64_t panels = (blocks + kBlocks - 1) / kBlocks, span = kBlocks * kW;
  const int threads = at::get_num_threads();
  const int64_t fill = skip >= 0 && skip < n ? skip : 0;
  std::vector<float> pmax(m * panels), psum(m * panels);  // (M, panels)
  std::vector<float> tbest(threads * m * k_top, kNegInf);  // (threads, M, k)
  std::vector<int64_t> twhere(threads * m * k_top, fill);
  const float *x_p = x.data_ptr<float>(), *w_p = packed.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    const int tid = at::get_thread_num();
    float* my_best = tbest.data() + tid * m * k_top;
    int64_t* my_where = twhere.data() + tid * m * k_top;
    alignas(64) float buf[kMaxRows * kBlocks * kW];  // one row group's tile, (rows, span)
    for (int64_t p = begin; p < end; ++p) {
      const int64_t b0 = p * kBlocks, c0 = b0 * kW;
      const int nb = static_cast<int>(std::min<int64_t>(kBlocks, blocks - b0));
      const int last = static_cast<int>(std::min<int64_t>(kW, n - (b0 + nb - 1) * kW));
      const int64_t cols = (nb - 1) * kW + last;  // the panel's real columns
      for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m - r0));
        tile_fn(rows, nb)(x_p + r0 * k, k, w_p + b0 * k * kW, bias_p ? bias_p + c0 : nullptr, buf, span, kNone, last);
        for (int r = 0; r < rows; ++r) {
          float* row = buf + r * span;
          std::fill(row + cols, row + span, kNegInf);
          Vec vmax(kNegInf);
          for (int64_t j = 0; j < span; j += kW) vmax = at::vec::maximum(vmax, Vec::loadu(row + j));
          const float mx = at::vec::vec_reduce_all<float>([](Vec a, Vec b) { return at::vec::maximum(a, b); }, vmax);
          Vec vsum(0.f);
          for (int64_t j = 0; j < span; j += kW) vsum = vsum + (Vec::loadu(row + j) - Vec(mx)).exp();
          const int64_t at_row = (r0 + r) * panels + p;
          pmax[at_row] = mx;
          psum[at_row] = at::vec::vec_reduce_all<float>([](Vec a, Vec b) { return a + b; }, vsum);
          float* best = my_best + (r0 + r) * k_top;
          int64_t* where = my_where + (r0 + r) * k_top;
          for (int64_t j = 0; j < span; j += kW) {  // only lanes above the k-th best are looked at
            const int above = (Vec::loadu(row + j) > Vec(best[k_top - 1])).zero_mask() ^ ((1 << kW) - 1);
            if (!above) continue;
            for (int lane = 0; lane < kW; ++lane)
              if ((above & (1 << lane)) && c0 + j + lane != skip)
                insert_ranked(row[j + lane], c0 + j + lane, best, where, k_top);
          }
        }
      }
    }
  });
  auto values = at::empty({m, k_top}, x.options());
  auto ids = at::empty({m, k_top}, x.options().dtype(at::kLong));
  float* out_v = values.data_ptr<float>();
  int64_t* out_i = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < m; ++r) {
    float* best = out_v + r * k_top;
    int64_t* where = out_i + r * k_top;
    std::copy(tbest.begin() + r * k_top, tbest.begin() + (r + 1) * k_top, best);
    std::copy(twhere.begin() + r * k_top, twhere.begin() + (r + 1) * k_top, where);
    for (int t = 1; t < threads; ++t)
      for (int64_t c = 0; c < k_top; ++c)
        insert_ranked(tbest[(t * m + r) * k_top + c], twhere[(t * m + r) * k_top + c], best, where, k_top);
    const float* pm = pmax.data() + r * panels;
    const float* ps = psum.data() + r * panels;
    const float mx = *std::max_element(pm, pm + panels);
    float sum = 0.f;
    for (int64_t p = 0; p < panels; ++p) sum += ps[p] * std::exp(pm[p] - mx);
    const float norm = mx + std::log(sum);
    for (int64_t c = 0; c < k_top; ++c) best[c] -= norm;
  }
  return {values, ids};
}

TORCH_LIBRARY_FRAGMENT(raymt, m) {
  m.def("small_linear(Tensor x, Tensor packed, Tensor? bias, int act, int n=-1) -> Tensor");
  m.def("head_top_log_softmax(Tensor x, Tensor packed, Tensor? bias, int k, int skip, int n=-1) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(raymt, CPU, m) {
  m.impl("small_linear", &small_linear);
  m.impl("head_top_log_softmax", &head_top_log_softmax);
}
