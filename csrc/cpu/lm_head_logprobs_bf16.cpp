// bf16 GEMM with f32 accumulation on AVX512-BF16 (see lm_head_logprobs_bf16.h). Compiled with
// -mavx512f -mavx512bf16 (CMakeLists.txt); nothing here runs unless available() said yes.
//
// Micro-kernel: a strip of 12 rows of A times a panel of 32 columns of B, 24 zmm accumulators.
// Each pair step loads two B vectors and broadcasts 12 A words straight from the packed strip
// (one base register, constant offsets), so the loop is 24 vdpbf16ps, 2 loads and 12 embedded
// broadcasts: close to the dot-product throughput (measured ~0.20 TF/s per core, as oneDNN).
// K is walked in blocks of 256 pairs so that a B panel block (32 KiB) stays in L1 while it is
// reused across strips, and an A strip block (12 KiB) while it is reused across panels.
#include "lm_head_logprobs_bf16.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace orsd::cpu::bf16 {
namespace {

constexpr int64_t kPairBlock = 256;

__mmask16 column_mask(int64_t columns) {
  if (columns >= 16) return 0xffff;
  if (columns <= 0) return 0;
  return static_cast<__mmask16>((1u << columns) - 1u);
}

// C[rows < 12, cols < 32] (+)= A strip (a[kp * 12 + i]) x B panel (b[kp * 32 + j]), kp < steps.
void micro(const uint32_t* a, const uint32_t* b, int64_t steps, float* c, int64_t ldc, int64_t rows,
           int64_t cols, bool accumulate) {
  const __mmask16 low = column_mask(cols), high = column_mask(cols - 16);
  __m512 acc[kStripRows][2];
  for (int i = 0; i < kStripRows; ++i) {
    if (accumulate && i < rows) {
      acc[i][0] = _mm512_maskz_loadu_ps(low, c + i * ldc);
      acc[i][1] = _mm512_maskz_loadu_ps(high, c + i * ldc + 16);
    } else {
      acc[i][0] = _mm512_setzero_ps();
      acc[i][1] = _mm512_setzero_ps();
    }
  }
  for (int64_t kp = 0; kp < steps; ++kp) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + kp * kPanelCols);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + kp * kPanelCols + 16);
    const uint32_t* words = a + kp * kStripRows;
#pragma GCC unroll 12
    for (int i = 0; i < kStripRows; ++i) {
      const __m512bh pair = (__m512bh)_mm512_set1_epi32(static_cast<int>(words[i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], pair, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], pair, b1);
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, low, acc[i][0]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, high, acc[i][1]);
  }
}

uint32_t load_word(const uint16_t* p) {
  uint32_t word;
  std::memcpy(&word, p, sizeof word);  // a row may start at any 2-byte boundary
  return word;
}

template <int64_t Rows>
void pack_rows(const uint16_t* x, int64_t rows, int64_t k, int64_t ld, uint32_t* out,
               int64_t block_begin, int64_t block_end) {
  const int64_t k2 = k / 2;
  for (int64_t block = block_begin; block < block_end; ++block) {
    uint32_t* o = out + block * k2 * Rows;
    for (int64_t i = 0; i < Rows; ++i) {
      const int64_t r = block * Rows + i;
      if (r >= rows) {
        for (int64_t kp = 0; kp < k2; ++kp) o[kp * Rows + i] = 0;
        continue;
      }
      const uint16_t* row = x + r * ld;
      for (int64_t kp = 0; kp < k2; ++kp) o[kp * Rows + i] = load_word(row + 2 * kp);
    }
  }
}

template <int64_t Cols>
void pack_columns(const uint16_t* x, int64_t rows, int64_t cols, int64_t ld, uint32_t* out,
                  int64_t kp_begin, int64_t kp_end) {
  const int64_t k2 = (rows + 1) / 2;
  const int64_t blocks = (cols + Cols - 1) / Cols;
  for (int64_t kp = kp_begin; kp < kp_end; ++kp) {
    const uint16_t* low = x + 2 * kp * ld;
    const uint16_t* high = 2 * kp + 1 < rows ? low + ld : nullptr;
    for (int64_t block = 0; block < blocks; ++block) {
      uint32_t* o = out + (block * k2 + kp) * Cols;
      const int64_t c0 = block * Cols, n = std::min(Cols, cols - c0);
      if (high != nullptr && n == Cols) {
        for (int64_t j = 0; j < Cols; ++j)
          o[j] = static_cast<uint32_t>(low[c0 + j]) | (static_cast<uint32_t>(high[c0 + j]) << 16);
        continue;
      }
      for (int64_t j = 0; j < Cols; ++j) {
        uint32_t word = 0;
        if (j < n) {
          word = low[c0 + j];
          if (high != nullptr) word |= static_cast<uint32_t>(high[c0 + j]) << 16;
        }
        o[j] = word;
      }
    }
  }
}

}  // namespace

bool available() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
}

void pack_row_strips(const uint16_t* x, int64_t rows, int64_t k, int64_t ld, uint32_t* out,
                     int64_t block_begin, int64_t block_end) {
  pack_rows<kStripRows>(x, rows, k, ld, out, block_begin, block_end);
}
void pack_row_panels(const uint16_t* x, int64_t rows, int64_t k, int64_t ld, uint32_t* out,
                     int64_t block_begin, int64_t block_end) {
  pack_rows<kPanelCols>(x, rows, k, ld, out, block_begin, block_end);
}
void pack_column_strips(const uint16_t* x, int64_t rows, int64_t cols, int64_t ld, uint32_t* out,
                        int64_t kp_begin, int64_t kp_end) {
  pack_columns<kStripRows>(x, rows, cols, ld, out, kp_begin, kp_end);
}
void pack_column_panels(const uint16_t* x, int64_t rows, int64_t cols, int64_t ld, uint32_t* out,
                        int64_t kp_begin, int64_t kp_end) {
  pack_columns<kPanelCols>(x, rows, cols, ld, out, kp_begin, kp_end);
}

void gemm(const uint32_t* a, int64_t a_strip_stride, const uint32_t* b, int64_t b_panel_stride,
          int64_t m, int64_t n, int64_t k2, float* c, int64_t ldc, bool accumulate,
          bool panels_outer) {
  const int64_t strips = (m + kStripRows - 1) / kStripRows;
  const int64_t panels = (n + kPanelCols - 1) / kPanelCols;
  if (k2 == 0 && !accumulate) {
    for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, n * sizeof(float));
    return;
  }
  for (int64_t k0 = 0; k0 < k2; k0 += kPairBlock) {
    const int64_t steps = std::min(kPairBlock, k2 - k0);
    const bool add = accumulate || k0 > 0;
    auto tile = [&](int64_t s, int64_t p) {
      micro(a + s * a_strip_stride + k0 * kStripRows, b + p * b_panel_stride + k0 * kPanelCols,
            steps, c + s * kStripRows * ldc + p * kPanelCols, ldc,
            std::min(kStripRows, m - s * kStripRows), std::min(kPanelCols, n - p * kPanelCols), add);
    };
    if (panels_outer) {
      for (int64_t p = 0; p < panels; ++p)
        for (int64_t s = 0; s < strips; ++s) tile(s, p);
    } else {
      for (int64_t s = 0; s < strips; ++s)
        for (int64_t p = 0; p < panels; ++p) tile(s, p);
    }
  }
}

}  // namespace orsd::cpu::bf16
