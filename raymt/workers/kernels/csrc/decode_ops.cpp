// Fused CPU operators of one decoding step (workers/kernels/native.py builds and loads this file).
//
// Each replaces a chain of small ATen calls whose per-call overhead, not arithmetic, dominated the
// step at decoding shapes (N = 32..160 rows, H = 4..16 heads, t, S = 10..100 positions):
//   row_top_log_softmax: log_softmax + ban one column + topk  -> one top-k scan and one exp-sum
//                         scan per row; the log-probs are bit-equal to ATen's log_softmax (same
//                         vectorised max, exp-sum and log as ATen's kernel).
//   self_attention:      one query per row over the time-major self-attention cache
//                         (scores, softmax, weighted sum) -> one pass per (row, head); each row
//                         reads its own prefix (rows at different positions share a call) through
//                         an ancestry table, so beam reordering moves row indices instead of K/V;
//                         self_attention_step also writes the step's K/V from the fused QKV output.
//   cross_attention:     one query per row over its sentence's source K/V, bounded by the
//                         sentence's source length (or an additive mask).
//   add_layer_norm:      the post-norm residual layer_norm(x + h) in one call.
// Dimension letters: N rows, V columns, T capacity, L layers, H heads, D head dim, E = H * D,
// B sentences, S source positions.
#include <ATen/ATen.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kRowGroup = 16;  // cross-attention: at most this many rows of one sentence share a pass
// Cross-attention's weighted sum of values: rows sharing each value load, as many (up to 4) as keep
// their D = DV vectors of sums and the DV value vectors in registers (AVX-512's 32, AVX2's 16: at
// head dim 64 under AVX2, 1 row; 4 rows there spilled the sums every position)
template <int DV>
constexpr int kValueRows = std::max(1, std::min(4, ((Vec::size() >= 16 ? 32 : 16) - DV) / DV));

// Insert (value, index) into best/where (descending, length k) if it beats the last entry;
// an equal value keeps the earlier index first.
inline void insert_top(float value, int64_t index, float* best, int64_t* where, int64_t k) {
  if (!(value > best[k - 1])) return;
  int64_t p = k - 1;
  while (p > 0 && value > best[p - 1]) {
    best[p] = best[p - 1];
    where[p] = where[p - 1];
    --p;
  }
  best[p] = value;
  where[p] = index;
}

}  // namespace

// logits (N, V) float32 contiguous -> (log_probs (N, k), ids (N, k) int64), best first.
// ``skip`` (or -1): a column left out of the top-k but kept in the normaliser (<pad>).
// Slots no column fills (k > V - 1) hold -inf and ``skip``.
std::tuple<at::Tensor, at::Tensor> row_top_log_softmax(const at::Tensor& logits, int64_t k, int64_t skip) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous(),
              "row_top_log_softmax: logits must be a contiguous float32 (N, V) tensor");
  const int64_t n = logits.size(0), v = logits.size(1);
  TORCH_CHECK(k >= 1 && k <= v, "row_top_log_softmax: k must be in [1, V]");
  auto values = at::empty({n, k}, logits.options());
  auto ids = at::empty({n, k}, logits.options().dtype(at::kLong));
  const float* src = logits.data_ptr<float>();
  float* out_v = values.data_ptr<float>();
  int64_t* out_i = ids.data_ptr<int64_t>();
  const int64_t fill = skip >= 0 && skip < v ? skip : 0;
  at::parallel_for(0, n, std::max<int64_t>(1, 32768 / std::max<int64_t>(v, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* x = src + r * v;
      float* best = out_v + r * k;
      int64_t* where = out_i + r * k;
      std::fill(best, best + k, kNegInf);
      std::fill(where, where + k, fill);
      int64_t j = 0;
      for (; j + Vec::size() <= v; j += Vec::size()) {  // only lanes above the k-th best are looked at
        const Vec chunk = Vec::loadu(x + j);
        const int below = (chunk > Vec(best[k - 1])).zero_mask();
        if (below == (1 << Vec::size()) - 1) continue;
        for (int lane = 0; lane < Vec::size(); ++lane)
          if (!(below & (1 << lane)) && j + lane != skip) insert_top(x[j + lane], j + lane, best, where, k);
      }
      for (; j < v; ++j)
        if (j != skip) insert_top(x[j], j, best, where, k);
      float max = best[0];  // the row maximum: the best kept column or the skipped one (NaN if that is NaN)
      if (skip >= 0 && skip < v && !(x[skip] <= max)) max = x[skip];
      // ATen's log_softmax: sum of exp(x - max), vectorised log, then x - max - log(sum)
      float sum = at::vec::map_reduce_all<float>([max](Vec a) { return (a - Vec(max)).exp(); },
                                                 [](Vec a, Vec b) { return a + b; }, x, v);
      at::vec::map([](Vec a) { return a.log(); }, &sum, &sum, 1);
      for (int64_t c = 0; c < k; ++c) best[c] = best[c] - max - sum;
    }
  });
  return {values, ids};
}

