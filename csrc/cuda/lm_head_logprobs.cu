// lm_head_logprobs on CUDA (math in orsd/lm_head_logprobs.h): the same block structure as the CPU
// kernel, on the caller's stream. The GEMMs go to cuBLAS's cublasGemmEx when the caller passes its
// address and a handle (orsd/ops/lm_head_logprobs.py takes both from the torch in the process, as
// the CPU kernel takes MKL's GEMM: this module links only the CUDA runtime and is built without
// cuBLAS headers), else to this module's own tiled GEMM.
//
// Layout as on CPU: a logits block is z^T [vocabulary rows, tokens], so each token is a column.
// Forward, per vocabulary block and token chunk: GEMM -> z^T chunk (f32 scratch) -> a column
// kernel folds every token's column into its online (max, sum, weighted sum) state.
// Backward, per vocabulary block: GEMM + elementwise kernel give dL/dz^T for all tokens (gt, in
// the input dtype); then grad_hidden (f32) += gt^T W_block and grad_weight rows = gt hidden, each a
// GEMM whose output tiles are owned by one thread block looping over all of K.
// Every output element has one writer and one summation order: no atomics, reproducible bits.
// The GEMMs (cuBLAS or our own) are in lm_head_gemm.cuh.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_utils.cuh"
#include "lm_head_gemm.cuh"
#include "orsd/lm_head_logprobs.h"

namespace orsd {
namespace {

constexpr int64_t kVocabBlock = 4096;     // rows of gt: 4096 x T in the input dtype
constexpr int64_t kChunkElements = 16LL << 20;  // z^T chunk: 64 MiB of f32
constexpr float kExponentFloor = -86.0f;  // as on CPU: e^-86 is nothing next to the max term
constexpr float kLog2e = 1.4426950408889634f;

std::size_t element_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }
std::size_t align_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

__device__ __forceinline__ float exp_approx(float x) { return cuda::fast_exp2(x * kLog2e); }

// y = scale * z, or scale * cap * tanh(z / cap); dy_dz alongside for the backward.
struct Map {
  float scale, outer, inverse_cap;
  bool capped;
  __device__ __forceinline__ float y(float z) const {
    return capped ? outer * tanhf(z * inverse_cap) : scale * z;
  }
  __device__ __forceinline__ float y(float z, float& dy_dz) const {
    if (!capped) {
      dy_dz = scale;
      return scale * z;
    }
    const float t = tanhf(z * inverse_cap);
    dy_dz = scale * (1.0f - t * t);
    return outer * t;
  }
};

Map make_map(LogitMap map) {
  const bool capped = map.softcap > 0.0f;
  return {map.scale, capped ? map.scale * map.softcap : 0.0f, capped ? 1.0f / map.softcap : 0.0f,
          capped};
}

// ---- forward ------------------------------------------------------------------------------------

struct TokenState {
  float* max;
  float* target;
  double* sum;
  double* weighted;
  uint8_t* nan;
};

__global__ void init_state_kernel(int64_t n, TokenState state) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    state.max[t] = -INFINITY;
    state.target[t] = 0.0f;
    state.sum[t] = 0.0;
    state.weighted[t] = 0.0;
    state.nan[t] = 0;
  }
}

// Partial online state of one thread: max m, s = sum e^(y-m), a = sum e^(y-m) (y-m).
struct Partial {
  float max, sum, weighted;
  bool nan;
};

// b into a (f32); the max moves only up, and a picks up shift * s as on CPU.
__device__ __forceinline__ void merge(Partial& a, const Partial& b) {
  a.nan |= b.nan;
  if (b.max == -INFINITY) return;
  if (a.max == -INFINITY) {
    a.max = b.max;
    a.sum = b.sum;
    a.weighted = b.weighted;
    return;
  }
  const float max = fmaxf(a.max, b.max);
  const float shift_a = a.max - max, shift_b = b.max - max;
  const float scale_a = exp_approx(shift_a), scale_b = exp_approx(shift_b);
  a.weighted = scale_a * (a.weighted + shift_a * a.sum) + scale_b * (b.weighted + shift_b * b.sum);
  a.sum = scale_a * a.sum + scale_b * b.sum;
  a.max = max;
}

