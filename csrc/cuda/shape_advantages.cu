// Token advantage shaping on CUDA: element-wise, with explicitly rounded f32 operations so the
// result matches the CPU kernel and the torch reference bit for bit.
#include "cuda_utils.cuh"
#include "orsd/shape_advantages.h"

namespace orsd {
namespace {

__global__ void shape_advantages_kernel(const float* __restrict__ lp_plain,
                                        const float* __restrict__ lp_rubric,
                                        const int64_t* __restrict__ pos_map,
                                        const uint8_t* __restrict__ response_mask,
                                        const int64_t* __restrict__ seq_ids,
                                        const float* __restrict__ seq_adv, float alpha,
                                        const uint8_t* __restrict__ eligible, int64_t length,
                                        float* __restrict__ adv, float* __restrict__ delta,
                                        uint8_t* __restrict__ valid) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < length;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = seq_ids[p];
    const float d = __fsub_rn(lp_rubric[pos_map[p]], lp_plain[p]);
    const bool on_response = response_mask[p] != 0;
    const bool ok = on_response && eligible[s] != 0 && isfinite(d);
    valid[p] = ok ? 1 : 0;
    delta[p] = ok ? d : 0.0f;
    adv[p] = ok ? __fadd_rn(seq_adv[s], __fmul_rn(alpha, d)) : (on_response ? seq_adv[s] : 0.0f);
  }
}

}  // namespace

void shape_advantages_cuda(const float* lp_plain, const float* lp_rubric, const int64_t* pos_map,
                           const uint8_t* response_mask, const int64_t* seq_ids,
                           const float* seq_adv, float alpha, const uint8_t* eligible,
                           int64_t length, float* adv, float* delta, uint8_t* valid, int device,
                           StreamHandle stream) {
  if (length == 0) return;
  cuda::DeviceGuard guard(device);
  shape_advantages_kernel<<<cuda::grid_for(length), cuda::kThreads, 0, cuda::as_stream(stream)>>>(
      lp_plain, lp_rubric, pos_map, response_mask, seq_ids, seq_adv, alpha, eligible, length, adv,
      delta, valid);
  ORSD_CUDA_CHECK_LAUNCH("shape_advantages_kernel");
}

}  // namespace orsd