namespace {

// Lane j of the result = the sum of v[j]'s lanes, for Vec::size() vectors v (clobbered): log2(W)
// rounds of pairwise deinterleave + add instead of one horizontal reduction per vector.
inline Vec reduce_lanes(Vec* v) {
  for (int64_t c = Vec::size(); c > 1; c /= 2)
    for (int64_t i = 0; i < c / 2; ++i) {
      const auto halves = at::vec::deinterleave2(v[2 * i], v[2 * i + 1]);
      v[i] = halves.first + halves.second;
    }
  return v[0];
}

// scores[t] = scale * q . key(t) + bias[t] for t < len, Vec::size() positions at a time; D = DV vectors.
template <int DV, typename Key>
inline void dot_scores(const float* q, const Key& key, const float* bias, int64_t len, float scale, float* scores) {
  constexpr int64_t W = Vec::size();
  Vec qv[DV];
  for (int c = 0; c < DV; ++c) qv[c] = Vec::loadu(q + c * W);
  for (int64_t t0 = 0; t0 < len; t0 += W) {
    const int64_t cnt = std::min(W, len - t0);
    Vec acc[W];
    for (int64_t j = 0; j < W; ++j) {
      acc[j] = Vec(0.f);
      if (j < cnt) {
        const float* k = key(t0 + j);
        for (int c = 0; c < DV; ++c) acc[j] = at::vec::fmadd(qv[c], Vec::loadu(k + c * W), acc[j]);
      }
    }
    Vec sc = reduce_lanes(acc) * Vec(scale);
    if (bias) sc = sc + Vec::loadu(bias + t0, cnt);
    sc.store(scores + t0, cnt);
  }
}

// scores[0..len) -> exp(scores - max) in place; returns 1 / their sum.
inline float softmax_in_place(float* scores, int64_t len) {
  constexpr int64_t W = Vec::size();
  float max = kNegInf;
  for (int64_t t = 0; t < len; ++t) max = std::max(max, scores[t]);
  Vec sum(0.f);
  for (int64_t t0 = 0; t0 < len; t0 += W) {
    const int64_t cnt = std::min(W, len - t0);
    (Vec::loadu(scores + t0, cnt) - Vec(max)).exp().store(scores + t0, cnt);
    sum = sum + Vec::loadu(scores + t0, cnt);  // (lanes past cnt load as 0)
  }
  return 1.f / at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sum);
}

// out (D) = softmax(scale * q . K_t + bias_t) . V_t over t < len; position t's key and value are
// the D floats at keys[t] and vals[t] (any layout: strided cache, ancestry gather, source K/V).
// D = DV vectors, scored W positions at a time. The sums run in the order ``attend_rows`` runs them
// for a sentence's rows, so both paths give equal results bit for bit.
template <int DV>
void attend(const float* q, const float* const* keys, const float* const* vals, const float* bias, int64_t len,
            float scale, float* scores, float* out) {
  constexpr int64_t W = Vec::size();
  dot_scores<DV>(q, [keys](int64_t t) { return keys[t]; }, bias, len, scale, scores);
  const float inv = softmax_in_place(scores, len);
  Vec acc[DV];
  for (int c = 0; c < DV; ++c) acc[c] = Vec(0.f);
  for (int64_t t = 0; t < len; ++t) {
    const Vec p(scores[t]);
    for (int c = 0; c < DV; ++c) acc[c] = at::vec::fmadd(p, Vec::loadu(vals[t] + c * W), acc[c]);
  }
  for (int c = 0; c < DV; ++c) (acc[c] * Vec(inv)).store(out + c * W);
}