constexpr int kColumnsPerBlock = 32, kRowGroups = 8;
constexpr int64_t kMaxSegments = 64;

// Thread block (32 token columns, one segment of vocabulary rows) of a z^T chunk [rows, cols] (row
// stride ld): 8 thread rows split the segment and merge in a fixed order into
// partials[segment, column]. Segments give small chunks (few tokens) enough blocks to fill the GPU.
__global__ void __launch_bounds__(kColumnsPerBlock * kRowGroups)
    forward_columns_kernel(const float* __restrict__ z, int64_t rows, int64_t cols, int64_t ld,
                           int64_t segment_rows, Map map, Partial* __restrict__ partials) {
  __shared__ Partial shared[kRowGroups][kColumnsPerBlock];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * segment_rows;
  const int64_t r_end = r_begin + segment_rows < rows ? r_begin + segment_rows : rows;
  Partial p{-INFINITY, 0.0f, 0.0f, false};
  if (c < cols) {
#pragma unroll 4
    for (int64_t r = r_begin + threadIdx.y; r < r_end; r += kRowGroups) {
      const float y = map.y(z[r * ld + c]);
      if (isnan(y) || y == INFINITY) {
        p.nan = true;
        continue;
      }
      if (y > p.max) {
        if (p.max != -INFINITY) {
          const float shift = p.max - y, scale = exp_approx(shift);
          p.weighted = scale * (p.weighted + shift * p.sum);
          p.sum *= scale;
        }
        p.max = y;
      }
      const float d = fmaxf(y - p.max, kExponentFloor);  // -inf - -inf = NaN: fmaxf takes the floor
      const float e = exp_approx(d);
      p.sum += e;
      p.weighted += e * d;
    }
  }
  shared[threadIdx.y][threadIdx.x] = p;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int g = 1; g < kRowGroups; ++g) merge(p, shared[g][threadIdx.x]);
  partials[static_cast<int64_t>(blockIdx.y) * cols + c] = p;
}

// Folds each column's segment partials (in segment order) into its token's f64 state, and picks up
// the target's y when the target lies in this vocabulary block. The chunk is left as z.
__global__ void fold_columns_kernel(const Partial* __restrict__ partials, int64_t segments,
                                    const float* __restrict__ z, int64_t rows, int64_t cols,
                                    int64_t ld, int64_t t0, int64_t v0, Map map,
                                    const int64_t* __restrict__ targets, TokenState state) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Partial p = partials[c];
    for (int64_t s = 1; s < segments; ++s) merge(p, partials[s * cols + c]);
    const int64_t t = t0 + c, target = targets[t];
    if (target >= v0 && target < v0 + rows) state.target[t] = map.y(z[(target - v0) * ld + c]);
    if (p.nan) state.nan[t] = 1;
    if (state.nan[t] || p.max == -INFINITY) continue;
    float& max = state.max[t];
    double& sum = state.sum[t];
    double& weighted = state.weighted[t];
    if (max == -INFINITY) {
      max = p.max;
      sum = p.sum;
      weighted = p.weighted;
      continue;
    }
    const float new_max = fmaxf(max, p.max);
    const double shift_old = static_cast<double>(max) - new_max;
    const double shift_new = static_cast<double>(p.max) - new_max;
    const double scale_old = exp(shift_old), scale_new = exp(shift_new);
    weighted = scale_old * (weighted + shift_old * sum) + scale_new * (p.weighted + shift_new * p.sum);
    sum = scale_old * sum + scale_new * p.sum;
    max = new_max;
  }
}

