// Paper Eq. 14's token weights on CUDA: integer counts per micro-batch (integer atomics, so the
// counts are exact and order-independent), then one IEEE division per token.
#include "cuda_utils.cuh"
#include "orsd/microbatch_weights.h"

namespace orsd {
namespace {

__global__ void count_kernel(const uint8_t* __restrict__ mask, const int64_t* __restrict__ microbatch_ids,
                             int64_t length, unsigned long long* __restrict__ counts) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < length;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (mask[p] != 0) atomicAdd(counts + microbatch_ids[p], 1ULL);
  }
}

__global__ void weight_kernel(const uint8_t* __restrict__ mask, const int64_t* __restrict__ microbatch_ids,
                              int64_t length, int64_t num_microbatches,
                              const unsigned long long* __restrict__ counts, float* __restrict__ out) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < length;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const long long denominator = num_microbatches * static_cast<long long>(counts[microbatch_ids[p]]);
    out[p] = mask[p] != 0 ? __fdiv_rn(1.0f, static_cast<float>(denominator)) : 0.0f;
  }
}

}  // namespace

void microbatch_weights_cuda(const uint8_t* mask, const int64_t* microbatch_ids, int64_t length,
                             int64_t num_microbatches, unsigned long long* counts, float* out,
                             int device, StreamHandle stream) {
  if (length == 0) return;
  cuda::DeviceGuard guard(device);
  const cudaStream_t s = cuda::as_stream(stream);
  ORSD_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(unsigned long long) * num_microbatches, s));
  count_kernel<<<cuda::grid_for(length), cuda::kThreads, 0, s>>>(mask, microbatch_ids, length, counts);
  ORSD_CUDA_CHECK_LAUNCH("count_kernel");
  weight_kernel<<<cuda::grid_for(length), cuda::kThreads, 0, s>>>(mask, microbatch_ids, length,
                                                                 num_microbatches, counts, out);
  ORSD_CUDA_CHECK_LAUNCH("weight_kernel");
}

}  // namespace orsd
