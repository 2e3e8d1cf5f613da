// The engine's beam-search step after the output layer on the CPU (greedy, K = 1, included), in one call
// (torch.ops.raymt.beam_step): workers/search/selection.py's top_candidates_from_rows + select_step, the rules of
// workers/search/beam_rules.py (finished_records + merge_order, PoolSummary, keep_mask, stop_mask), and
// workers/search/beams.py's reorder and Readback.gather, which the Python path runs as ~50 small ATen
// operators a step. Same arithmetic in the same precision (float32 candidate sums, float64 normalised
// scores and stop test), so the outcome is the Python path's; ties between equal scores go to the
// lower index (torch.topk leaves their order open). The search's rules arrive as one argument,
// BeamRules.packed (struct BeamRules below); the static step stays on the Python path.
// Dimension letters: N rows run, M best tokens per row, B planned slots, K beam, C = 2K
// candidates, S slots, R = S x K rows, T target capacity, t visible positions.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
enum { kScore = 0, kLogProb = 1, kLength = 2, kToken = 3 };  // a pool record (beam_rules.py's SCORE ..)

struct Candidate {
  float score, word;  // cumulative log-prob, the new token's own log-prob
  int64_t beam, token;
};

// workers/search/beam_rules.BeamRules, unpacked from BeamRules.packed (laid out as PACKED_FIELDS there):
// the hypotheses returned per sentence, HF's early_stopping, and the pruning heuristics (NaN = off).
struct BeamRules {
  int64_t nbest;
  bool early_stopping;
  double rp, ap, rpl;
  int64_t mc;  // 0 = off
  double delta;
  bool early_stop;

  static BeamRules unpack(at::ArrayRef<double> v) {
    TORCH_CHECK(v.size() == 8, "beam_step: rules must be BeamRules.packed (8 values), got ", v.size());
    return {static_cast<int64_t>(v[0]), v[1] != 0.0, v[2], v[3], v[4],
            std::isnan(v[5]) ? 0 : static_cast<int64_t>(v[5]), v[6], v[7] != 0.0};
  }
  bool prunes() const {
    return !std::isnan(rp) || !std::isnan(ap) || !std::isnan(rpl) || mc > 0 || !std::isnan(delta) || early_stop;
  }
};

// workers/search/beam_rules.keep_mask for one sentence's K running candidates (best first), in the Python
// path's precisions: float32 thresholds against the step's best candidate, float64 against the
// best finished hypothesis.
void keep_mask(const float* score, const float* word, const int64_t* beam, int64_t k, float best, double best_finished,
               const BeamRules& p, bool* keep) {
  float best_word = kNegInf;
  for (int64_t i = 0; i < k; ++i)
    if (std::isfinite(score[i])) best_word = std::max(best_word, word[i]);
  for (int64_t i = 0; i < k; ++i) {
    bool ok = std::isfinite(score[i]);
    if (!std::isnan(p.rp)) ok = ok && score[i] > best + static_cast<float>(std::log(p.rp));
    if (!std::isnan(p.ap)) ok = ok && score[i] > best - static_cast<float>(p.ap);
    if (!std::isnan(p.rpl)) ok = ok && word[i] > best_word + static_cast<float>(std::log(p.rpl));
    if (p.mc > 0) {
      int64_t same = 0;
      for (int64_t j = 0; j < i; ++j) same += beam[j] == beam[i] && std::isfinite(score[j]);
      ok = ok && same < p.mc;
    }
    if (!std::isnan(p.delta))
      ok = ok && static_cast<double>(score[i]) >= std::max(static_cast<double>(best), best_finished) - p.delta;
    if (p.early_stop) ok = ok && static_cast<double>(score[i]) >= best_finished;
    keep[i] = ok;
  }
}

