// grpo_advantages: per group g, out[i] = (r_i - mean_g) / (std_g + eps) with the sample std
// (n - 1), or r_i - mean_g when !norm_by_std; 0 for every member of a group of one or of a
// constant group. Sums, means and squared deviations are f64; the result is rounded to f32 once.
#pragma once

#include "orsd/common.h"

namespace orsd {

// group_ids[i] in [0, num_groups). workspace: 3 * num_groups doubles, overwritten.
void grpo_advantages_cpu(const float* rewards, const int64_t* group_ids, int64_t n,
                         int64_t num_groups, double eps, bool norm_by_std, double* workspace,
                         float* out);

// One block per group; every block scans all n rewards (O(n * num_groups) loads, fine for RL
// batch sizes) so that each group's sums run in one fixed order without atomics.
void grpo_advantages_cuda(const float* rewards, const int64_t* group_ids, int64_t n,
                          int64_t num_groups, double eps, bool norm_by_std, float* out,
                          int device, StreamHandle stream);

}  // namespace orsd