// Any D: one horizontal reduction per position.
void attend_any(const float* q, const float* const* keys, const float* const* vals, const float* bias, int64_t len,
                int64_t d, float scale, float* scores, float* out) {
  for (int64_t t = 0; t < len; ++t) {
    Vec acc(0.f);
    int64_t i = 0;
    for (; i + Vec::size() <= d; i += Vec::size()) acc = at::vec::fmadd(Vec::loadu(q + i), Vec::loadu(keys[t] + i), acc);
    float s = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc);
    for (; i < d; ++i) s += q[i] * keys[t][i];
    scores[t] = s * scale + (bias ? bias[t] : 0.f);
  }
  const float inv = softmax_in_place(scores, len);
  for (int64_t i = 0; i < d; ++i) {
    float acc = 0.f;
    for (int64_t t = 0; t < len; ++t) acc += scores[t] * vals[t][i];
    out[i] = acc * inv;
  }
}

using AttendFn = void (*)(const float*, const float* const*, const float* const*, const float*, int64_t, float, float*,
                          float*);

// The ``attend`` for head dim d (nullptr: ``attend_any``).
AttendFn attend_for(int64_t d) {
  if (d % Vec::size()) return nullptr;
  switch (d / Vec::size()) {
    case 1: return &attend<1>;
    case 2: return &attend<2>;
    case 4: return &attend<4>;
    case 8: return &attend<8>;
    case 16: return &attend<16>;
    default: return nullptr;
  }
}

inline void attend_d(AttendFn fn, const float* q, const float* const* keys, const float* const* vals, const float* bias,
                     int64_t len, int64_t d, float scale, float* scores, float* out) {
  if (fn) fn(q, keys, vals, bias, len, scale, scores, out);
  else attend_any(q, keys, vals, bias, len, d, scale, scores, out);
}

// The rows q[0..g) of one sentence over its source keys/values (len x DV vectors each, contiguous),
// per head: the keys are read from L1 per row, each value once for kValueRows rows.
template <int DV>
void attend_rows(const float* const* q, int g, const float* keys, const float* vals, const float* bias, int64_t len,
                 float scale, float* scores, float* const* out) {
  constexpr int64_t V = Vec::size(), D = DV * Vec::size();
  constexpr int R = kValueRows<DV>;
  float inv[kRowGroup];
  for (int i = 0; i < g; ++i) {
    float* row = scores + i * len;
    dot_scores<DV>(q[i], [keys](int64_t t) { return keys + t * D; }, bias, len, scale, row);
    inv[i] = softmax_in_place(row, len);
  }
  for (int i0 = 0; i0 < g; i0 += R) {  // R rows' D-vectors of accumulators at a time
    const int m = std::min(R, g - i0);
    Vec acc[R][DV];
    for (int i = 0; i < R; ++i)
      for (int c = 0; c < DV; ++c) acc[i][c] = Vec(0.f);
    for (int64_t t = 0; t < len; ++t) {
      Vec val[DV];
      for (int c = 0; c < DV; ++c) val[c] = Vec::loadu(vals + t * D + c * V);
      for (int i = 0; i < m; ++i) {
        const Vec p(scores[(i0 + i) * len + t]);
        for (int c = 0; c < DV; ++c) acc[i][c] = at::vec::fmadd(p, val[c], acc[i][c]);
      }
    }
    for (int i = 0; i < m; ++i)
      for (int c = 0; c < DV; ++c) (acc[i][c] * Vec(inv[i0 + i])).store(out[i0 + i] + c * V);
  }
}

void check_query(const at::Tensor& q, int64_t e) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kFloat && q.stride(1) == 1 && q.size(1) == e,
              "attention: q must be a float32 (N, E) tensor with unit column stride");
}

