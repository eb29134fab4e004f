// Paper Eq. 14's token weights on CPU: an exact integer count per micro-batch, then one division.
#include "orsd/microbatch_weights.h"

#include "omp_compat.h"

namespace orsd {

void microbatch_weights_cpu(const uint8_t* mask, const int64_t* microbatch_ids, int64_t length,
                            int64_t num_microbatches, int64_t* counts, float* out,
                            int num_threads) {
  for (int64_t m = 0; m < num_microbatches; ++m) counts[m] = 0;
  for (int64_t p = 0; p < length; ++p) counts[microbatch_ids[p]] += mask[p] != 0;

  const int threads =
      cpu::threads_for(static_cast<long>(length), num_threads, cpu::kElementwiseGrain);
  (void)threads;
  ORSD_OMP_PARALLEL_FOR(threads)
  for (int64_t p = 0; p < length; ++p) {
    const int64_t denominator = num_microbatches * counts[microbatch_ids[p]];
    out[p] = mask[p] != 0 ? 1.0f / static_cast<float>(denominator) : 0.0f;
  }
}

}  // namespace orsd
