// Tile kernels of lm_head_logprobs (see lm_head_logprobs_rows.h), written with GCC vector
// extensions at the native width of the instruction set this copy is compiled for (CMakeLists.txt
// compiles it once per set, inside namespace orsd::cpu::<ORSD_ISA>, like row_math.cpp). A tile is
// small enough to stay in L2 between the GEMM that wrote it and these passes, which are
// compute-bound on exp (one per element and pass that needs it).
#include <cmath>
#include <cstring>
#include <limits>

#include "lm_head_logprobs_rows.h"

#ifndef ORSD_ISA
#error "compile lm_head_logprobs_rows.cpp with -DORSD_ISA=<name>"
#endif

#include "vec.h"

namespace orsd::cpu::ORSD_ISA {
namespace {

typedef uint16_t hvec __attribute__((vector_size(kLanes * 2)));

constexpr float kLog2e = 1.4426950408889634f;
// Exponents (natural log) below this are raised to it: e^-86 ~ 4e-38 is nothing next to the max
// term (1), and a finite floor keeps p * log p at 0 instead of 0 * -inf = NaN for -inf logits.
constexpr float kExponentFloor = -86.0f;

inline fvec load(const float* p) {
  fvec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The first `count` < kLanes elements at p, the other lanes `fill`.
inline fvec load_part(const float* p, int64_t count, float fill) {
  float buffer[kLanes];
  for (int k = 0; k < kLanes; ++k) buffer[k] = k < count ? p[k] : fill;
  return load(buffer);
}

// 2^u for u clamped to [-125, 64] (NaN stays NaN).
inline fvec exp2v(fvec u) {
  u = u < splat(-125.f) ? splat(-125.f) : u;
  return exp2_from(u > splat(64.f) ? splat(64.f) : u);
}

inline fvec expv(fvec x) { return exp2v(x * kLog2e); }

// tanh(x) = sign(x) (1 - 2 / (e^(2|x|) + 1)): no overflow (e^(2|x|) is capped at 2^64, where the
// quotient is already below f32 resolution), absolute error ~1e-7 (what the logits need: a
// soft-capped logit is cap * tanh, so its error is cap * 1e-7).
inline fvec tanhv(fvec x) {
  const fvec magnitude = x < splat(0.f) ? -x : x;
  const fvec e = exp2v(magnitude * (2.0f * kLog2e));
  const fvec t = splat(1.f) - splat(2.f) / (e + splat(1.f));
  return x < splat(0.f) ? -t : t;
}

// z -> y of the contract: scale * z, or scale * cap * tanh(z / cap).
template <bool kCapped>
struct Map {
  fvec scale, outer, inverse_cap;
  explicit Map(LogitMap map)
      : scale(splat(map.scale)),
        outer(splat(kCapped ? map.scale * map.softcap : 0.f)),
        inverse_cap(splat(kCapped ? 1.0f / map.softcap : 0.f)) {}
  fvec y(fvec z) const {
    if constexpr (kCapped) return outer * tanhv(z * inverse_cap);
    else return scale * z;
  }
  // y and dy/dz together (the backward needs both; tanh is computed once).
  fvec y(fvec z, fvec& dy_dz) const {
    if constexpr (kCapped) {
      const fvec t = tanhv(z * inverse_cap);
      dy_dz = scale * (splat(1.f) - t * t);
      return outer * t;
    } else {
      dy_dz = scale;
      return scale * z;
    }
  }
};

// ---- f32 -> storage type, round to nearest even ------------------------------------------------

inline hvec to_bf16(fvec x) {
  const uvec u = __builtin_bit_cast(uvec, x);
  const uvec rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uvec quiet_nan = (u >> 16) | 0x40u;
  const ivec is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return __builtin_convertvector(is_nan ? quiet_nan : rounded, hvec);
}

// Integer-only f32 -> f16 (normals, subnormals by an exact float add of 0.5, overflow -> inf,
// NaN -> quiet NaN), so the portable build needs no F16C.
inline hvec to_f16(fvec x) {
  uvec u = __builtin_bit_cast(uvec, x);
  const uvec sign = u & 0x80000000u;
  u ^= sign;
  const uvec odd = (u >> 13) & 1u;
  const uvec normal = (u + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd) >> 13;
  constexpr uint32_t kHalf = 126u << 23;  // 0.5f: aligns the 10 mantissa bits of a subnormal
  const fvec shifted = __builtin_bit_cast(fvec, u) + __builtin_bit_cast(fvec, uvec{} + kHalf);
  const uvec subnormal = __builtin_bit_cast(uvec, shifted) - kHalf;
  uvec out = u < (113u << 23) ? subnormal : normal;
  const uvec special = u > 0x7f800000u ? uvec{} + 0x7e00u : uvec{} + 0x7c00u;  // NaN : inf
  out = u >= (143u << 23) ? special : out;
  return __builtin_convertvector(out | (sign >> 16), hvec);
}

template <DType kType>
inline void store(void* out, int64_t i, fvec v, int64_t count) {
  if constexpr (kType == DType::kFloat32) {
    std::memcpy(static_cast<float*>(out) + i, &v, count * sizeof(float));
  } else {
    const hvec h = kType == DType::kBFloat16 ? to_bf16(v) : to_f16(v);
    std::memcpy(static_cast<uint16_t*>(out) + i, &h, count * sizeof(uint16_t));
  }
}

// ---- forward ----------------------------------------------------------------------------------

// Columns [c, c + 2 kLanes) of the tile (two vectors per step keep two independent dependency
// chains; the rows are walked top to bottom, so the tile streams through L1 in order).
template <bool kCapped>
void forward_columns(float* tile, int64_t rows, int64_t ld, int64_t c, int vectors,
                     const Map<kCapped>& map, const ColumnStats& out) {
  const float inf = std::numeric_limits<float>::infinity();
  // Pass 1: y in place, its max and whether it holds a NaN or +inf.
  fvec max[2] = {splat(-inf), splat(-inf)};
  ivec bad[2] = {ivec{}, ivec{}};
  for (int64_t r = 0; r < rows; ++r) {
    float* row = tile + r * ld + c;
    for (int j = 0; j < vectors; ++j) {
      const fvec y = map.y(load(row + j * kLanes));
      std::memcpy(row + j * kLanes, &y, sizeof y);
      max[j] = y > max[j] ? y : max[j];  // a NaN never wins a comparison; `bad` records it
      bad[j] |= (y != y) | (y == inf);
    }
  }
  // Pass 2: sum e^d and sum e^d d with d = y - max (floored), f32 lanes (rows <= a block).
  const fvec floor = splat(kExponentFloor);
  fvec sum[2] = {}, weighted[2] = {};
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = tile + r * ld + c;
    for (int j = 0; j < vectors; ++j) {
      fvec d = load(row + j * kLanes) - max[j];
      d = d < floor ? floor : d;
      const fvec e = expv(d);
      sum[j] += e;
      weighted[j] += e * d;
    }
  }
  for (int j = 0; j < vectors; ++j)
    for (int k = 0; k < kLanes; ++k) {
      const int64_t column = c + j * kLanes + k;
      out.max[column] = max[j][k];
      out.sum[column] = sum[j][k];
      out.weighted[column] = weighted[j][k];
      out.nan[column] = bad[j][k] != 0;
    }
}

template <bool kCapped>
void forward_impl(float* tile, int64_t rows, int64_t cols, int64_t ld, LogitMap logit_map,
                  const ColumnStats& out) {
  const Map<kCapped> map(logit_map);
  for (int64_t c = 0; c < cols; c += 2 * kLanes)
    forward_columns(tile, rows, ld, c, cols - c >= 2 * kLanes ? 2 : 1, map, out);
}

void forward_tile(float* tile, int64_t rows, int64_t cols, int64_t ld, LogitMap map,
                  const ColumnStats& out) {
  if (map.softcap > 0.f) forward_impl<true>(tile, rows, cols, ld, map, out);
  else forward_impl<false>(tile, rows, cols, ld, map, out);
}

// ---- backward ----------------------------------------------------------------------------------

template <bool kCapped, DType kType>
void backward_impl(const float* tile, int64_t rows, int64_t cols, int64_t ld, LogitMap logit_map,
                   const ColumnGrads& grads, void* out, int64_t ldo) {
  const Map<kCapped> map(logit_map);
  const fvec floor = splat(kExponentFloor), zero = splat(0.f);
  for (int64_t c = 0; c < cols; c += kLanes) {
    const fvec lse = load(grads.lse + c), entropy = load(grads.entropy + c);
    const fvec grad_lp = load(grads.grad_lp + c), grad_entropy = load(grads.grad_entropy + c);
    ivec target;
    std::memcpy(&target, grads.target_row + c, sizeof target);
    for (int64_t r = 0; r < rows; ++r) {
      fvec dy_dz;
      const fvec y = map.y(load(tile + r * ld + c), dy_dz);
      fvec log_p = y - lse;
      const fvec p = expv(log_p);  // NaN lse -> NaN p -> NaN gradient, as torch gives
      log_p = log_p < floor ? floor : log_p;
      // dL/dy = g (1[target] - p) - e p (log p + entropy)
      fvec dy = -(p * (grad_lp + grad_entropy * (log_p + entropy)));
      dy += target == static_cast<int32_t>(r) ? grad_lp : zero;
      store<kType>(out, r * ldo + c, dy * dy_dz, kLanes);
    }
  }
}

template <bool kCapped>
void backward_capped(const float* tile, int64_t rows, int64_t cols, int64_t ld, LogitMap map,
                     const ColumnGrads& grads, void* out, int64_t ldo, DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return backward_impl<kCapped, DType::kBFloat16>(tile, rows, cols, ld, map, grads, out, ldo);
    case DType::kFloat16:
      return backward_impl<kCapped, DType::kFloat16>(tile, rows, cols, ld, map, grads, out, ldo);
    default:
      return backward_impl<kCapped, DType::kFloat32>(tile, rows, cols, ld, map, grads, out, ldo);
  }
}

void backward_tile(const float* tile, int64_t rows, int64_t cols, int64_t ld, LogitMap map,
                   const ColumnGrads& grads, void* out, int64_t ldo, DType dtype) {
  if (map.softcap > 0.f) backward_capped<true>(tile, rows, cols, ld, map, grads, out, ldo, dtype);
  else backward_capped<false>(tile, rows, cols, ld, map, grads, out, ldo, dtype);
}

// ---- conversion --------------------------------------------------------------------------------

template <DType kType>
void convert_impl(const float* src, int64_t n, void* out) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t count = n - i < kLanes ? n - i : kLanes;
    store<kType>(out, i, count == kLanes ? load(src + i) : load_part(src + i, count, 0.f), count);
  }
}

void convert(const float* src, int64_t n, void* out, DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return convert_impl<DType::kBFloat16>(src, n, out);
    case DType::kFloat16: return convert_impl<DType::kFloat16>(src, n, out);
    default: std::memcpy(out, src, n * sizeof(float));
  }
}

#define ORSD_STR2(x) #x
#define ORSD_STR(x) ORSD_STR2(x)

}  // namespace

extern const LmHeadRows kLmHeadRows;
const LmHeadRows kLmHeadRows = {ORSD_STR(ORSD_ISA), forward_tile, backward_tile, convert};

}  // namespace orsd::cpu::ORSD_ISA
