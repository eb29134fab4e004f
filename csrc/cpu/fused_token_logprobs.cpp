// The per-chunk online log-sum-exp update behind fused_token_logprobs on CPU. The chunk GEMM is
// done by the caller (MKL / torch); here each row's state absorbs one chunk of f32 logits.
#include "orsd/fused_token_logprobs.h"

#include <cmath>
#include <limits>

#include "omp_compat.h"
#include "row_math.h"

namespace orsd {

void fused_lse_update_cpu(const float* chunk, int64_t rows, int64_t cols, int64_t v0,
                          const int64_t* targets, const uint8_t* mask, float temperature,
                          float* state_max, double* state_sum, float* state_target,
                          int num_threads) {
  const cpu::RowMath& math = cpu::row_math();
  const float scale = 1.0f / temperature;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int threads = cpu::threads_for(static_cast<long>(rows * cols), num_threads);
  (void)threads;

  ORSD_OMP_PARALLEL_FOR(threads)
  for (int64_t r = 0; r < rows; ++r) {
    if (mask != nullptr && mask[r] == 0) continue;
    const float* row = chunk + r * cols;
    const int64_t target = targets[r];
    if (target >= v0 && target < v0 + cols) state_target[r] = row[target - v0];
    if (std::isnan(state_sum[r])) continue;  // already NaN: stays NaN

    const float old_max = state_max[r];
    const float chunk_max = math.max_f32(row, cols);
    if (std::isnan(chunk_max)) {  // the row's log-softmax is NaN, whatever comes later
      state_sum[r] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    const float new_max = chunk_max > old_max ? chunk_max : old_max;
    state_max[r] = new_max;
    if (new_max == neg_inf) continue;  // nothing but -inf so far: the sum stays 0
    if (!std::isfinite(new_max)) {     // +inf: the row's log-softmax is NaN
      state_sum[r] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    double sum = math.sumexp_f32(row, cols, new_max, scale);
    if (old_max != neg_inf)
      sum += state_sum[r] * std::exp(static_cast<double>(old_max - new_max) * scale);
    state_sum[r] = sum;
  }
}

void fused_lse_finalize_cpu(int64_t num_tokens, const uint8_t* mask, float temperature,
                            const float* state_max, const double* state_sum,
                            const float* state_target, float* out_lp, float* out_lse,
                            int num_threads) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int threads =
      cpu::threads_for(static_cast<long>(num_tokens), num_threads, cpu::kElementwiseGrain);
  (void)threads;

  ORSD_OMP_PARALLEL_FOR(threads)
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (mask != nullptr && mask[t] == 0) {
      out_lp[t] = 0.0f;
      if (out_lse != nullptr) out_lse[t] = 0.0f;
      continue;
    }
    const float max = state_max[t];
    const double sum = state_sum[t];
    if (!std::isfinite(max) || !std::isfinite(sum)) {
      out_lp[t] = nan;
      if (out_lse != nullptr) out_lse[t] = nan;
      continue;
    }
    const float log_sum = static_cast<float>(std::log(sum));
    const float max_scaled = max / temperature;
    out_lp[t] = (state_target[t] / temperature - max_scaled) - log_sum;
    if (out_lse != nullptr) out_lse[t] = max_scaled + log_sum;
  }
}

}  // namespace orsd
