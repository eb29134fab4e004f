// token_logprobs on CUDA: one 256-thread block per row, one pass over the row with 16-byte loads
// and an online (max, sum) per thread, merged in a fixed tree. Reads each logit once.
#include "lse_block.cuh"
#include "orsd/token_logprobs.h"

namespace orsd {
namespace {

template <typename T>
__global__ void __launch_bounds__(cuda::kThreads)
    token_logprobs_kernel(const T* __restrict__ logits, int64_t vocab_size,
                          const int64_t* __restrict__ targets, const uint8_t* __restrict__ mask,
                          float temperature, float c, float* __restrict__ out_lp,
                          float* __restrict__ out_lse) {
  const int64_t t = blockIdx.x;
  if (mask != nullptr && mask[t] == 0) {  // uniform across the block: no one reaches a barrier
    if (threadIdx.x == 0) {
      out_lp[t] = 0.0f;
      if (out_lse != nullptr) out_lse[t] = 0.0f;
    }
    return;
  }
  const T* row = logits + t * vocab_size;
  const cuda::RowLse st = cuda::block_row_lse<T, cuda::kThreads>(row, vocab_size, c);
  if (threadIdx.x != 0) return;
  if (st.nan || !isfinite(st.max)) {
    out_lp[t] = NAN;
    if (out_lse != nullptr) out_lse[t] = NAN;
    return;
  }
  const float log_sum = logf(st.sum);
  const float max_scaled = st.max / temperature;
  // Same operation order as torch.log_softmax(x / temperature): (x/T - max/T) - log(sum).
  out_lp[t] = (cuda::to_float(row[targets[t]]) / temperature - max_scaled) - log_sum;
  if (out_lse != nullptr) out_lse[t] = max_scaled + log_sum;
}

template <typename T>
void launch(const void* logits, int64_t T_, int64_t V, const int64_t* targets, const uint8_t* mask,
            float temperature, float* out_lp, float* out_lse, cudaStream_t stream) {
  const float c = 1.4426950408889634f / temperature;
  token_logprobs_kernel<T><<<static_cast<unsigned int>(T_), cuda::kThreads, 0, stream>>>(
      static_cast<const T*>(logits), V, targets, mask, temperature, c, out_lp, out_lse);
  ORSD_CUDA_CHECK_LAUNCH("token_logprobs_kernel");
}

}  // namespace

void token_logprobs_cuda(const void* logits, DType dtype, int64_t num_tokens, int64_t vocab_size,
                         const int64_t* targets, const uint8_t* mask, float temperature,
                         float* out_lp, float* out_lse, int device, StreamHandle stream) {
  if (num_tokens == 0) return;
  if (num_tokens > 0x7fffffffLL) throw std::invalid_argument("token_logprobs: more than 2^31-1 rows");
  cuda::DeviceGuard guard(device);
  const cudaStream_t s = cuda::as_stream(stream);
  switch (dtype) {
    case DType::kBFloat16:
      launch<__nv_bfloat16>(logits, num_tokens, vocab_size, targets, mask, temperature, out_lp, out_lse, s);
      break;
    case DType::kFloat16:
      launch<__half>(logits, num_tokens, vocab_size, targets, mask, temperature, out_lp, out_lse, s);
      break;
    default:
      launch<float>(logits, num_tokens, vocab_size, targets, mask, temperature, out_lp, out_lse, s);
  }
}

}  // namespace orsd
