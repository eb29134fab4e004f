// token_logprobs on CPU: per row, a max pass then a sum-of-exp pass (the row is L2-resident by
// then), rows spread over OpenMP threads. Nothing of size T x V is ever allocated.
#include "orsd/token_logprobs.h"

#include <cmath>
#include <limits>

#include "omp_compat.h"
#include "row_math.h"

namespace orsd {

void token_logprobs_cpu(const void* logits, DType dtype, int64_t num_tokens, int64_t vocab_size,
                        const int64_t* targets, const uint8_t* mask, float temperature,
                        float* out_lp, float* out_lse, int num_threads) {
  const cpu::RowMath& math = cpu::row_math();
  const auto* base = static_cast<const unsigned char*>(logits);
  const std::size_t row_bytes = cpu::dtype_size(dtype) * static_cast<std::size_t>(vocab_size);
  const float scale = 1.0f / temperature;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int threads = cpu::threads_for(static_cast<long>(num_tokens * vocab_size), num_threads);
  (void)threads;

  ORSD_OMP_PARALLEL_FOR(threads)
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (mask != nullptr && mask[t] == 0) {
      out_lp[t] = 0.0f;
      if (out_lse != nullptr) out_lse[t] = 0.0f;
      continue;
    }
    const void* row = base + static_cast<std::size_t>(t) * row_bytes;
    const float max = cpu::row_max(math, row, dtype, vocab_size);
    if (!std::isfinite(max)) {
      out_lp[t] = nan;
      if (out_lse != nullptr) out_lse[t] = nan;
      continue;
    }
    const double sum = cpu::row_sumexp(math, row, dtype, vocab_size, max, scale);
    const float log_sum = static_cast<float>(std::log(sum));
    // Same operation order as torch.log_softmax(x / temperature): (x/T - max/T) - log(sum).
    const float max_scaled = max / temperature;
    const float target_scaled = cpu::load_as_float(row, dtype, targets[t]) / temperature;
    out_lp[t] = (target_scaled - max_scaled) - log_sum;
    if (out_lse != nullptr) out_lse[t] = max_scaled + log_sum;
  }
}

}  // namespace orsd
