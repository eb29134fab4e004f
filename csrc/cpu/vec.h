// The vector types and the exp2 core that row_math.cpp and lm_head_logprobs_rows.cpp share. Both
// are compiled once per instruction set (CMakeLists.txt, -DORSD_ISA=<name> plus that set's flags),
// so this header is too: it opens the same per-set namespace, and its lane count is the native
// width of the flags the including file was compiled with.
#pragma once

#include <cstdint>

#ifndef ORSD_ISA
#error "include vec.h only from a file compiled with -DORSD_ISA=<name>"
#endif

namespace orsd::cpu::ORSD_ISA {
namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX2__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef float fvec __attribute__((vector_size(kLanes * 4)));
typedef int32_t ivec __attribute__((vector_size(kLanes * 4)));
typedef uint32_t uvec __attribute__((vector_size(kLanes * 4)));

inline fvec splat(float v) { return fvec{} + v; }
inline fvec as_float(uvec v) { return __builtin_bit_cast(fvec, v); }

// 2^u for u >= -125 (callers clamp; NaN stays NaN) and u small enough that 2^round(u) is a finite
// float. n = round(u) via the 1.5 * 2^23 trick, whose float bits also give 2^n; 2^f on
// [-1/2, 1/2] is a Lawson minimax fit of degree 6 (relative error 2.6e-9 before f32 rounding,
// ~1.5 ulp after).
inline fvec exp2_from(fvec u) {
  const fvec shifted = u + 0x1.8p23f;
  const fvec f = u - (shifted - 0x1.8p23f);
  fvec p = splat(0x1.41d318p-13f);
  p = p * f + 0x1.5f4568p-10f;
  p = p * f + 0x1.3b2dbcp-7f;
  p = p * f + 0x1.c6aed4p-5f;
  p = p * f + 0x1.ebfbdap-3f;
  p = p * f + 0x1.62e430p-1f;
  p = p * f + 1.0f;
  const uvec scale = (__builtin_bit_cast(uvec, shifted) << 23) + (127u << 23);
  return p * as_float(scale);
}

}  // namespace
}  // namespace orsd::cpu::ORSD_ISA
