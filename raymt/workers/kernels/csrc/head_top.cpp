// The output layer and the search's first step in one pass (torch.ops.raymt.head_top_log_softmax):
// logits = x W^T + b, then each row's log-softmax, one column banned (<pad>) from the top-k but kept
// in the normaliser, and its k best. The (M, N) logits are never written: over a 58k-word vocabulary at 160 rows they are 37 MB a step, written by the product and
// read again by the softmax. Each panel of blocks computes its row groups' tiles into a buffer that
// stays in L1 and folds them, while hot, into (``HeadFold``)
//   * the panel's maximum and its sum of exp(logit - panel max), per row: (M, panels) partials,
//     combined after the product in panel order (max, then sum of psum * exp(pmax - max)), so the
//     normaliser does not depend on how the panels were split over threads;
//   * a top-k per row and thread (only lanes above the thread's k-th best are looked at), merged
//     after the product with ties going to the lower column, as a single scan would.
// The log-probs equal ATen's log_softmax + topk on the same logits to float32 rounding of the
// normaliser (another summation order), and the columns are the same ones. The product is
// small_linear's register tile (tiles.h).
// Dimension letters: M rows, K inputs, N outputs, W columns per block (lanes of one register).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "tiles.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using namespace raymt_tiles;
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

// The softmax partials and top-k lists of one call (see the file's comment).
struct HeadFold {
  int64_t m, panels, k, skip;
  std::vector<float> pmax, psum, tbest;  // (M, panels) x 2, (threads, M, k)
  std::vector<int64_t> twhere;           // (threads, M, k)

  HeadFold(int64_t m, int64_t panels, int64_t k, int64_t skip, int64_t n)
      : m(m), panels(panels), k(k), skip(skip), pmax(m * panels), psum(m * panels),
        tbest(at::get_num_threads() * m * k, kNegInf),
        twhere(at::get_num_threads() * m * k, skip >= 0 && skip < n ? skip : 0) {}

  // Row r's logits over panel p (columns c0..c0 + cols - 1; ``row`` holds span floats, those past
  // cols are overwritten with -inf) into its partials and thread tid's top-k.
  void fold(float* row, int64_t span, int64_t cols, int64_t r, int64_t p, int64_t c0, int tid) {
    std::fill(row + cols, row + span, kNegInf);
    Vec vmax(kNegInf);
    for (int64_t j = 0; j < span; j += kW) vmax = at::vec::maximum(vmax, Vec::loadu(row + j));
    const float mx = at::vec::vec_reduce_all<float>([](Vec a, Vec b) { return at::vec::maximum(a, b); }, vmax);
    Vec vsum(0.f);
    for (int64_t j = 0; j < span; j += kW) vsum = vsum + (Vec::loadu(row + j) - Vec(mx)).exp();
    pmax[r * panels + p] = mx;
    psum[r * panels + p] = at::vec::vec_reduce_all<float>([](Vec a, Vec b) { return a + b; }, vsum);
    float* best = tbest.data() + (tid * m + r) * k;
    int64_t* where = twhere.data() + (tid * m + r) * k;
    for (int64_t j = 0; j < span; j += kW) {  // only lanes above the k-th best are looked at
      const int above = (Vec::loadu(row + j) > Vec(best[k - 1])).zero_mask() ^ ((1 << kW) - 1);
      if (!above) continue;
      for (int lane = 0; lane < kW; ++lane)
        if ((above & (1 << lane)) && c0 + j + lane != skip) insert_ranked(row[j + lane], c0 + j + lane, best, where, k);
    }
  }

  // Merge the threads' lists, normalise -> (log_probs (M, k), columns (M, k)).
  std::tuple<at::Tensor, at::Tensor> finish(const at::TensorOptions& options) const {
    const int threads = static_cast<int>(tbest.size() / (m * k));
    auto values = at::empty({m, k}, options);
    auto ids = at::empty({m, k}, options.dtype(at::kLong));
    float* out_v = values.data_ptr<float>();
    int64_t* out_i = ids.data_ptr<int64_t>();
    for (int64_t r = 0; r < m; ++r) {
      float* best = out_v + r * k;
      int64_t* where = out_i + r * k;
      std::copy(tbest.begin() + r * k, tbest.begin() + (r + 1) * k, best);
      std::copy(twhere.begin() + r * k, twhere.begin() + (r + 1) * k, where);
      for (int t = 1; t < threads; ++t)
        for (int64_t c = 0; c < k; ++c) insert_ranked(tbest[(t * m + r) * k + c], twhere[(t * m + r) * k + c], best, where, k);
      const float* pm = pmax.data() + r * panels;
      const float* ps = psum.data() + r * panels;
      const float mx = *std::max_element(pm, pm + panels);
      float sum = 0.f;
      for (int64_t p = 0; p < panels; ++p) sum += ps[p] * std::exp(pm[p] - mx);
      const float norm = mx + std::log(sum);
      for (int64_t c = 0; c < k; ++c) best[c] -= norm;
    }
    return {values, ids};
  }
};

const float* checked_bias(const c10::optional<at::Tensor>& bias, int64_t n, const char* op) {
  if (!bias.has_value()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n, op,
              ": bias must be a contiguous float32 (N,) tensor");
  return bias->data_ptr<float>();
}

}  // namespace

// x (M, K), packed (ceil(N / W), K, W) float32 and bias as small_linear's; k best per row; skip a
// column (or -1) -> (log_probs (M, k), columns (M, k) int64), best first. Slots no column fills hold
// -inf and ``skip`` (or 0).
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
  const float* bias_p = checked_bias(bias, n, "head_top_log_softmax");
  const int64_t panels = (blocks + kBlocks - 1) / kBlocks, span = kBlocks * kW;
  HeadFold fold(m, panels, k_top, skip, n);
  const float *x_p = x.data_ptr<float>(), *w_p = packed.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    const int tid = at::get_thread_num();
    alignas(64) float buf[kMaxRows * kBlocks * kW];  // one row group's tile, (rows, span): stays in L1
    for (int64_t p = begin; p < end; ++p) {
      const int64_t b0 = p * kBlocks, c0 = b0 * kW;
      const int nb = static_cast<int>(std::min<int64_t>(kBlocks, blocks - b0));
      const int last = static_cast<int>(std::min<int64_t>(kW, n - (b0 + nb - 1) * kW));
      const int64_t cols = (nb - 1) * kW + last;  // the panel's real columns
      for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m - r0));
        tile_fn(rows, nb)(x_p + r0 * k, k, w_p + b0 * k * kW, bias_p ? bias_p + c0 : nullptr, buf, span, kNone, last);
        for (int r = 0; r < rows; ++r) fold.fold(buf + r * span, span, cols, r0 + r, p, c0, tid);
      }
    }
  });
  return fold.finish(x.options());
}

TORCH_LIBRARY_FRAGMENT(raymt, m) {
  m.def("head_top_log_softmax(Tensor x, Tensor packed, Tensor? bias, int k, int skip, int n=-1) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(raymt, CPU, m) {
  m.impl("head_top_log_softmax", &head_top_log_softmax);
}
