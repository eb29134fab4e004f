// shape_advantages (paper's token advantage A = A_GRPO + alpha * e * delta), per position p of the
// plain packing: delta = lp_rubric[pos_map[p]] - lp_plain[p];
// valid = response_mask[p] && eligible[seq_ids[p]] && isfinite(delta);
// adv = seq_adv[seq] + alpha * delta where valid, seq_adv[seq] on other response positions, 0 off
// the response; delta is stored as 0 where not valid. All f32, no contraction into FMAs.
#pragma once

#include "orsd/common.h"

namespace orsd {

void shape_advantages_cpu(const float* lp_plain, const float* lp_rubric, const int64_t* pos_map,
                          const uint8_t* response_mask, const int64_t* seq_ids,
                          const float* seq_adv, float alpha, const uint8_t* eligible,
                          int64_t length, float* adv, float* delta, uint8_t* valid,
                          int num_threads);

void shape_advantages_cuda(const float* lp_plain, const float* lp_rubric, const int64_t* pos_map,
                           const uint8_t* response_mask, const int64_t* seq_ids,
                           const float* seq_adv, float alpha, const uint8_t* eligible,
                           int64_t length, float* adv, float* delta, uint8_t* valid, int device,
                           StreamHandle stream);

}  // namespace orsd
