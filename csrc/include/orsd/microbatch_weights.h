// microbatch_weights (paper Eq. 14): w[p] = mask[p] / (num_microbatches * count[mb(p)]) where
// count[m] is the number of masked-in positions of micro-batch m; 0 in a micro-batch without
// any. Counts are exact integers, so the result does not depend on summation order.
#pragma once

#include "orsd/common.h"

namespace orsd {

// microbatch_ids[p] in [0, num_microbatches); counts: num_microbatches int64, overwritten.
void microbatch_weights_cpu(const uint8_t* mask, const int64_t* microbatch_ids, int64_t length,
                            int64_t num_microbatches, int64_t* counts, float* out,
                            int num_threads);

void microbatch_weights_cuda(const uint8_t* mask, const int64_t* microbatch_ids, int64_t length,
                             int64_t num_microbatches, unsigned long long* counts, float* out,
                             int device, StreamHandle stream);

}  // namespace orsd
