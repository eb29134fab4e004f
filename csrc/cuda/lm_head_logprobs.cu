// lm_head_logprobs on CUDA (math in orsd/lm_head_logprobs.h): the same block structure as the CPU
// kernel, on the caller's stream, with this module's own tiled GEMM (no cuBLAS: the module links
// only the CUDA runtime).
//
// Layout as on CPU: a logits block is z^T [vocabulary rows, tokens], so each token is a column.
// Forward, per vocabulary block and token chunk: GEMM -> z^T chunk (f32 scratch) -> a column
// kernel folds every token's column into its online (max, sum, weighted sum) state.
// Backward, per vocabulary block: GEMM + elementwise kernel give dL/dz^T for all tokens (gt, in
// the input dtype); then grad_hidden (f32) += gt^T W_block and grad_weight rows = gt hidden, each a
// GEMM whose output tiles are owned by one thread block looping over all of K.
// Every output element has one writer and one summation order: no atomics, reproducible bits.
//
// GEMM: 128 x 128 output tile per block of 8 warps, WMMA 16x16x16 tensor-core fragments with f32
// accumulators for bf16/f16 (each warp 64 x 32), FFMA 4 x 4 per thread for f32 inputs (TF32 would
// round the inputs; the contract is f32 logits of the given values). Operand tiles are staged in
// shared memory in their global orientation (coalesced loads; transposes are fragment layouts).
// A plain, unpipelined kernel: correct everywhere, not tuned (no GPU was available to tune it).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_utils.cuh"
#include "orsd/lm_head_logprobs.h"

