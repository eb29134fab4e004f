// One thread block computes the online log-sum-exp of one row (internal, shared by
// token_logprobs.cu and fused_token_logprobs.cu). State per thread: running max m of the raw
// values, s = sum of 2^((x - m) * c) with c = log2(e) / temperature, and a NaN flag.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda_utils.cuh"

namespace orsd::cuda {

struct RowLse {
  float max;
  float sum;
  bool nan;
};

__device__ __forceinline__ void absorb(RowLse& st, const float* v, int n, float c) {
  float local = v[0];
  bool nan = v[0] != v[0];
#pragma unroll
  for (int k = 1; k < n; ++k) {
    local = fmaxf(local, v[k]);  // fmaxf ignores NaN; the flag records it
    nan |= v[k] != v[k];
  }
  st.nan |= nan;
  if (local > st.max) {
    st.sum *= fast_exp2((st.max - local) * c);  // 0 * 2^-inf = 0 while max was -inf
    st.max = local;
  }
  if (st.max == -INFINITY) return;  // only -inf (or NaN) seen: those add nothing
#pragma unroll
  for (int k = 0; k < n; ++k) st.sum += fast_exp2((v[k] - st.max) * c);
}

__device__ __forceinline__ void merge(RowLse& a, const RowLse& b, float c) {
  a.nan |= b.nan;
  if (b.max == -INFINITY) return;
  if (a.max == -INFINITY) {
    a.max = b.max;
    a.sum = b.sum;
    return;
  }
  const float m = fmaxf(a.max, b.max);
  a.sum = a.sum * fast_exp2((a.max - m) * c) + b.sum * fast_exp2((b.max - m) * c);
  a.max = m;
}

// 16-byte vectors of each element type, widened to f32 in some order (order is irrelevant to a
// max and a sum).
template <typename T>
struct Vec16;
template <>
struct Vec16<float> {
  static constexpr int kElems = 4;
  __device__ __forceinline__ static void widen(uint4 w, float* out) {
    out[0] = __uint_as_float(w.x);
    out[1] = __uint_as_float(w.y);
    out[2] = __uint_as_float(w.z);
    out[3] = __uint_as_float(w.w);
  }
};
template <>
struct Vec16<__nv_bfloat16> {
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void widen(uint4 w, float* out) {
    const unsigned int words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = __uint_as_float(words[k] << 16);
      out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  }
};
template <>
struct Vec16<__half> {
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void widen(uint4 w, float* out) {
    const unsigned int words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      __half2 h;
      memcpy(&h, &words[k], sizeof h);
      const float2 f = __half22float2(h);
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
  }
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// Block-wide (m, s, nan) of row[0, n). Every thread must call it; the result is valid in
// thread 0. Work split and merge order depend only on blockDim, so results are reproducible.
template <typename T, int kBlock>
__device__ RowLse block_row_lse(const T* __restrict__ row, int64_t n, float c) {
  constexpr int kElems = Vec16<T>::kElems;
  RowLse st{-INFINITY, 0.0f, false};
  const int tid = threadIdx.x;

  // Scalar head up to 16-byte alignment, vector body, scalar tail.
  const auto address = reinterpret_cast<std::uintptr_t>(row);
  int64_t head = static_cast<int64_t>((16 - address % 16) % 16) / static_cast<int64_t>(sizeof(T));
  if (head > n) head = n;
  if (tid < head) {
    const float v = to_float(row[tid]);
    absorb(st, &v, 1, c);
  }
  const int64_t num_vectors = (n - head) / kElems;
  const uint4* vectors = reinterpret_cast<const uint4*>(row + head);
  float a[kElems], b[kElems];
  int64_t i = tid;
  for (; i + kBlock < num_vectors; i += 2 * kBlock) {  // two loads in flight per thread
    const uint4 wa = __ldg(vectors + i);
    const uint4 wb = __ldg(vectors + i + kBlock);
    Vec16<T>::widen(wa, a);
    Vec16<T>::widen(wb, b);
    absorb(st, a, kElems, c);
    absorb(st, b, kElems, c);
  }
  if (i < num_vectors) {
    Vec16<T>::widen(__ldg(vectors + i), a);
    absorb(st, a, kElems, c);
  }
  const int64_t tail_start = head + num_vectors * kElems;
  if (tail_start + tid < n) {
    const float v = to_float(row[tail_start + tid]);
    absorb(st, &v, 1, c);
  }

  // Warp butterfly, then the warps' results through shared memory, in a fixed order.
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    RowLse other;
    other.max = __shfl_xor_sync(0xffffffffu, st.max, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, st.sum, offset);
    other.nan = __shfl_xor_sync(0xffffffffu, static_cast<int>(st.nan), offset) != 0;
    merge(st, other, c);
  }
  __shared__ RowLse warp_results[kBlock / 32];
  const int warp = tid / 32, lane = tid % 32;
  if (lane == 0) warp_results[warp] = st;
  __syncthreads();
  if (tid == 0) {
    st = warp_results[0];
    for (int w = 1; w < kBlock / 32; ++w) merge(st, warp_results[w], c);
  }
  return st;
}

}  // namespace orsd::cuda