// fn(begin, end) over tasks [0, n) on the thread pool, in contiguous ranges of about equal total
// cost (cost(i) >= 1, e.g. the positions a row attends over) rather than of equal count: rows at
// different positions or over different sources share a step, and a split by count gave one thread
// every long row (a step of old and new sentences ran 1.8x slower than its work; 2 threads).
// ``grain``: the least cost worth a range of its own.
template <typename Cost, typename Fn>
void parallel_for_cost(int64_t n, int64_t grain, const Cost& cost, const Fn& fn) {
  if (n <= 0) return;
  std::vector<int64_t> prefix(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost(i);
  const int64_t total = prefix[n];
  const int64_t ranges = std::max<int64_t>(1, std::min<int64_t>({n, 4 * at::get_num_threads(), total / std::max<int64_t>(grain, 1)}));
  std::vector<int64_t> bounds(ranges + 1, n);
  bounds[0] = 0;
  for (int64_t c = 1; c < ranges; ++c)  // the first task whose prefix reaches c / ranges of the total
    bounds[c] = std::lower_bound(prefix.begin(), prefix.end(), total * c / ranges) - prefix.begin();
  at::parallel_for(0, ranges, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      if (bounds[c] < bounds[c + 1]) fn(bounds[c], bounds[c + 1]);
  });
}

}  // namespace

// Self-attention of one step: q (N, E) (any row stride), cache_k / cache_v (T, L, R, H, D)
// contiguous float32 (R >= N cache rows), ``layer`` -> (N, E), heads merged. Row n attends over
// positions [0, positions[n]] (``positions`` (N,) int64), or [0, length) when undefined (every row
// at one position). ``ancestry`` (T', N) int64 contiguous, T' >= length: row n's position t is cache
// row ancestry[t, n] (beam reordering without moving K/V); undefined: row n is cache row n (R == N).
at::Tensor self_attention(const at::Tensor& q, const at::Tensor& cache_k, const at::Tensor& cache_v,
                          const c10::optional<at::Tensor>& ancestry, const c10::optional<at::Tensor>& positions,
                          int64_t layer, int64_t length, double scale) {
  TORCH_CHECK(cache_k.dim() == 5 && cache_k.is_contiguous() && cache_v.is_contiguous() &&
              cache_k.sizes() == cache_v.sizes() && cache_k.scalar_type() == at::kFloat && cache_v.scalar_type() == at::kFloat,
              "self_attention: caches must be contiguous float32 (T, L, R, H, D)");
  const int64_t l = cache_k.size(1), r = cache_k.size(2), h = cache_k.size(3), d = cache_k.size(4);
  const int64_t n = q.size(0);
  TORCH_CHECK(layer >= 0 && layer < l && length >= 1 && length <= cache_k.size(0),
              "self_attention: layer or length out of range");
  const int64_t* pos = nullptr;
  if (positions.has_value() && positions->defined()) {
    TORCH_CHECK(positions->dim() == 1 && positions->size(0) == n && positions->scalar_type() == at::kLong &&
                positions->is_contiguous(), "self_attention: positions must be a contiguous int64 (N,) tensor");
    pos = positions->data_ptr<int64_t>();
    for (int64_t row = 0; row < n; ++row)
      TORCH_CHECK(pos[row] >= 0 && pos[row] < length, "self_attention: a position is out of range");
  }
  const bool by_ancestry = ancestry.has_value() && ancestry->defined();
  const int64_t* anc = nullptr;
  if (by_ancestry) {
    TORCH_CHECK(ancestry->dim() == 2 && ancestry->scalar_type() == at::kLong && ancestry->is_contiguous() &&
                ancestry->size(0) >= length && ancestry->size(1) == n,
                "self_attention: ancestry must be a contiguous int64 (T, N) tensor covering the length");
    anc = ancestry->data_ptr<int64_t>();
    for (int64_t row = 0; row < n; ++row) {  // only the cells a row reads
      const int64_t len = pos ? pos[row] + 1 : length;
      for (int64_t t = 0; t < len; ++t)
        TORCH_CHECK(anc[t * n + row] >= 0 && anc[t * n + row] < r, "self_attention: ancestry row out of range");
    }
  } else {
    TORCH_CHECK(n == r, "self_attention: rows out of range");
  }
  check_query(q, h * d);
  auto out = at::empty({n, h * d}, q.options().memory_format(at::MemoryFormat::Contiguous));
  const float *qp = q.data_ptr<float>(), *kp = cache_k.data_ptr<float>(), *vp = cache_v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t step = l * r * h * d, q_stride = q.stride(0);
  const auto row_length = [&](int64_t task) { return pos ? pos[task / h] + 1 : length; };
  const AttendFn fn = attend_for(d);
  parallel_for_cost(n * h, std::max<int64_t>(1, 4096 / d), row_length, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(length);
    std::vector<const float*> keys(length), vals(length);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t row = task / h, head = task % h, len = pos ? pos[row] + 1 : length;
      for (int64_t t = 0; t < len; ++t) {
        const int64_t at = t * step + ((layer * r + (by_ancestry ? anc[t * n + row] : row)) * h + head) * d;
        keys[t] = kp + at;
        vals[t] = vp + at;
      }
      attend_d(fn, qp + row * q_stride + head * d, keys.data(), vals.data(), nullptr, len, d, static_cast<float>(scale),
             scores.data(), op + row * h * d + head * d);
    }
  });
  return out;
}

