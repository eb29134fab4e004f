// GRPO group normalisation on CPU (paper Eq. 2's A_GRPO): three sequential f64 passes over the
// rewards; N is a few thousand at most, so one thread is plenty.
#include "orsd/grpo_advantages.h"

#include <cmath>

namespace orsd {

void grpo_advantages_cpu(const float* rewards, const int64_t* group_ids, int64_t n,
                         int64_t num_groups, double eps, bool norm_by_std, double* workspace,
                         float* out) {
  double* sum = workspace;
  double* count = workspace + num_groups;
  double* sq_dev = workspace + 2 * num_groups;
  for (int64_t g = 0; g < 3 * num_groups; ++g) workspace[g] = 0.0;

  for (int64_t i = 0; i < n; ++i) {
    sum[group_ids[i]] += static_cast<double>(rewards[i]);
    count[group_ids[i]] += 1.0;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = group_ids[i];
    const double dev = static_cast<double>(rewards[i]) - sum[g] / count[g];
    sq_dev[g] += dev * dev;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = group_ids[i];
    // A group of one or a constant group carries no signal: its advantage is exactly 0.
    if (count[g] < 2.0 || sq_dev[g] == 0.0) {
      out[i] = 0.0f;
      continue;
    }
    const double dev = static_cast<double>(rewards[i]) - sum[g] / count[g];
    const double std = std::sqrt(sq_dev[g] / (count[g] - 1.0));
    out[i] = static_cast<float>(norm_by_std ? dev / (std + eps) : dev);
  }
}

}  // namespace orsd