__global__ void finalize_kernel(int64_t n, TokenState state, float* __restrict__ lp,
                                float* __restrict__ lse, float* __restrict__ entropy) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float max = state.max[t];
    const double sum = state.sum[t];
    if (state.nan[t] || !isfinite(max) || !(sum > 0.0)) {
      lp[t] = lse[t] = NAN;
      if (entropy != nullptr) entropy[t] = NAN;
      continue;
    }
    const double log_sum = log(sum);
    lp[t] = (state.target[t] - max) - static_cast<float>(log_sum);
    lse[t] = max + static_cast<float>(log_sum);
    if (entropy != nullptr) entropy[t] = static_cast<float>(log_sum - state.weighted[t] / sum);
  }
}

// ---- backward -----------------------------------------------------------------------------------

struct ColumnInputs {
  const float* lse;
  const float* entropy;       // may be null
  const float* grad_lp;       // may be null
  const float* grad_entropy;  // may be null
  const int64_t* targets;
};

constexpr int kRowsPerThread = 8;

// dL/dz^T of a z^T chunk [rows, cols] into gt (row stride ldg) at column offset t0.
template <typename T>
__global__ void __launch_bounds__(kColumnsPerBlock * kRowGroups)
    backward_columns_kernel(const float* __restrict__ z, int64_t rows, int64_t cols, int64_t ld,
                            int64_t t0, int64_t v0, Map map, ColumnInputs in, T* __restrict__ gt,
                            int64_t ldg) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  if (c >= cols) return;
  const int64_t t = t0 + c;
  const float lse = in.lse[t];
  const float entropy = in.entropy == nullptr ? 0.0f : in.entropy[t];
  const float grad_lp = in.grad_lp == nullptr ? 0.0f : in.grad_lp[t];
  const float grad_entropy = in.grad_entropy == nullptr ? 0.0f : in.grad_entropy[t];
  const int64_t target_row = in.targets[t] - v0;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowGroups * kRowsPerThread + threadIdx.y;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t r = r0 + i * kRowGroups;
    if (r >= rows) break;
    float dy_dz;
    const float y = map.y(z[r * ld + c], dy_dz);
    const float log_p = y - lse;
    const float p = exp_approx(log_p);  // a NaN lse (NaN row) gives NaN, as torch does
    float dy = -(p * (grad_lp + grad_entropy * (fmaxf(log_p, kExponentFloor) + entropy)));
    if (r == target_row) dy += grad_lp;
    gt[r * ldg + t] = from_float<T>(dy * dy_dz);
  }
}

template <typename T>
__global__ void cast_kernel(int64_t n, const float* __restrict__ src, T* __restrict__ dst) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_float<T>(src[i]);
}

// ---- workspace plan ------------------------------------------------------------------------------

struct Plan {
  int64_t block_vocab = 0, chunk_tokens = 0, gt_ld = 0;
  TokenState state{};
  float* chunk = nullptr;
  Partial* partials = nullptr;  // forward: [segments, chunk_tokens]
  int64_t max_segments = 1;
  unsigned char* gt = nullptr;
  float* grad_hidden_f32 = nullptr;
  std::size_t bytes = 0;
};

Plan make_plan(const LmHeadShape& shape, bool backward, void* workspace) {
  const int64_t T = shape.num_tokens, H = shape.hidden_size;
  Plan plan;
  plan.block_vocab = std::min(kVocabBlock, shape.vocab_size);
  plan.chunk_tokens = std::max<int64_t>(kColumnsPerBlock, kChunkElements / plan.block_vocab / kColumnsPerBlock * kColumnsPerBlock);
  plan.chunk_tokens = std::min(plan.chunk_tokens, ceil_div(T, kColumnsPerBlock) * kColumnsPerBlock);
  plan.gt_ld = ceil_div(T, 8) * 8;  // 16-byte aligned rows for the GEMM's vector loads
  auto* base = static_cast<unsigned char*>(workspace);
  std::size_t used = 0;
  auto take = [&](std::size_t bytes) {
    unsigned char* p = base == nullptr ? nullptr : base + used;
    used += align_up(bytes);
    return p;
  };
  const std::size_t t = static_cast<std::size_t>(T);
  plan.chunk = reinterpret_cast<float*>(take(static_cast<std::size_t>(plan.block_vocab * plan.chunk_tokens) * sizeof(float)));
  if (!backward) {
    plan.max_segments = std::min(kMaxSegments, ceil_div(plan.block_vocab, kRowGroups));
    plan.partials = reinterpret_cast<Partial*>(
        take(static_cast<std::size_t>(plan.max_segments * plan.chunk_tokens) * sizeof(Partial)));
    plan.state.max = reinterpret_cast<float*>(take(t * sizeof(float)));
    plan.state.target = reinterpret_cast<float*>(take(t * sizeof(float)));
    plan.state.sum = reinterpret_cast<double*>(take(t * sizeof(double)));
    plan.state.weighted = reinterpret_cast<double*>(take(t * sizeof(double)));
    plan.state.nan = take(t);
  } else {
    plan.gt = take(static_cast<std::size_t>(plan.block_vocab * plan.gt_ld) * element_size(shape.dtype));
    if (shape.dtype != DType::kFloat32)
      plan.grad_hidden_f32 = reinterpret_cast<float*>(take(t * static_cast<std::size_t>(H) * sizeof(float)));
  }
  plan.bytes = used;
  return plan;
}

