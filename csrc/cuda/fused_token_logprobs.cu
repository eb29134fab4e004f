// The per-chunk online log-sum-exp update behind fused_token_logprobs on CUDA: one block per
// token row of an f32 logits chunk (written by a cuBLAS GEMM on the same stream), then thread 0
// folds the chunk's (max, sum) into the token's f64 running state.
#include "lse_block.cuh"
#include "orsd/fused_token_logprobs.h"

namespace orsd {
namespace {

__global__ void __launch_bounds__(cuda::kThreads)
    fused_lse_update_kernel(const float* __restrict__ chunk, int64_t cols, int64_t v0,
                            const int64_t* __restrict__ targets, const uint8_t* __restrict__ mask,
                            float scale, float c, float* __restrict__ state_max,
                            double* __restrict__ state_sum, float* __restrict__ state_target) {
  const int64_t r = blockIdx.x;
  if (mask != nullptr && mask[r] == 0) return;
  const float* row = chunk + r * cols;
  const cuda::RowLse st = cuda::block_row_lse<float, cuda::kThreads>(row, cols, c);
  if (threadIdx.x != 0) return;

  const int64_t target = targets[r];
  if (target >= v0 && target < v0 + cols) state_target[r] = row[target - v0];
  const double old_sum = state_sum[r];
  if (isnan(old_sum)) return;  // already NaN: stays NaN
  if (st.nan) {
    state_sum[r] = NAN;
    return;
  }
  const float old_max = state_max[r];
  const float new_max = fmaxf(old_max, st.max);
  if (new_max == -INFINITY) return;  // only -inf so far: the sum stays 0
  state_max[r] = new_max;
  if (!isfinite(new_max)) {  // +inf: the row's log-softmax is NaN
    state_sum[r] = NAN;
    return;
  }
  double sum = 0.0;
  if (st.max != -INFINITY) sum += static_cast<double>(st.sum) * exp(static_cast<double>(st.max - new_max) * scale);
  if (old_max != -INFINITY) sum += old_sum * exp(static_cast<double>(old_max - new_max) * scale);
  state_sum[r] = sum;
}

__global__ void fused_lse_finalize_kernel(int64_t n, const uint8_t* __restrict__ mask,
                                          float temperature, const float* __restrict__ state_max,
                                          const double* __restrict__ state_sum,
                                          const float* __restrict__ state_target,
                                          float* __restrict__ out_lp, float* __restrict__ out_lse) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float lp = 0.0f, lse = 0.0f;
    if (mask == nullptr || mask[t] != 0) {
      const float max = state_max[t];
      const double sum = state_sum[t];
      if (!isfinite(max) || !isfinite(sum)) {
        lp = lse = NAN;
      } else {
        const float log_sum = static_cast<float>(log(sum));
        const float max_scaled = max / temperature;
        lp = (state_target[t] / temperature - max_scaled) - log_sum;
        lse = max_scaled + log_sum;
      }
    }
    out_lp[t] = lp;
    if (out_lse != nullptr) out_lse[t] = lse;
  }
}

}  // namespace

void fused_lse_update_cuda(const float* chunk, int64_t rows, int64_t cols, int64_t v0,
                           const int64_t* targets, const uint8_t* mask, float temperature,
                           float* state_max, double* state_sum, float* state_target, int device,
                           StreamHandle stream) {
  if (rows == 0 || cols == 0) return;
  if (rows > 0x7fffffffLL) throw std::invalid_argument("fused_lse_update: more than 2^31-1 rows");
  cuda::DeviceGuard guard(device);
  const float scale = 1.0f / temperature;
  fused_lse_update_kernel<<<static_cast<unsigned int>(rows), cuda::kThreads, 0, cuda::as_stream(stream)>>>(
      chunk, cols, v0, targets, mask, scale, 1.4426950408889634f * scale, state_max, state_sum, state_target);
  ORSD_CUDA_CHECK_LAUNCH("fused_lse_update_kernel");
}

void fused_lse_finalize_cuda(int64_t num_tokens, const uint8_t* mask, float temperature,
                             const float* state_max, const double* state_sum,
                             const float* state_target, float* out_lp, float* out_lse, int device,
                             StreamHandle stream) {
  if (num_tokens == 0) return;
  cuda::DeviceGuard guard(device);
  fused_lse_finalize_kernel<<<cuda::grid_for(num_tokens), cuda::kThreads, 0, cuda::as_stream(stream)>>>(
      num_tokens, mask, temperature, state_max, state_sum, state_target, out_lp, out_lse);
  ORSD_CUDA_CHECK_LAUNCH("fused_lse_finalize_kernel");
}

}  // namespace orsd