// Self-attention of one step from the fused projection: qkv (N, 3E) (unit column stride). Writes
// row n's k and v at position positions[n] (or length - 1) of ``layer``, cache row rows[n] (or n),
// then attends as self_attention with q = qkv[:, :E]: one call instead of a split, two reshapes and
// two writes.
at::Tensor self_attention_step(const at::Tensor& qkv, const at::Tensor& cache_k, const at::Tensor& cache_v,
                               const c10::optional<at::Tensor>& ancestry, const c10::optional<at::Tensor>& rows,
                               const c10::optional<at::Tensor>& positions, int64_t layer, int64_t length, double scale) {
  TORCH_CHECK(cache_k.dim() == 5 && cache_k.is_contiguous() && cache_v.is_contiguous() &&
              cache_k.sizes() == cache_v.sizes() && cache_k.scalar_type() == at::kFloat && cache_v.scalar_type() == at::kFloat,
              "self_attention: caches must be contiguous float32 (T, L, R, H, D)");
  const int64_t l = cache_k.size(1), r = cache_k.size(2), e = cache_k.size(3) * cache_k.size(4);
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.stride(1) == 1 && qkv.size(1) == 3 * e,
              "self_attention_step: qkv must be a float32 (N, 3E) tensor with unit column stride");
  const int64_t n = qkv.size(0);
  TORCH_CHECK(layer >= 0 && layer < l && length >= 1 && length <= cache_k.size(0) && n <= r,
              "self_attention: layer, length or rows out of range");
  const bool has_rows = rows.has_value() && rows->defined(), has_pos = positions.has_value() && positions->defined();
  for (const auto* index : {has_rows ? &*rows : nullptr, has_pos ? &*positions : nullptr})
    TORCH_CHECK(!index || (index->dim() == 1 && index->size(0) == n && index->scalar_type() == at::kLong &&
                           index->is_contiguous()), "self_attention_step: rows and positions must be contiguous int64 (N,)");
  const int64_t *rp = has_rows ? rows->data_ptr<int64_t>() : nullptr, *pp = has_pos ? positions->data_ptr<int64_t>() : nullptr;
  const int64_t stride = qkv.stride(0);
  const float* src = qkv.data_ptr<float>();
  float *kd = cache_k.data_ptr<float>(), *vd = cache_v.data_ptr<float>();
  for (int64_t row = 0; row < n; ++row) {
    const int64_t cache_row = rp ? rp[row] : row, p = pp ? pp[row] : length - 1;
    TORCH_CHECK(cache_row >= 0 && cache_row < r && p >= 0 && p < length, "self_attention_step: row or position out of range");
    const int64_t at = ((p * l + layer) * r + cache_row) * e;
    std::copy_n(src + row * stride + e, e, kd + at);
    std::copy_n(src + row * stride + 2 * e, e, vd + at);
  }
  return self_attention(qkv.narrow(1, 0, e), cache_k, cache_v, ancestry, positions, layer, length, scale);
}

