// Vectorised row reductions shared by the CPU log-prob kernels (internal, not an op contract).
// row_math.cpp is compiled once per instruction set (portable, avx2, avx512); row_math() returns
// the table of the best set the running CPU supports, or the one forced by set_row_math_isa /
// the ORSD_CPU_ISA environment variable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orsd/common.h"

namespace orsd::cpu {

struct RowMath {
  const char* isa;
  // max over n >= 1 elements; NaN if any element is NaN (as torch.max).
  float (*max_f32)(const float* x, int64_t n);
  float (*max_f16)(const uint16_t* x, int64_t n);
  float (*max_bf16)(const uint16_t* x, int64_t n);
  // sum_i exp((x_i - max) * scale) for a finite max >= every x_i: f32 lanes within blocks of
  // kBlock elements, f64 across blocks, so rows far beyond 2^20 elements stay accurate.
  double (*sumexp_f32)(const float* x, int64_t n, float max, float scale);
  double (*sumexp_f16)(const uint16_t* x, int64_t n, float max, float scale);
  double (*sumexp_bf16)(const uint16_t* x, int64_t n, float max, float scale);
};

const RowMath& row_math();
std::string row_math_isa();
// Names of the sets compiled in and supported by this CPU, best last.
std::vector<std::string> row_math_available();
// Throws std::invalid_argument for a name that is not available.
void set_row_math_isa(const std::string& name);

// Typed helpers used by the kernels.
inline float row_max(const RowMath& m, const void* x, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::kFloat16: return m.max_f16(static_cast<const uint16_t*>(x), n);
    case DType::kBFloat16: return m.max_bf16(static_cast<const uint16_t*>(x), n);
    default: return m.max_f32(static_cast<const float*>(x), n);
  }
}
inline double row_sumexp(const RowMath& m, const void* x, DType dtype, int64_t n, float max,
                         float scale) {
  switch (dtype) {
    case DType::kFloat16: return m.sumexp_f16(static_cast<const uint16_t*>(x), n, max, scale);
    case DType::kBFloat16: return m.sumexp_bf16(static_cast<const uint16_t*>(x), n, max, scale);
    default: return m.sumexp_f32(static_cast<const float*>(x), n, max, scale);
  }
}
inline std::size_t dtype_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// Scalar conversions matching the vector ones bit for bit.
float bf16_to_float(uint16_t bits);
float f16_to_float(uint16_t bits);
inline float load_as_float(const void* x, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat16: return f16_to_float(static_cast<const uint16_t*>(x)[i]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(x)[i]);
    default: return static_cast<const float*>(x)[i];
  }
}

}  // namespace orsd::cpu