namespace orsd {
namespace {

using namespace nvcuda;

constexpr int64_t kVocabBlock = 4096;     // rows of gt: 4096 x T in the input dtype
constexpr int64_t kChunkElements = 16LL << 20;  // z^T chunk: 64 MiB of f32
constexpr float kExponentFloor = -86.0f;  // as on CPU: e^-86 is nothing next to the max term
constexpr float kLog2e = 1.4426950408889634f;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
std::size_t element_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }
std::size_t align_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

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

// ---- GEMM ----------------------------------------------------------------------------------------

// C[m, n] = op(A) op(B): op(A) is A [m, k] (row stride lda) or, with kTransA, A stored [k, m];
// op(B) is B [k, n] or, with kTransB, B stored [n, k]. Outputs: f32 C (store or accumulate) or
// the input type (store, rounded once).
enum class Epilogue { kStore, kAccumulate, kStoreCast };

template <typename T>
struct GemmArgs {
  const T* a;
  int64_t lda;
  const T* b;
  int64_t ldb;
  int64_t m, n, k;
  float* c;  // kStore / kAccumulate
  T* out;    // kStoreCast
  int64_t ldc;
};

template <typename T, Epilogue kEpilogue>
__device__ __forceinline__ void emit(const GemmArgs<T>& args, int64_t row, int64_t col, float value) {
  if (row >= args.m || col >= args.n) return;
  const int64_t at = row * args.ldc + col;
  if constexpr (kEpilogue == Epilogue::kStore) args.c[at] = value;
  else if constexpr (kEpilogue == Epilogue::kAccumulate) args.c[at] += value;
  else args.out[at] = from_float<T>(value);
}

// Copies the [rows, cols] tile at (row0, col0) of a row-major matrix (limits row_limit x
// col_limit, stride ld) into shared memory (row stride sld), zero outside. 16-byte vectors where
// the whole vector is inside and aligned, elements otherwise.
template <typename T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_tile(T* smem, int sld, const T* __restrict__ g, int64_t ld,
                                          int64_t row0, int64_t col0, int64_t row_limit,
                                          int64_t col_limit, bool vector_ok) {
  constexpr int kVec = 16 / sizeof(T);
  static_assert(kCols % kVec == 0, "tile width must hold whole vectors");
  constexpr int kVectors = kRows * kCols / kVec;
  for (int v = threadIdx.x; v < kVectors; v += kThreads) {
    const int r = v / (kCols / kVec), c = (v % (kCols / kVec)) * kVec;
    const int64_t gr = row0 + r, gc = col0 + c;
    T* dst = smem + r * sld + c;
    if (vector_ok && gr < row_limit && gc + kVec <= col_limit) {
      *reinterpret_cast<uint4*>(dst) = __ldg(reinterpret_cast<const uint4*>(g + gr * ld + gc));
      continue;
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      dst[e] = (gr < row_limit && gc + e < col_limit) ? g[gr * ld + gc + e] : from_float<T>(0.0f);
  }
}

constexpr int kGemmThreads = 256;
constexpr int kTileM = 128, kTileN = 128, kTileK = 32, kPad = 8;

// Tensor-core GEMM for bf16 / f16.
template <typename T, bool kTransA, bool kTransB, Epilogue kEpilogue>
__global__ void __launch_bounds__(kGemmThreads) gemm_wmma_kernel(GemmArgs<T> args, bool vector_a,
                                                                 bool vector_b) {
  // Tiles keep the global orientation: A [m, k] or, transposed, [k, m]; B likewise.
  constexpr int kARows = kTransA ? kTileK : kTileM, kACols = kTransA ? kTileM : kTileK;
  constexpr int kBRows = kTransB ? kTileN : kTileK, kBCols = kTransB ? kTileK : kTileN;
  __shared__ __align__(128) T a_tile[kARows * (kACols + kPad)];
  __shared__ __align__(128) T b_tile[kBRows * (kBCols + kPad)];
  __shared__ __align__(128) float stage[kGemmThreads / 32][16 * 16];
  constexpr int lda_s = kACols + kPad, ldb_s = kBCols + kPad;

  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = (warp / 4) * 64, warp_n = (warp % 4) * 32;  // 2 x 4 warps of 64 x 32

  using LayoutA = std::conditional_t<kTransA, wmma::col_major, wmma::row_major>;
  using LayoutB = std::conditional_t<kTransB, wmma::col_major, wmma::row_major>;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (int64_t k0 = 0; k0 < args.k; k0 += kTileK) {
    if constexpr (kTransA)
      load_tile<T, kARows, kACols, kGemmThreads>(a_tile, lda_s, args.a, args.lda, k0, m0, args.k, args.m, vector_a);
    else
      load_tile<T, kARows, kACols, kGemmThreads>(a_tile, lda_s, args.a, args.lda, m0, k0, args.m, args.k, vector_a);
    if constexpr (kTransB)
      load_tile<T, kBRows, kBCols, kGemmThreads>(b_tile, ldb_s, args.b, args.ldb, n0, k0, args.n, args.k, vector_b);
    else
      load_tile<T, kBRows, kBCols, kGemmThreads>(b_tile, ldb_s, args.b, args.ldb, k0, n0, args.k, args.n, vector_b);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> fa[4];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb[2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = warp_m + i * 16;
        const T* p = kTransA ? a_tile + kk * lda_s + row : a_tile + row * lda_s + kk;
        wmma::load_matrix_sync(fa[i], p, lda_s);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = warp_n + j * 16;
        const T* p = kTransB ? b_tile + col * ldb_s + kk : b_tile + kk * ldb_s + col;
        wmma::load_matrix_sync(fb[j], p, ldb_s);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }

  // Each 16 x 16 fragment goes through the warp's staging area, so edges are masked per element.
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(stage[warp], acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32)
        emit<T, kEpilogue>(args, m0 + warp_m + i * 16 + e / 16, n0 + warp_n + j * 16 + e % 16,
                           stage[warp][e]);
      __syncwarp();
    }
}

// CUDA-core GEMM for f32: 64 x 64 tile, each of 256 threads 4 x 4 outputs.
constexpr int kF32Tile = 64, kF32TileK = 16;

template <bool kTransA, bool kTransB, Epilogue kEpilogue>
__global__ void __launch_bounds__(kGemmThreads) gemm_f32_kernel(GemmArgs<float> args) {
  __shared__ float a_tile[kF32TileK][kF32Tile + 4];  // [k][m]
  __shared__ float b_tile[kF32TileK][kF32Tile + 4];  // [k][n]
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kF32Tile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kF32Tile;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < args.k; k0 += kF32TileK) {
    // Consecutive threads read consecutive addresses of the operand's contiguous dimension.
    for (int e = threadIdx.x; e < kF32Tile * kF32TileK; e += kGemmThreads) {
      int i, kk;
      if (kTransA) { i = e % kF32Tile; kk = e / kF32Tile; } else { kk = e % kF32TileK; i = e / kF32TileK; }
      const int64_t gi = m0 + i, gk = k0 + kk;
      a_tile[kk][i] = (gi < args.m && gk < args.k)
                          ? (kTransA ? args.a[gk * args.lda + gi] : args.a[gi * args.lda + gk]) : 0.0f;
      int j;
      if (kTransB) { kk = e % kF32TileK; j = e / kF32TileK; } else { j = e % kF32Tile; kk = e / kF32Tile; }
      const int64_t gj = n0 + j, gk2 = k0 + kk;
      b_tile[kk][j] = (gj < args.n && gk2 < args.k)
                          ? (kTransB ? args.b[gj * args.ldb + gk2] : args.b[gk2 * args.ldb + gj]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kF32TileK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = a_tile[kk][ty * 4 + r];
#pragma unroll
      for (int c = 0; c < 4; ++c) b[c] = b_tile[kk][tx * 4 + c];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][c] = __fmaf_rn(a[r], b[c], acc[r][c]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) emit<float, kEpilogue>(args, m0 + ty * 4 + r, n0 + tx * 4 + c, acc[r][c]);
}

template <typename T>
bool vectorizable(const T* p, int64_t ld) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && (ld * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

template <typename T, bool kTransA, bool kTransB, Epilogue kEpilogue>
void gemm(const GemmArgs<T>& args, cudaStream_t stream) {
  if (args.m == 0 || args.n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    const dim3 grid(static_cast<unsigned>(ceil_div(args.n, kF32Tile)), static_cast<unsigned>(ceil_div(args.m, kF32Tile)));
    gemm_f32_kernel<kTransA, kTransB, kEpilogue><<<grid, kGemmThreads, 0, stream>>>(args);
    ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs gemm_f32_kernel");
  } else {
    const dim3 grid(static_cast<unsigned>(ceil_div(args.n, kTileN)), static_cast<unsigned>(ceil_div(args.m, kTileM)));
    gemm_wmma_kernel<T, kTransA, kTransB, kEpilogue><<<grid, kGemmThreads, 0, stream>>>(
        args, vectorizable(args.a, args.lda), vectorizable(args.b, args.ldb));
    ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs gemm_wmma_kernel");
  }
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

// One thread block per 32 token columns of a z^T chunk [rows, cols] (row stride ld); 8 thread
// rows split the vocabulary rows and merge in a fixed order; the result folds into the tokens'
// f64 state. The chunk is left as z (the target's y is recomputed from it).
__global__ void __launch_bounds__(kColumnsPerBlock * kRowGroups)
    forward_columns_kernel(const float* __restrict__ z, int64_t rows, int64_t cols, int64_t ld,
                           int64_t t0, int64_t v0, Map map, const int64_t* __restrict__ targets,
                           TokenState state) {
  __shared__ Partial partials[kRowGroups][kColumnsPerBlock];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  Partial p{-INFINITY, 0.0f, 0.0f, false};
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowGroups) {
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
  partials[threadIdx.y][threadIdx.x] = p;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int g = 1; g < kRowGroups; ++g) merge(p, partials[g][threadIdx.x]);

  const int64_t t = t0 + c, target = targets[t];
  if (target >= v0 && target < v0 + rows) state.target[t] = map.y(z[(target - v0) * ld + c]);
  if (p.nan) state.nan[t] = 1;
  if (state.nan[t] || p.max == -INFINITY) return;
  float& max = state.max[t];
  double& sum = state.sum[t];
  double& weighted = state.weighted[t];
  if (max == -INFINITY) {
    max = p.max;
    sum = p.sum;
    weighted = p.weighted;
    return;
  }
  const float new_max = fmaxf(max, p.max);
  const double shift_old = static_cast<double>(max) - new_max;
  const double shift_new = static_cast<double>(p.max) - new_max;
  const double scale_old = exp(shift_old), scale_new = exp(shift_new);
  weighted = scale_old * (weighted + shift_old * sum) + scale_new * (p.weighted + shift_new * p.sum);
  sum = scale_old * sum + scale_new * p.sum;
  max = new_max;
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
                   Map map, float* lp, float* lse, float* entropy, const Plan& plan, cudaStream_t stream) {
  const int64_t T_ = shape.num_tokens, V = shape.vocab_size, H = shape.hidden_size;
  init_state_kernel<<<grid_1d(T_), cuda::kThreads, 0, stream>>>(T_, plan.state);
  ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs init_state_kernel");
  for (int64_t v0 = 0; v0 < V; v0 += plan.block_vocab) {
    const int64_t nv = std::min(plan.block_vocab, V - v0);
    for (int64_t t0 = 0; t0 < T_; t0 += plan.chunk_tokens) {
      const int64_t nt = std::min(plan.chunk_tokens, T_ - t0);
      // z^T [nv, nt] = W_block [nv, H] . hidden_chunk [nt, H]^T
      gemm<T, false, true, Epilogue::kStore>(
          {weight + v0 * H, H, hidden + t0 * H, H, nv, nt, H, plan.chunk, nullptr, nt}, stream);
      const dim3 block(kColumnsPerBlock, kRowGroups);
      forward_columns_kernel<<<static_cast<unsigned>(ceil_div(nt, kColumnsPerBlock)), block, 0, stream>>>(
          plan.chunk, nv, nt, nt, t0, v0, map, targets, plan.state);
      ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs forward_columns_kernel");
    }
  }
  finalize_kernel<<<grid_1d(T_), cuda::kThreads, 0, stream>>>(T_, plan.state, lp, lse, entropy);
  ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs finalize_kernel");
}

template <typename T>
void backward_typed(const T* hidden, const T* weight, const LmHeadShape& shape, const int64_t* targets,
                    Map map, const ColumnInputs& inputs, T* grad_hidden, T* grad_weight,
                    const Plan& plan, cudaStream_t stream) {
  const int64_t T_ = shape.num_tokens, V = shape.vocab_size, H = shape.hidden_size;
  constexpr bool kF32 = std::is_same_v<T, float>;
  float* grad_hidden_acc = grad_hidden == nullptr ? nullptr
                           : kF32 ? reinterpret_cast<float*>(grad_hidden) : plan.grad_hidden_f32;
  if (grad_hidden_acc != nullptr)
    ORSD_CUDA_CHECK(cudaMemsetAsync(grad_hidden_acc, 0, static_cast<std::size_t>(T_ * H) * sizeof(float), stream));
  T* gt = reinterpret_cast<T*>(plan.gt);

  for (int64_t v0 = 0; v0 < V; v0 += plan.block_vocab) {
    const int64_t nv = std::min(plan.block_vocab, V - v0);
    for (int64_t t0 = 0; t0 < T_; t0 += plan.chunk_tokens) {
      const int64_t nt = std::min(plan.chunk_tokens, T_ - t0);
      gemm<T, false, true, Epilogue::kStore>(
          {weight + v0 * H, H, hidden + t0 * H, H, nv, nt, H, plan.chunk, nullptr, nt}, stream);
      const dim3 block(kColumnsPerBlock, kRowGroups);
      const dim3 grid(static_cast<unsigned>(ceil_div(nt, kColumnsPerBlock)),
                      static_cast<unsigned>(ceil_div(nv, kRowGroups * kRowsPerThread)));
      backward_columns_kernel<T><<<grid, block, 0, stream>>>(plan.chunk, nv, nt, nt, t0, v0, map,
                                                             inputs, gt, plan.gt_ld);
      ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs backward_columns_kernel");
    }
    if (grad_hidden_acc != nullptr)  // grad_hidden [T, H] += gt^T [T, nv] . W_block [nv, H]
      gemm<T, true, false, Epilogue::kAccumulate>(
          {gt, plan.gt_ld, weight + v0 * H, H, T_, H, nv, grad_hidden_acc, nullptr, H}, stream);
    if (grad_weight != nullptr) {  // grad_weight rows [nv, H] = gt [nv, T] . hidden [T, H]
      if constexpr (kF32)
        gemm<T, false, false, Epilogue::kStore>(
            {gt, plan.gt_ld, hidden, H, nv, H, T_, reinterpret_cast<float*>(grad_weight) + v0 * H, nullptr, H}, stream);
      else
        gemm<T, false, false, Epilogue::kStoreCast>(
            {gt, plan.gt_ld, hidden, H, nv, H, T_, nullptr, grad_weight + v0 * H, H}, stream);
    }
  }
  if (grad_hidden != nullptr && !kF32) {
    cast_kernel<T><<<grid_1d(T_ * H), cuda::kThreads, 0, stream>>>(T_ * H, plan.grad_hidden_f32, grad_hidden);
    ORSD_CUDA_CHECK_LAUNCH("lm_head_logprobs cast_kernel");
  }
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
                                   float* out_lse, float* out_entropy, void* workspace,
                                   std::size_t workspace_bytes, int device, StreamHandle stream) {
  if (shape.num_tokens == 0) return;
  const Plan plan = make_plan(shape, false, workspace);
  check_sizes(shape, plan, workspace_bytes);
  cuda::DeviceGuard guard(device);
  const cudaStream_t s = cuda::as_stream(stream);
  const Map m = make_map(map);
  switch (shape.dtype) {
    case DType::kBFloat16:
      return forward_typed(static_cast<const __nv_bfloat16*>(hidden), static_cast<const __nv_bfloat16*>(weight),
                           shape, targets, m, out_lp, out_lse, out_entropy, plan, s);
    case DType::kFloat16:
      return forward_typed(static_cast<const __half*>(hidden), static_cast<const __half*>(weight), shape,
                           targets, m, out_lp, out_lse, out_entropy, plan, s);
    default:
      return forward_typed(static_cast<const float*>(hidden), static_cast<const float*>(weight), shape,
                           targets, m, out_lp, out_lse, out_entropy, plan, s);
  }
}

void lm_head_logprobs_backward_cuda(const void* hidden, const void* weight,
                                    const LmHeadShape& shape, const int64_t* targets, LogitMap map,
                                    const float* lse, const float* entropy, const float* grad_lp,
                                    const float* grad_entropy, void* grad_hidden,
                                    void* grad_weight, void* workspace,
                                    std::size_t workspace_bytes, int device, StreamHandle stream) {
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
  switch (shape.dtype) {
    case DType::kBFloat16:
      return backward_typed(static_cast<const __nv_bfloat16*>(hidden), static_cast<const __nv_bfloat16*>(weight),
                            shape, targets, m, inputs, static_cast<__nv_bfloat16*>(grad_hidden),
                            static_cast<__nv_bfloat16*>(grad_weight), plan, s);
    case DType::kFloat16:
      return backward_typed(static_cast<const __half*>(hidden), static_cast<const __half*>(weight), shape,
                            targets, m, inputs, static_cast<__half*>(grad_hidden),
                            static_cast<__half*>(grad_weight), plan, s);
    default:
      return backward_typed(static_cast<const float*>(hidden), static_cast<const float*>(weight), shape,
                            targets, m, inputs, static_cast<float*>(grad_hidden),
                            static_cast<float*>(grad_weight), plan, s);
  }
}

}  // namespace orsd