unsigned int grid_1d(int64_t n) { return cuda::grid_for(std::max<int64_t>(n, 1)); }

template <typename T>
void forward_typed(const T* hidden, const T* weight, const LmHeadShape& shape, const int64_t* targets,
                   Map map, float* lp, float* lse, float* entropy, const Plan& plan, cudaStream_t stream,
                   const Blas& blas, int multiprocessors) {
  const int64_t T_ = shape.num_tokens, V = shape.vocab_size, H = shape.hidden_size;
  init_state_kernel<<<grid_1d(T_), cuda::kThreads, 0, stream>>>(T_, plan.state);
  ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs init_state_kernel");
  for (int64_t v0 = 0; v0 < V; v0 += plan.block_vocab) {
    const int64_t nv = std::min(plan.block_vocab, V - v0);
    for (int64_t t0 = 0; t0 < T_; t0 += plan.chunk_tokens) {
      const int64_t nt = std::min(plan.chunk_tokens, T_ - t0);
      // z^T [nv, nt] = W_block [nv, H] . hidden_chunk [nt, H]^T
      gemm<T, false, true, Epilogue::kStore>(
          {weight + v0 * H, H, hidden + t0 * H, H, nv, nt, H, plan.chunk, nullptr, nt}, stream, blas);
      // Enough row segments for ~4 blocks per multiprocessor, each segment at least 128 rows.
      const int64_t column_blocks = ceil_div(nt, kColumnsPerBlock);
      const int64_t segments = std::clamp<int64_t>(
          ceil_div(4LL * multiprocessors, column_blocks), 1, std::min(plan.max_segments, ceil_div(nv, 128)));
      const int64_t segment_rows = ceil_div(nv, segments);
      const dim3 block(kColumnsPerBlock, kRowGroups);
      const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(ceil_div(nv, segment_rows)));
      forward_columns_kernel<<<grid, block, 0, stream>>>(plan.chunk, nv, nt, nt, segment_rows, map, plan.partials);
      ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs forward_columns_kernel");
      fold_columns_kernel<<<grid_1d(nt), cuda::kThreads, 0, stream>>>(
          plan.partials, grid.y, plan.chunk, nv, nt, nt, t0, v0, map, targets, plan.state);
      ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs fold_columns_kernel");
    }
  }
  finalize_kernel<<<grid_1d(T_), cuda::kThreads, 0, stream>>>(T_, plan.state, lp, lse, entropy);
  ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs finalize_kernel");
}