// The best `count` of `values` (descending; equal values: lower index first) -> their indices.
void top_indices(const std::vector<float>& values, int64_t count, std::vector<int64_t>& out) {
  out.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = static_cast<int64_t>(i);
  std::partial_sort(out.begin(), out.begin() + count, out.end(), [&](int64_t a, int64_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  out.resize(count);
}

}  // namespace

// top_lp, top_tok (N, M): each run row's best log-probs and tokens (forced EOS applied); grid (N,)
// each row's (B x K) entry, or undefined when row i is entry i; slots, generated (B,) int64;
// at_max (B,) bool; norm (>= max generated + 1,) float64 generated ** length_penalty; state
// (updated in place): running (S, K) float32, last (R,), pool (S, K, 4) float64, pool_tokens
// (S, K, >= t - 1), ancestry and tokens (T, R) int64 (the cache's); rules BeamRules.packed;
// pruned () int64, the discarded running candidates added to it. -> the step's readback
// (B, 2 [+ nbest * (4 + t - 1)]) int64, laid out as Readback.gather lays it out.
at::Tensor beam_step(const at::Tensor& top_lp, const at::Tensor& top_tok, const c10::optional<at::Tensor>& grid,
                     const at::Tensor& slots, const at::Tensor& generated, const at::Tensor& at_max,
                     const at::Tensor& norm, at::Tensor running, at::Tensor last, at::Tensor pool,
                     at::Tensor pool_tokens, at::Tensor ancestry, const at::Tensor& tokens, int64_t t,
                     int64_t eos, at::ArrayRef<double> packed_rules, at::Tensor pruned) {
  const BeamRules rules = BeamRules::unpack(packed_rules);
  const bool prune = rules.prunes();
  const int64_t nbest = rules.nbest;
  TORCH_CHECK(pruned.scalar_type() == at::kLong && pruned.numel() == 1, "beam_step: pruned must be an int64 scalar");
  int64_t discarded = 0;
  const int64_t n = top_lp.size(0), m = top_lp.size(1), b = slots.size(0), k = running.size(1), c = 2 * k;
  const int64_t rows_all = ancestry.size(1), tc = pool_tokens.size(2), th = t - 1;
  TORCH_CHECK(top_lp.scalar_type() == at::kFloat && top_tok.scalar_type() == at::kLong && top_lp.is_contiguous() &&
              top_tok.is_contiguous() && top_tok.sizes() == top_lp.sizes(), "beam_step: top must be contiguous (N, M)");
  TORCH_CHECK(running.scalar_type() == at::kFloat && pool.scalar_type() == at::kDouble &&
              norm.scalar_type() == at::kDouble && at_max.scalar_type() == at::kBool && running.is_contiguous() &&
              last.is_contiguous() && pool.is_contiguous() && pool_tokens.is_contiguous() &&
              ancestry.is_contiguous() && tokens.is_contiguous() && slots.is_contiguous() &&
              generated.is_contiguous() && at_max.is_contiguous() && norm.is_contiguous(),
              "beam_step: state tensors must be contiguous, running float32, pool and norm float64");
  TORCH_CHECK(nbest >= 1 && nbest <= k && m * k >= c && th <= tc && t <= ancestry.size(0),
              "beam_step: needs nbest in [1, K], M * K >= 2K and t within the capacities");
  const float* lp = top_lp.data_ptr<float>();
  const int64_t* tok = top_tok.data_ptr<int64_t>();
  const int64_t *slot_p = slots.data_ptr<int64_t>(), *gen_p = generated.data_ptr<int64_t>();
  const bool* max_p = at_max.data_ptr<bool>();
  const double* norm_p = norm.data_ptr<double>();
  float* run_p = running.data_ptr<float>();
  int64_t *last_p = last.data_ptr<int64_t>(), *ptok_p = pool_tokens.data_ptr<int64_t>();
  int64_t *anc_p = ancestry.data_ptr<int64_t>();
  const int64_t* tokens_p = tokens.data_ptr<int64_t>();
  double* pool_p = pool.data_ptr<double>();

  std::vector<int64_t> row_of(b * k, -1);  // (B x K) entry -> its run row, -1 = empty (a -inf beam)
  const int64_t* grid_p = grid.has_value() ? grid->data_ptr<int64_t>() : nullptr;
  for (int64_t i = 0; i < n; ++i) row_of[grid_p ? grid_p[i] : i] = i;

  std::vector<uint8_t> done(b);
  std::vector<int64_t> width(b), order, chosen, source_rows(k), new_last(k), saved(k * t);
  std::vector<float> totals(k * m), live(c), new_running(k), run_words(k);
  std::vector<int64_t> run_beams(k), sorted_rank(k), chosen_sorted(k);
  std::vector<float> scores_sorted(k);
  std::unique_ptr<bool[]> keep(new bool[k]);
  std::vector<Candidate> cands(c);
  std::vector<double> merged(2 * k * 4);
  std::vector<int64_t> merged_tokens(2 * k * std::max<int64_t>(th, 1)), rank(2 * k);
  for (int64_t j = 0; j < b; ++j) {
    const int64_t slot = slot_p[j], base = slot * k;
    float* run = run_p + slot * k;
    // candidates: the best C of the K x M (beam, token) continuations (top_candidates_from_rows)
    for (int64_t beam = 0; beam < k; ++beam) {
      const int64_t r = row_of[j * k + beam];
      for (int64_t q = 0; q < m; ++q) totals[beam * m + q] = r < 0 ? kNegInf + run[beam] : lp[r * m + q] + run[beam];
    }
    top_indices(totals, c, order);
    for (int64_t i = 0; i < c; ++i) {
      const int64_t flat = order[i], beam = flat / m, r = row_of[j * k + beam];
      cands[i] = {totals[flat], r < 0 ? kNegInf : lp[r * m + flat % m], beam, r < 0 ? 0 : tok[r * m + flat % m]};
    }
    // select_step: the first K may finish; the best K that do not end keep running
    const double nrm = norm_p[gen_p[j]];
    int finished_count = 0;
    for (int64_t i = 0; i < c; ++i) {
      const bool ends = cands[i].token == eos || max_p[j];
      live[i] = ends ? kNegInf : cands[i].score;
      if (ends && i < k && std::isfinite(cands[i].score)) ++finished_count;
    }
    top_indices(live, k, chosen);
    // add_finished: old entries, then this step's finishers in candidate order, stable by score
    double* entries = pool_p + slot * k * 4;
    if (finished_count) {
      std::memcpy(merged.data(), entries, sizeof(double) * k * 4);
      for (int64_t i = 0; i < k; ++i) {
        const bool ends = cands[i].token == eos || max_p[j];
        const double log_prob = ends && std::isfinite(cands[i].score) ? static_cast<double>(cands[i].score)
                                                                      : -std::numeric_limits<double>::infinity();
        double* e = merged.data() + (k + i) * 4;
        e[kScore] = log_prob / nrm, e[kLogProb] = log_prob, e[kLength] = static_cast<double>(gen_p[j]);
        e[kToken] = static_cast<double>(cands[i].token);
      }
      for (int64_t i = 0; i < 2 * k; ++i) rank[i] = i;
      std::stable_sort(rank.begin(), rank.end(), [&](int64_t a, int64_t z) {
        return merged[a * 4 + kScore] > merged[z * 4 + kScore];
      });
      int64_t* ptok = ptok_p + slot * k * tc;
      for (int64_t i = 0; i < 2 * k; ++i) {  // every entry's tokens: the old ones', then the candidates' histories
        int64_t* dst = merged_tokens.data() + i * th;
        if (i < k) {
          std::copy(ptok + i * tc, ptok + i * tc + th, dst);
        } else {
          const int64_t row = base + cands[i - k].beam;  // history through the ancestry (cache.history)
          for (int64_t p = 1; p < t; ++p) dst[p - 1] = tokens_p[p * rows_all + anc_p[p * rows_all + row]];
        }
      }
      for (int64_t i = 0; i < k; ++i) {
        std::memcpy(entries + i * 4, merged.data() + rank[i] * 4, sizeof(double) * 4);
        std::copy(merged_tokens.data() + rank[i] * th, merged_tokens.data() + rank[i] * th + th, ptok + i * tc);
      }
    }
    // pool_summary, then pruning (its survivors sorted best first, stable), then stop_mask
    const double worst = entries[(k - 1) * 4 + kScore];
    const bool full = std::isfinite(worst);
    for (int64_t i = 0; i < k; ++i) new_running[i] = live[chosen[i]];
    if (prune) {
      double best_finished = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < k; ++i) best_finished = std::max(best_finished, entries[i * 4 + kLogProb]);
      for (int64_t i = 0; i < k; ++i) run_words[i] = cands[chosen[i]].word, run_beams[i] = cands[chosen[i]].beam;
      keep_mask(new_running.data(), run_words.data(), run_beams.data(), k, cands[0].score, best_finished, rules,
                keep.get());
      for (int64_t i = 0; i < k; ++i) {
        if (keep[i]) continue;
        discarded += std::isfinite(new_running[i]);
        new_running[i] = kNegInf;
      }
      for (int64_t i = 0; i < k; ++i) sorted_rank[i] = i;
      std::stable_sort(sorted_rank.begin(), sorted_rank.end(),
                       [&](int64_t a, int64_t z) { return new_running[a] > new_running[z]; });
      for (int64_t i = 0; i < k; ++i)
        scores_sorted[i] = new_running[sorted_rank[i]], chosen_sorted[i] = chosen[sorted_rank[i]];
      std::copy(scores_sorted.begin(), scores_sorted.end(), new_running.begin());
      std::copy(chosen_sorted.begin(), chosen_sorted.end(), chosen.begin());
    }
    const float best = new_running[0];
    const bool beaten = static_cast<double>(best) / nrm <= worst;
    done[j] = max_p[j] || !std::isfinite(best) || (full && (beaten || rules.early_stopping));
    // the reorder: row base + i continues candidate chosen[i]'s source beam (ancestry columns only)
    int64_t live_count = 0;
    for (int64_t i = 0; i < k; ++i) {
      const Candidate& cand = cands[chosen[i]];
      source_rows[i] = base + cand.beam;
      new_last[i] = cand.token;
      live_count += std::isfinite(new_running[i]);
    }
    for (int64_t i = 0; i < k; ++i)  // gathered before written
      for (int64_t p = 0; p < t; ++p) saved[i * t + p] = anc_p[p * rows_all + source_rows[i]];
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t p = 0; p < t; ++p) anc_p[p * rows_all + base + i] = saved[i * t + p];
      last_p[base + i] = new_last[i];
      run[i] = new_running[i];
    }
    width[j] = live_count;
  }
  if (discarded) pruned.add_(discarded);
  const bool any_done = std::any_of(done.begin(), done.end(), [](uint8_t d) { return d != 0; });
  const int64_t w = 2 + (any_done ? nbest * (4 + th) : 0);
  auto out = at::empty({b, w}, slots.options());
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t j = 0; j < b; ++j) {
    int64_t* row = o + j * w;
    row[0] = done[j], row[1] = width[j];
    if (!any_done) continue;
    const int64_t slot = slot_p[j];
    std::memcpy(row + 2, pool_p + slot * k * 4, sizeof(double) * nbest * 4);  // float64 bits ride as int64
    for (int64_t i = 0; i < nbest; ++i)
      std::copy(ptok_p + (slot * k + i) * tc, ptok_p + (slot * k + i) * tc + th, row + 2 + nbest * 4 + i * th);
  }
  return out;
}

TORCH_LIBRARY_FRAGMENT(raymt, m) {
  m.def("beam_step(Tensor top_lp, Tensor top_tok, Tensor? grid, Tensor slots, Tensor generated, Tensor at_max,"
        " Tensor norm, Tensor(a!) running, Tensor(b!) last, Tensor(c!) pool, Tensor(d!) pool_tokens,"
        " Tensor(e!) ancestry, Tensor tokens, int t, int eos, float[] rules, Tensor(f!) pruned) -> Tensor");
}

TORCH_LIBRARY_IMPL(raymt, CPU, m) { m.impl("beam_step", &beam_step); }
