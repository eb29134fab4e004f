// Row max and sum-of-exp over f32 / f16 / bf16 rows, written with GCC vector extensions at the
// native width of the instruction set it is compiled for (CMakeLists.txt builds it once per set,
// inside namespace orsd::cpu::<ORSD_ISA>). Element order never matters for a max or a sum, so
// 16-bit inputs are loaded as 32-bit words and split into even and odd halves (2 ops per word).
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "row_math.h"

#ifndef ORSD_ISA
#error "compile row_math.cpp with -DORSD_ISA=<name>"
#endif

#include "vec.h"

namespace orsd::cpu::ORSD_ISA {
namespace {

constexpr int kUnroll = 4;
constexpr int64_t kStep = kUnroll * kLanes;  // f32 elements per main-loop iteration
// Elements per f32 partial sum before it is folded into the f64 row total.
constexpr int64_t kBlock = 4096;

// Exact f16 -> f32 of the 16-bit values held in the low halves of `h` (normals, subnormals,
// inf, NaN) with integer ops only: exponent+mantissa moved into f32 position and rescaled by
// 2^112, then inf/NaN patched.
inline fvec widen_f16(uvec h) {
  const uvec magnitude = (h & 0x7fffu) << 13;
  const uvec scaled = __builtin_bit_cast(uvec, as_float(magnitude) * splat(0x1p112f));
  const uvec special = (uvec)((h & 0x7c00u) == 0x7c00u);  // all ones where the exponent is 31
  const uvec bits = (scaled & ~special) | ((magnitude | 0x7f800000u) & special);
  return as_float(bits | ((h & 0x8000u) << 16));
}

// Loaders return two f32 vectors (2 * kLanes elements, in some order) per call.
struct F32 {
  using Raw = float;
  static void load(const float* p, fvec& a, fvec& b) {
    std::memcpy(&a, p, sizeof a);
    std::memcpy(&b, p + kLanes, sizeof b);
  }
};
struct BF16 {
  using Raw = uint16_t;
  static void load(const uint16_t* p, fvec& a, fvec& b) {
    uvec w;
    std::memcpy(&w, p, sizeof w);
    a = as_float(w << 16);
    b = as_float(w & 0xffff0000u);
  }
};
struct F16 {
  using Raw = uint16_t;
  static void load(const uint16_t* p, fvec& a, fvec& b) {
    uvec w;
    std::memcpy(&w, p, sizeof w);
    a = widen_f16(w & 0xffffu);
    b = widen_f16(w >> 16);
  }
};

// Loads the last n < 2 * kLanes elements, padding with `fill`.
template <class Tag>
inline void load_tail(const typename Tag::Raw* p, int64_t n, float fill, fvec& a, fvec& b) {
  float buf[2 * kLanes];
  for (int i = 0; i < 2 * kLanes; ++i) buf[i] = fill;
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<Tag, F32>) buf[i] = p[i];
    else if constexpr (std::is_same_v<Tag, BF16>) buf[i] = bf16_to_float(p[i]);
    else buf[i] = f16_to_float(p[i]);
  }
  F32::load(buf, a, b);
}

inline fvec vmax(fvec a, fvec b) { return b > a ? b : a; }
inline ivec is_nan(fvec a) { return a != a; }

template <class V>
inline auto hsum_lanes(V v) {
  auto s = v[0];
  for (int i = 1; i < kLanes; ++i) s += v[i];
  return s;
}

// 2^u for u <= 0, u never NaN (callers exclude NaN rows). u is clamped at -125, so exp(-inf) is
// 2^-125 (< 3e-38), negligible next to the max term (1).
inline fvec exp2_nonpositive(fvec u) { return exp2_from(u > splat(-125.f) ? u : splat(-125.f)); }

