// Tile kernels of lm_head_logprobs on CPU (internal): what happens to a block of logits between
// the GEMMs. A tile is z^T for one vocabulary block and one token block, row r = vocabulary id
// v0 + r, column c = token t0 + c, so tokens sit in vector lanes and every per-token reduction over
// the vocabulary is a plain vertical vector operation (no horizontal sums in the hot loop).
//
// lm_head_logprobs_rows.cpp is compiled once per instruction set next to row_math.cpp (same
// namespaces, same flags); lm_head_rows() returns the table of the set row_math() currently uses,
// so ORSD_CPU_ISA and set_cpu_isa switch both together.
#pragma once

#include <cstdint>

#include "orsd/common.h"
#include "orsd/lm_head_logprobs.h"

namespace orsd::cpu {

// Column counts passed to the tile kernels are multiples of this (every ISA's vector width
// divides it).
constexpr int64_t kTileColumnMultiple = 16;

// Per-column statistics of y over the tile's rows: max (from -inf), sum = sum e^(y - max),
// weighted = sum e^(y - max) (y - max); nan[c] = 1 when the column holds a NaN or +inf (its sums
// are then meaningless). With max = -inf the sums are meaningless too (the column adds nothing).
struct ColumnStats {
  float* max;
  double* sum;
  double* weighted;
  uint8_t* nan;
};

// Per-column inputs of the backward (arrays of the tile's column count; padding columns carry
// lse = 0, zero gradients and target_row = -1, which makes their dL/dz exactly 0).
struct ColumnGrads {
  const float* lse;
  const float* entropy;
  const float* grad_lp;
  const float* grad_entropy;
  const int32_t* target_row;  // the target's row in this tile, -1 when it lies in another block
};

struct LmHeadRows {
  const char* isa;
  // z -> y in place over rows x cols (row stride ld floats), then each column's statistics.
  void (*forward_tile)(float* tile, int64_t rows, int64_t cols, int64_t ld, LogitMap map,
                       const ColumnStats& out);
  // dL/dz of the tile's z, written to out (row stride ldo elements) as dtype, round to nearest
  // even: dL/dz = [g (1[row == target] - p) - e p (log p + entropy)] * dy/dz, p = e^(y - lse).
  // A NaN lse (a NaN row in the forward) gives NaN.
  void (*backward_tile)(const float* tile, int64_t rows, int64_t cols, int64_t ld, LogitMap map,
                        const ColumnGrads& grads, void* out, int64_t ldo, DType dtype);
  // out[i] = src[i] rounded to dtype (nearest even; NaN stays NaN, overflow gives inf).
  void (*convert)(const float* src, int64_t n, void* out, DType dtype);
};

const LmHeadRows& lm_head_rows();

}  // namespace orsd::cpu
