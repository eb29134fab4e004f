// lm_head_logprobs' GEMMs on CUDA (internal; included by lm_head_logprobs.cu only): cuBLAS's
// cublasGemmEx through an address and a handle the caller passes, or this module's own tiled kernels.
//
// Own GEMM: 128 x 128 output tile per block of 8 warps, WMMA 16x16x16 tensor-core fragments with
// f32 accumulators for bf16/f16 (each warp 64 x 32), FFMA 4 x 4 per thread for f32 inputs (TF32
// would round the inputs; the contract is f32 logits of the given values). Operand tiles are staged
// in shared memory in their global orientation (coalesced loads; transposes are fragment layouts).
// A plain, unpipelined kernel: correct everywhere, not tuned (247 TFLOP/s on an H200 at T = 32,768
// against cuBLAS's 524 for the whole op); cuBLAS is the fast path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_utils.cuh"

namespace orsd {
namespace {

using namespace nvcuda;


int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

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

// cublasGemmEx's C ABI (cublas_api.h): enums are ints, the handle a pointer. The values below are
// cuBLAS's (CUBLAS_OP_N/T, CUDA_R_*, CUBLAS_COMPUTE_32F[_PEDANTIC], CUBLAS_GEMM_DEFAULT); the Python
// side checks the function on a small product against torch before handing it over.
using GemmExFn = int (*)(void* handle, int transa, int transb, int m, int n, int k, const void* alpha,
                         const void* a, int a_type, int lda, const void* b, int b_type, int ldb,
                         const void* beta, void* c, int c_type, int ldc, int compute_type, int algo);
constexpr int kOpN = 0, kOpT = 1, kR32F = 0, kR16F = 2, kR16BF = 14;
constexpr int kCompute32F = 68, kCompute32FPedantic = 69, kGemmDefault = -1;

struct Blas {
  GemmExFn gemm_ex = nullptr;  // null: this module's own GEMM kernels
  void* handle = nullptr;      // bound to the launch stream by the caller
};

template <typename T>
constexpr int blas_type() {
  return std::is_same_v<T, float> ? kR32F : std::is_same_v<T, __half> ? kR16F : kR16BF;
}

// Row-major C [m, n] = op(A) op(B) is column-major C^T [n, m] = op(B)^T op(A)^T: cuBLAS gets B
// first. f32 inputs compute in pedantic f32 (no TF32, whatever torch allows): the contract is the
// f32 logits of the given values.
template <typename T, bool kTransA, bool kTransB, Epilogue kEpilogue>
void gemm_blas(const GemmArgs<T>& args, const Blas& blas) {
  const float alpha = 1.0f, beta = kEpilogue == Epilogue::kAccumulate ? 1.0f : 0.0f;
  constexpr int type = blas_type<T>();
  void* c = kEpilogue == Epilogue::kStoreCast ? static_cast<void*>(args.out) : static_cast<void*>(args.c);
  const int status = blas.gemm_ex(
      blas.handle, kTransB ? kOpT : kOpN, kTransA ? kOpT : kOpN, static_cast<int>(args.n),
      static_cast<int>(args.m), static_cast<int>(args.k), &alpha, args.b, type, static_cast<int>(args.ldb),
      args.a, type, static_cast<int>(args.lda), &beta, c, kEpilogue == Epilogue::kStoreCast ? type : kR32F,
      static_cast<int>(args.ldc), std::is_same_v<T, float> ? kCompute32FPedantic : kCompute32F, kGemmDefault);
  if (status != 0)
    throw std::runtime_error("lm_head_logprobs: cublasGemmEx returned status " + std::to_string(status) +
                             " (m=" + std::to_string(args.m) + " n=" + std::to_string(args.n) +
                             " k=" + std::to_string(args.k) + ")");
}

template <typename T, bool kTransA, bool kTransB, Epilogue kEpilogue>
void gemm(const GemmArgs<T>& args, cudaStream_t stream, const Blas& blas) {
  if (args.m == 0 || args.n == 0) return;
  if (blas.gemm_ex != nullptr) return gemm_blas<T, kTransA, kTransB, kEpilogue>(args, blas);
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

}  // namespace
}  // namespace orsd
