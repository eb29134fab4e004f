// A small bf16 GEMM with f32 accumulation on AVX512-BF16 (vdpbf16ps), for lm_head_logprobs on CPU
// (internal). Why our own: MKL's cblas_gemm_bf16bf16f32 runs at f32 speed on CPUs it does not
// tune for (measured on the AMD EPYC dev box: 0.09 TF/s per core against 0.21 for oneDNN's bf16
// kernel), and torch's oneDNN path has no f32 output; this kernel reaches oneDNN's speed with an
// f32 output. lm_head_logprobs_bf16.cpp is compiled with -mavx512bf16 when the compiler has it
// (ORSD_HAVE_BF16_GEMM); call only when available() says the CPU runs it.
//
// Operands are bf16 pairs packed in 32-bit words (a dot-product step consumes two k at once):
//   A "strips":  [ceil(m / kStripRows)][k2][kStripRows] words, A(i, kp) for rows of 12;
//   B "panels":  [ceil(n / kPanelCols)][k2][kPanelCols] words, B(kp, j) for columns of 32.
// Padding rows/columns are zero, so the kernel always computes whole strips and panels and only
// the stores are masked.
#pragma once

#include <cstdint>

namespace orsd::cpu::bf16 {

constexpr int64_t kStripRows = 12;
constexpr int64_t kPanelCols = 32;

// Compiled in, and this CPU has AVX512F + AVX512-BF16.
bool available();

// Packs pairs along rows: block b of `Rows` rows of x (row-major, ld elements), words
// (x[r][2kp], x[r][2kp+1]) for kp < k / 2 (k even), into out + b * (k/2) * Rows. Blocks
// [block_begin, block_end); rows >= `rows` are zero.
void pack_row_strips(const uint16_t* x, int64_t rows, int64_t k, int64_t ld, uint32_t* out,
                     int64_t block_begin, int64_t block_end);
void pack_row_panels(const uint16_t* x, int64_t rows, int64_t k, int64_t ld, uint32_t* out,
                     int64_t block_begin, int64_t block_end);

// Packs pairs across rows: words (x[2kp][j], x[2kp+1][j]) for columns j < cols in blocks of
// `Cols` (strips of 12 or panels of 32), pair rows kp in [kp_begin, kp_end) of k2 = ceil(rows / 2)
// in all (row `rows` reads as zero when rows is odd; columns >= cols are zero).
void pack_column_strips(const uint16_t* x, int64_t rows, int64_t cols, int64_t ld, uint32_t* out,
                        int64_t kp_begin, int64_t kp_end);
void pack_column_panels(const uint16_t* x, int64_t rows, int64_t cols, int64_t ld, uint32_t* out,
                        int64_t kp_begin, int64_t kp_end);

// C[m, n] (row-major f32, ldc) = A B (+ C when accumulate), A in strips (strip stride
// a_strip_stride words), B in panels (panel stride b_panel_stride words), k2 pair steps.
// panels_outer: walk panels outside strips (reuse a B panel across all strips; for few rows and
// many columns), else strips outside panels.
void gemm(const uint32_t* a, int64_t a_strip_stride, const uint32_t* b, int64_t b_panel_stride,
          int64_t m, int64_t n, int64_t k2, float* c, int64_t ldc, bool accumulate,
          bool panels_outer);

}  // namespace orsd::cpu::bf16