// Cross-attention of one step: q (N, E) (any row stride); cross_k / cross_v (L, B, H, S, D)
// contiguous float32; bias (B, H, 1, S) additive mask (0 or -inf); sentence (N,) int64: each
// row's sentence; ``lengths`` (B,) int64 or undefined: sentence j attends over its first lengths[j]
// source positions only (its padding is never read) -> (N, E), heads merged.
at::Tensor cross_attention(const at::Tensor& q, const at::Tensor& cross_k, const at::Tensor& cross_v, int64_t layer,
                           const c10::optional<at::Tensor>& bias, const at::Tensor& sentence,
                           const c10::optional<at::Tensor>& lengths,
                           double scale) {
  TORCH_CHECK(cross_k.dim() == 5 && cross_k.is_contiguous() && cross_v.is_contiguous() &&
              cross_k.sizes() == cross_v.sizes() && cross_k.scalar_type() == at::kFloat && cross_v.scalar_type() == at::kFloat,
              "cross_attention: K/V must be contiguous float32 (L, B, H, S, D)");
  const int64_t b = cross_k.size(1), h = cross_k.size(2), s = cross_k.size(3), d = cross_k.size(4);
  const int64_t n = q.size(0);
  TORCH_CHECK(layer >= 0 && layer < cross_k.size(0), "cross_attention: layer out of range");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->is_contiguous() && bias->scalar_type() == at::kFloat && bias->numel() == b * h * s),
              "cross_attention: bias must be contiguous float32 (B, H, 1, S)");
  TORCH_CHECK(sentence.dim() == 1 && sentence.size(0) == n && sentence.scalar_type() == at::kLong && sentence.is_contiguous(),
              "cross_attention: sentence must be a contiguous int64 (N,) tensor");
  check_query(q, h * d);
  const int64_t* sp = sentence.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) TORCH_CHECK(sp[r] >= 0 && sp[r] < b, "cross_attention: sentence index out of range");
  const int64_t* lp = nullptr;
  TORCH_CHECK(has_bias || (lengths.has_value() && lengths->defined()), "cross_attention: give a bias or lengths");
  if (lengths.has_value() && lengths->defined()) {
    TORCH_CHECK(lengths->dim() == 1 && lengths->size(0) == b && lengths->scalar_type() == at::kLong &&
                lengths->is_contiguous(), "cross_attention: lengths must be a contiguous int64 (B,) tensor");
    lp = lengths->data_ptr<int64_t>();
    for (int64_t r = 0; r < n; ++r) TORCH_CHECK(lp[sp[r]] >= 1 && lp[sp[r]] <= s, "cross_attention: a length is out of range");
  }
  auto out = at::empty({n, h * d}, q.options().memory_format(at::MemoryFormat::Contiguous));
  const float *qp = q.data_ptr<float>(), *bp = has_bias ? bias->data_ptr<float>() : nullptr;
  const float *kp = cross_k.data_ptr<float>() + layer * b * h * s * d, *vp = cross_v.data_ptr<float>() + layer * b * h * s * d;
  float* op = out.data_ptr<float>();
  const int64_t q_stride = q.stride(0);
  const int64_t dv = d % Vec::size() == 0 ? d / Vec::size() : 0;
  if (dv == 2 || dv == 4 || dv == 8) {  // rows of one sentence side by side (a beam): one pass over its K/V
    std::vector<std::pair<int64_t, int>> groups;  // (first row, rows)
    for (int64_t r = 0; r < n; ++r) {
      if (!groups.empty() && sp[groups.back().first] == sp[r] && groups.back().second < kRowGroup) ++groups.back().second;
      else groups.emplace_back(r, 1);
    }
    const int64_t ng = static_cast<int64_t>(groups.size());
    const auto group_cost = [&](int64_t task) {
      const auto [first, g] = groups[task / h];
      return (lp ? lp[sp[first]] : s) * (g + 1);
    };
    parallel_for_cost(ng * h, std::max<int64_t>(1, 1024 / d), group_cost, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(kRowGroup * s);
      const float* qs[kRowGroup];
      float* outs[kRowGroup];
      for (int64_t task = begin; task < end; ++task) {
        const auto [first, g] = groups[task / h];
        const int64_t head = task % h, j = sp[first], len = lp ? lp[j] : s, at = (j * h + head) * s * d;
        for (int i = 0; i < g; ++i) {
          qs[i] = qp + (first + i) * q_stride + head * d;
          outs[i] = op + (first + i) * h * d + head * d;
        }
        const float* bias_row = bp ? bp + (j * h + head) * s : nullptr;
        const float scale_f = static_cast<float>(scale);
        if (dv == 2) attend_rows<2>(qs, g, kp + at, vp + at, bias_row, len, scale_f, scores.data(), outs);
        else if (dv == 4) attend_rows<4>(qs, g, kp + at, vp + at, bias_row, len, scale_f, scores.data(), outs);
        else attend_rows<8>(qs, g, kp + at, vp + at, bias_row, len, scale_f, scores.data(), outs);
      }
    });
    return out;
  }
  const auto row_cost = [&](int64_t task) { return lp ? lp[sp[task / h]] : s; };
  const AttendFn fn = attend_for(d);
  parallel_for_cost(n * h, std::max<int64_t>(1, 4096 / d), row_cost, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(s);
    std::vector<const float*> keys(s), vals(s);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t row = task / h, head = task % h, j = sp[row], len = lp ? lp[j] : s;
      const int64_t at = (j * h + head) * s * d;
      for (int64_t t = 0; t < len; ++t) {
        keys[t] = kp + at + t * d;
        vals[t] = vp + at + t * d;
      }
      attend_d(fn, qp + row * q_stride + head * d, keys.data(), vals.data(), bp ? bp + (j * h + head) * s : nullptr, len, d,
             static_cast<float>(scale), scores.data(), op + row * h * d + head * d);
    }
  });
  return out;
}