template <typename T>
void backward_typed(const T* hidden, const T* weight, const LmHeadShape& shape, const int64_t* targets,
                    Map map, const ColumnInputs& inputs, T* grad_hidden, T* grad_weight,
                    const Plan& plan, cudaStream_t stream, const Blas& blas) {
  const int64_t T_ = shape.num_tokens, V = shape.vocab_size, H = shape.hidden_size;
  constexpr bool kF32 = std::is_same_v<T, float>;
  float* grad_hidden_acc = grad_hidden == nullptr ? nullptr
                           : kF32 ? reinterpret_cast<float*>(grad_hidden) : plan.grad_hidden_f32;
  if (grad_hidden_acc != nullptr)
    ORSD_CUDA_CHECK(cudaMemsetAsync(grad_hidden_acc, 0, static_cast<std::size_t>(T_ * H) * sizeof(float), stream));
  T* gt = reinterpret_cast<T*>(plan.gt);
  // gt's padding columns [T, gt_ld) are never written by the column kernel, but cuBLAS's vector
  // loads may read them (their products land only in output rows it does not store): zeroed once,
  // so no GEMM ever reads uninitialised memory (compute-sanitizer initcheck flagged the reads).
  if (plan.gt_ld > T_)
    ORSD_CUDA_CHECK(cudaMemsetAsync(plan.gt, 0, static_cast<std::size_t>(plan.block_vocab * plan.gt_ld) * sizeof(T), stream));

  for (int64_t v0 = 0; v0 < V; v0 += plan.block_vocab) {
    const int64_t nv = std::min(plan.block_vocab, V - v0);
    for (int64_t t0 = 0; t0 < T_; t0 += plan.chunk_tokens) {
      const int64_t nt = std::min(plan.chunk_tokens, T_ - t0);
      gemm<T, false, true, Epilogue::kStore>(
          {weight + v0 * H, H, hidden + t0 * H, H, nv, nt, H, plan.chunk, nullptr, nt}, stream, blas);
      const dim3 block(kColumnsPerBlock, kRowGroups);
      const dim3 grid(static_cast<unsigned>(ceil_div(nt, kColumnsPerBlock)),
                      static_cast<unsigned>(ceil_div(nv, kRowGroups * kRowsPerThread)));
      backward_columns_kernel<T><<<grid, block, 0, stream>>>(plan.chunk, nv, nt, nt, t0, v0, map,
                                                             inputs, gt, plan.gt_ld);
      ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs backward_columns_kernel");
    }
    if (grad_hidden_acc != nullptr)  // grad_hidden [T, H] += gt^T [T, nv] . W_block [nv, H]
      gemm<T, true, false, Epilogue::kAccumulate>(
          {gt, plan.gt_ld, weight + v0 * H, H, T_, H, nv, grad_hidden_acc, nullptr, H}, stream, blas);
    if (grad_weight != nullptr) {  // grad_weight rows [nv, H] = gt [nv, T] . hidden [T, H]
      if constexpr (kF32)
        gemm<T, false, false, Epilogue::kStore>(
            {gt, plan.gt_ld, hidden, H, nv, H, T_, reinterpret_cast<float*>(grad_weight) + v0 * H, nullptr, H}, stream, blas);
      else
        gemm<T, false, false, Epilogue::kStoreCast>(
            {gt, plan.gt_ld, hidden, H, nv, H, T_, nullptr, grad_weight + v0 * H, H}, stream, blas);
    }
  }
  if (grad_hidden != nullptr && !kF32) {
    cast_kernel<T><<<grid_1d(T_ * H), cuda::kThreads, 0, stream>>>(T_ * H, plan.grad_hidden_f32, grad_hidden);
    ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs cast_kernel");
  }
}

Blas make_blas(const void* gemm_ex, void* handle) {
  if ((gemm_ex == nullptr) != (handle == nullptr))
    throw std::invalid_argument("lm_head_logprobs: gemm_ex and blas_handle must both be given or both be null");
  return {reinterpret_cast<GemmExFn>(const_cast<void*>(gemm_ex)), handle};
}

void check_sizes(const LmHeadShape& shape, const Plan& plan, std::size_t workspace_bytes) {
  if (workspace_bytes < plan.bytes)
    throw std::invalid_argument("lm_head_logprobs: workspace of " + std::to_string(workspace_bytes) +
                                " bytes, the kernel needs " + std::to_string(plan.bytes));
  // Grid y is limited to 65535 blocks of 128 (or 64) rows.
  if (ceil_div(std::max(shape.num_tokens, plan.block_vocab), kF32Tile) > 65535)
    throw std::invalid_argument("lm_head_logprobs: more than 4,194,240 tokens in one call");
}

}  // namespace