template <class Tag>
float row_max_impl(const typename Tag::Raw* x, int64_t n) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  fvec m0 = splat(neg_inf), m1 = m0, m2 = m0, m3 = m0;
  ivec nan_seen = ivec{};  // like torch.max, a NaN anywhere makes the max NaN
  fvec a, b, c, d;
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    Tag::load(x + i, a, b);
    Tag::load(x + i + 2 * kLanes, c, d);
    m0 = vmax(m0, a);
    m1 = vmax(m1, b);
    m2 = vmax(m2, c);
    m3 = vmax(m3, d);
    nan_seen |= is_nan(a) | is_nan(b) | is_nan(c) | is_nan(d);
  }
  for (; i < n; i += 2 * kLanes) {
    if (n - i >= 2 * kLanes) Tag::load(x + i, a, b);
    else load_tail<Tag>(x + i, n - i, neg_inf, a, b);
    m0 = vmax(m0, a);
    m1 = vmax(m1, b);
    nan_seen |= is_nan(a) | is_nan(b);
  }
  for (int k = 0; k < kLanes; ++k)
    if (nan_seen[k]) return std::numeric_limits<float>::quiet_NaN();
  const fvec m = vmax(vmax(m0, m1), vmax(m2, m3));
  float result = m[0];
  for (int k = 1; k < kLanes; ++k) result = m[k] > result ? m[k] : result;
  return result;
}

template <class Tag>
double row_sumexp_impl(const typename Tag::Raw* x, int64_t n, float max, float scale) {
  // exp((x - max) * scale) = 2^((x - max) * scale * log2(e)); x - max first keeps the terms
  // near the max exact even at |x| ~ 1e4.
  const fvec vmax_ = splat(max), vc = splat(scale * 1.4426950408889634f);
  double total = 0.0;
  fvec a, b, c, d;
  int64_t i = 0;
  while (i < n) {
    const int64_t end = (n - i > kBlock) ? i + kBlock : n;
    fvec s0 = splat(0.f), s1 = s0, s2 = s0, s3 = s0;
    for (; i + kStep <= end; i += kStep) {
      Tag::load(x + i, a, b);
      Tag::load(x + i + 2 * kLanes, c, d);
      s0 += exp2_nonpositive((a - vmax_) * vc);
      s1 += exp2_nonpositive((b - vmax_) * vc);
      s2 += exp2_nonpositive((c - vmax_) * vc);
      s3 += exp2_nonpositive((d - vmax_) * vc);
    }
    for (; i + 2 * kLanes <= end; i += 2 * kLanes) {
      Tag::load(x + i, a, b);
      s0 += exp2_nonpositive((a - vmax_) * vc);
      s1 += exp2_nonpositive((b - vmax_) * vc);
    }
    if (i < end) {
      const int64_t rest = end - i;
      load_tail<Tag>(x + i, rest, max, a, b);
      fvec ea = exp2_nonpositive((a - vmax_) * vc), eb = exp2_nonpositive((b - vmax_) * vc);
      for (int k = 0; k < kLanes; ++k) {  // the padding lanes must not count
        if (k >= rest) ea[k] = 0.f;
        if (kLanes + k >= rest) eb[k] = 0.f;
      }
      s0 += ea;
      s1 += eb;
      i = end;
    }
    total += static_cast<double>(hsum_lanes((s0 + s1) + (s2 + s3)));
  }
  return total;
}

float max_f32(const float* x, int64_t n) { return row_max_impl<F32>(x, n); }
float max_f16(const uint16_t* x, int64_t n) { return row_max_impl<F16>(x, n); }
float max_bf16(const uint16_t* x, int64_t n) { return row_max_impl<BF16>(x, n); }
double sumexp_f32(const float* x, int64_t n, float m, float s) {
  return row_sumexp_impl<F32>(x, n, m, s);
}
double sumexp_f16(const uint16_t* x, int64_t n, float m, float s) {
  return row_sumexp_impl<F16>(x, n, m, s);
}
double sumexp_bf16(const uint16_t* x, int64_t n, float m, float s) {
  return row_sumexp_impl<BF16>(x, n, m, s);
}

#define ORSD_STR2(x) #x
#define ORSD_STR(x) ORSD_STR2(x)

}  // namespace

extern const RowMath kRowMath;
const RowMath kRowMath = {ORSD_STR(ORSD_ISA), max_f32,    max_f16,   max_bf16,
                          sumexp_f32,         sumexp_f16, sumexp_bf16};

}  // namespace orsd::cpu::ORSD_ISA
