// GRPO group normalisation on CUDA: block g owns group g and scans all rewards three times
// (sum, squared deviations, output), reducing in f64 through a fixed shared-memory tree.
#include "cuda_utils.cuh"
#include "orsd/grpo_advantages.h"

namespace orsd {
namespace {

template <typename V, int kBlock>
__device__ V block_sum(V value, V* shared) {
  const int tid = threadIdx.x;
  shared[tid] = value;
  __syncthreads();
#pragma unroll
  for (int stride = kBlock / 2; stride > 0; stride >>= 1) {
    if (tid < stride) shared[tid] += shared[tid + stride];
    __syncthreads();
  }
  const V total = shared[0];
  __syncthreads();  // shared is reused by the next reduction
  return total;
}

__global__ void __launch_bounds__(cuda::kThreads)
    grpo_advantages_kernel(const float* __restrict__ rewards, const int64_t* __restrict__ group_ids,
                           int64_t n, double eps, bool norm_by_std, float* __restrict__ out) {
  __shared__ double shared_sum[cuda::kThreads];
  __shared__ long long shared_count[cuda::kThreads];
  const int64_t g = blockIdx.x;

  double sum = 0.0;
  long long count = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (group_ids[i] == g) {
      sum += static_cast<double>(rewards[i]);
      ++count;
    }
  }
  sum = block_sum<double, cuda::kThreads>(sum, shared_sum);
  count = block_sum<long long, cuda::kThreads>(count, shared_count);
  if (count == 0) return;  // an id nobody uses: nothing to write
  const double mean = sum / static_cast<double>(count);

  double sq_dev = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (group_ids[i] == g) {
      const double dev = static_cast<double>(rewards[i]) - mean;
      sq_dev += dev * dev;
    }
  }
  sq_dev = block_sum<double, cuda::kThreads>(sq_dev, shared_sum);
  // A group of one or a constant group carries no signal: its advantage is exactly 0.
  const bool informative = count >= 2 && sq_dev > 0.0;
  const double std = informative ? sqrt(sq_dev / static_cast<double>(count - 1)) : 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (group_ids[i] != g) continue;
    const double dev = static_cast<double>(rewards[i]) - mean;
    out[i] = informative ? static_cast<float>(norm_by_std ? dev / (std + eps) : dev) : 0.0f;
  }
}

}  // namespace

void grpo_advantages_cuda(const float* rewards, const int64_t* group_ids, int64_t n,
                          int64_t num_groups, double eps, bool norm_by_std, float* out,
                          int device, StreamHandle stream) {
  if (n == 0 || num_groups == 0) return;
  if (num_groups > 0x7fffffffLL) throw std::invalid_argument("grpo_advantages: more than 2^31-1 groups");
  cuda::DeviceGuard guard(device);
  grpo_advantages_kernel<<<static_cast<unsigned int>(num_groups), cuda::kThreads, 0, cuda::as_stream(stream)>>>(
      rewards, group_ids, n, eps, norm_by_std, out);
  ORSD_CUDA_CHECK_LAUNCH("grpo_advantages_kernel");
}

}  // namespace orsd
