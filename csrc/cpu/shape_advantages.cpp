// Token advantage shaping on CPU (paper: A = A_GRPO + alpha * e * delta), one pass over L.
#include "orsd/shape_advantages.h"

#include <cmath>

#include "omp_compat.h"

namespace orsd {

void shape_advantages_cpu(const float* lp_plain, const float* lp_rubric, const int64_t* pos_map,
                          const uint8_t* response_mask, const int64_t* seq_ids,
                          const float* seq_adv, float alpha, const uint8_t* eligible,
                          int64_t length, float* adv, float* delta, uint8_t* valid,
                          int num_threads) {
  const int threads =
      cpu::threads_for(static_cast<long>(length), num_threads, cpu::kElementwiseGrain);
  (void)threads;

  ORSD_OMP_PARALLEL_FOR(threads)
  for (int64_t p = 0; p < length; ++p) {
    const int64_t s = seq_ids[p];
    const float d = lp_rubric[pos_map[p]] - lp_plain[p];
    const bool ok = response_mask[p] != 0 && eligible[s] != 0 && std::isfinite(d);
    valid[p] = ok ? 1 : 0;
    delta[p] = ok ? d : 0.0f;
    if (ok) {
      const float shaped = alpha * d;  // rounded on its own, as torch does
      adv[p] = seq_adv[s] + shaped;
    } else {
      adv[p] = response_mask[p] != 0 ? seq_adv[s] : 0.0f;
    }
  }
}

}  // namespace orsd