// Post-norm residual of one step: layer_norm(x + h) over the last dim. x, h (N, E) float32
// contiguous; weight, bias (E,) -> (N, E). One pass pair per row instead of an add and a norm.
at::Tensor add_layer_norm(const at::Tensor& x, const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias,
                          double eps) {
  TORCH_CHECK(x.dim() == 2 && x.sizes() == h.sizes() && x.is_contiguous() && h.is_contiguous() &&
              x.scalar_type() == at::kFloat && h.scalar_type() == at::kFloat,
              "add_layer_norm: x and h must be contiguous float32 (N, E) tensors of one shape");
  const int64_t n = x.size(0), e = x.size(1);
  TORCH_CHECK(weight.numel() == e && bias.numel() == e && weight.is_contiguous() && bias.is_contiguous() &&
              weight.scalar_type() == at::kFloat && bias.scalar_type() == at::kFloat,
              "add_layer_norm: weight and bias must be contiguous float32 (E,)");
  auto out = at::empty_like(x);
  const float *xp = x.data_ptr<float>(), *hp = h.data_ptr<float>(), *wp = weight.data_ptr<float>(), *bp = bias.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n, std::max<int64_t>(1, 16384 / std::max<int64_t>(e, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* y = op + r * e;
      at::vec::map2([](Vec a, Vec b) { return a + b; }, y, xp + r * e, hp + r * e, e);
      const float mean = at::vec::reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, y, e) / e;
      const float var = at::vec::map_reduce_all<float>([mean](Vec a) { return (a - Vec(mean)) * (a - Vec(mean)); },
                                                       [](Vec a, Vec b) { return a + b; }, y, e) / e;
      const float rstd = 1.f / std::sqrt(var + static_cast<float>(eps));
      at::vec::map3([mean, rstd](Vec a, Vec w, Vec b) { return (a - Vec(mean)) * Vec(rstd) * w + b; }, y, y, wp, bp, e);
    }
  });
  return out;
}

int64_t vector_width() { return Vec::size(); }

// Registered as torch operators (torch.ops.raymt.*): the dispatcher and the profiler see them
// like ATen's ("raymt::self_attention" in a trace and in jobs.bench --profile).
TORCH_LIBRARY(raymt, m) {
  m.def("vector_width() -> int", &vector_width);  // floats per vector register this build uses
  m.def("row_top_log_softmax(Tensor logits, int k, int skip) -> (Tensor, Tensor)");
  m.def("self_attention(Tensor q, Tensor cache_k, Tensor cache_v, Tensor? ancestry, Tensor? positions, int layer,"
        " int length, float scale) -> Tensor");
  m.def("cross_attention(Tensor q, Tensor cross_k, Tensor cross_v, int layer, Tensor? bias, Tensor sentence,"
        " Tensor? lengths, float scale) -> Tensor");
  m.def("self_attention_step(Tensor qkv, Tensor(a!) cache_k, Tensor(b!) cache_v, Tensor? ancestry, Tensor? rows,"
        " Tensor? positions, int layer, int length, float scale) -> Tensor");
  m.def("add_layer_norm(Tensor x, Tensor h, Tensor weight, Tensor bias, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(raymt, CPU, m) {
  m.impl("row_top_log_softmax", &row_top_log_softmax);
  m.impl("self_attention", &self_attention);
  m.impl("cross_attention", &cross_attention);
  m.impl("self_attention_step", &self_attention_step);
  m.impl("add_layer_norm", &add_layer_norm);
}