std::size_t lm_head_logprobs_workspace_cuda(const LmHeadShape& shape, bool backward) {
  return make_plan(shape, backward, nullptr).bytes;
}

void lm_head_logprobs_forward_cuda(const void* hidden, const void* weight, const LmHeadShape& shape,
                                   const int64_t* targets, LogitMap map, float* out_lp,
                                   float* out_lse, float* out_entropy, const void* gemm_ex,
                                   void* blas_handle, void* workspace, std::size_t workspace_bytes,
                                   int device, StreamHandle stream) {
  if (shape.num_tokens == 0) return;
  const Plan plan = make_plan(shape, false, workspace);
  check_sizes(shape, plan, workspace_bytes);
  cuda::DeviceGuard guard(device);
  const cudaStream_t s = cuda::as_stream(stream);
  const Map m = make_map(map);
  const Blas blas = make_blas(gemm_ex, blas_handle);
  int sms = 0;
  ORSD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  switch (shape.dtype) {
    case DType::kBFloat16:
      return forward_typed(static_cast<const __nv_bfloat16*>(hidden), static_cast<const __nv_bfloat16*>(weight),
                           shape, targets, m, out_lp, out_lse, out_entropy, plan, s, blas, sms);
    case DType::kFloat16:
      return forward_typed(static_cast<const __half*>(hidden), static_cast<const __half*>(weight), shape,
                           targets, m, out_lp, out_lse, out_entropy, plan, s, blas, sms);
    default:
      return forward_typed(static_cast<const float*>(hidden), static_cast<const float*>(weight), shape,
                           targets, m, out_lp, out_lse, out_entropy, plan, s, blas, sms);
  }
}

void lm_head_logprobs_backward_cuda(const void* hidden, const void* weight,
                                    const LmHeadShape& shape, const int64_t* targets, LogitMap map,
                                    const float* lse, const float* entropy, const float* grad_lp,
                                    const float* grad_entropy, void* grad_hidden,
                                    void* grad_weight, const void* gemm_ex, void* blas_handle,
                                    void* workspace, std::size_t workspace_bytes, int device,
                                    StreamHandle stream) {
  if (grad_hidden == nullptr && grad_weight == nullptr) return;
  cuda::DeviceGuard guard(device);
  const cudaStream_t s = cuda::as_stream(stream);
  const std::size_t es = element_size(shape.dtype);
  if (shape.num_tokens == 0) {
    if (grad_weight != nullptr)
      ORSD_CUDA_CHECK(cudaMemsetAsync(grad_weight, 0, static_cast<std::size_t>(shape.vocab_size * shape.hidden_size) * es, s));
    return;
  }
  const Plan plan = make_plan(shape, true, workspace);
  check_sizes(shape, plan, workspace_bytes);
  const Map m = make_map(map);
  const ColumnInputs inputs{lse, entropy, grad_lp, grad_entropy, targets};
  const Blas blas = make_blas(gemm_ex, blas_handle);
  switch (shape.dtype) {
    case DType::kBFloat16:
      return backward_typed(static_cast<const __nv_bfloat16*>(hidden), static_cast<const __nv_bfloat16*>(weight),
                            shape, targets, m, inputs, static_cast<__nv_bfloat16*>(grad_hidden),
                            static_cast<__nv_bfloat16*>(grad_weight), plan, s, blas);
    case DType::kFloat16:
      return backward_typed(static_cast<const __half*>(hidden), static_cast<const __half*>(weight), shape,
                            targets, m, inputs, static_cast<__half*>(grad_hidden),
                            static_cast<__half*>(grad_weight), plan, s, blas);
    default:
      return backward_typed(static_cast<const float*>(hidden), static_cast<const float*>(weight), shape,
                            targets, m, inputs, static_cast<float*>(grad_hidden),
                            static_cast<float*>(grad_weight), plan, s, blas);
  }
}

}  // namespace orsd
