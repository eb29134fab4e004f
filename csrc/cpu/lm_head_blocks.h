// lm_head_logprobs on CPU (internal): the pieces the block loops of lm_head_logprobs.cpp are built
// from, defined in lm_head_blocks.cpp. The block sizes; the plan that sizes and lays out the
// scratch of both kernels; the GEMM choice (our AVX512-BF16 kernel on operands packed here, or the
// MKL GEMM the Python wrapper found in torch); the packing of our kernel's operands as work items
// of the loops' OpenMP for-loops; and one logits tile, the step both kernels start every task with.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lm_head_logprobs_bf16.h"
#include "lm_head_logprobs_rows.h"
#include "orsd/lm_head_logprobs.h"

namespace orsd::cpu::lm_head {

// Vocabulary rows per block: gt is T x 1024 in the input dtype (0.7% of one T x V f32 tensor at
// V = 151,936) and a tile (1024 x 96 f32 = 384 KiB) stays in L2 between GEMM and tile kernel.
constexpr int64_t kVocabBlock = 1024;
// Tokens per block: a multiple of the bf16 kernel's panel (32) and strip (12) widths and of the
// tile kernels' column multiple (16). Fixed, so results never depend on the thread count.
constexpr int64_t kTokenBlock = 96;
// grad_weight rows per task in backward step 2 (10 bf16 strips).
constexpr int64_t kWeightRowsPerTask = 120;
static_assert(kTokenBlock % bf16::kPanelCols == 0 && kTokenBlock % bf16::kStripRows == 0 &&
              kTokenBlock % cpu::kTileColumnMultiple == 0);
static_assert(kWeightRowsPerTask % bf16::kStripRows == 0);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline std::size_t element_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }
inline const unsigned char* bytes_of(const void* p) { return static_cast<const unsigned char*>(p); }
inline unsigned char* bytes_of(void* p) { return static_cast<unsigned char*>(p); }
inline const uint16_t* halves_of(const void* p) { return static_cast<const uint16_t*>(p); }

// omp_get_thread_num(), 0 without OpenMP.
int thread_index();

// Whether the GEMMs of this shape run our bf16 kernel (else MKL's): bf16, an even H, the avx512
// row-math set in use and lm_head_gemm() == "own".
bool use_bf16_kernel(const LmHeadShape& shape);

// ---- workspace plan: one function sizes and lays out the scratch for both kernels ---------------

struct Plan {
  int64_t tokens_padded = 0;  // T rounded up to whole token blocks (gt's row length)
  int64_t block_vocab = 0;    // vocabulary rows per block, min(kVocabBlock, V)
  bool fast = false;          // our bf16 kernel, else MKL
  // per thread (index by thread)
  float* tiles = nullptr;
  std::size_t tile_stride = 0;  // floats
  // forward: token states and per-thread column statistics
  float *state_max = nullptr, *state_target = nullptr;
  double *state_sum = nullptr, *state_weighted = nullptr;
  uint8_t* state_nan = nullptr;
  float* column_max = nullptr;
  double *column_sum = nullptr, *column_weighted = nullptr;
  uint8_t* column_nan = nullptr;
  // backward: per-thread column inputs, dL/dz^T, f32 accumulators
  float *column_lse = nullptr, *column_entropy = nullptr, *column_grad_lp = nullptr,
        *column_grad_entropy = nullptr;
  int32_t* column_target = nullptr;
  unsigned char* gt = nullptr;           // [block_vocab, tokens_padded], input dtype
  float* grad_hidden_f32 = nullptr;      // [T, H] (16-bit inputs)
  float* weight_rows = nullptr;          // per thread [kWeightRowsPerTask, H] (16-bit inputs)
  // bf16 kernel operands
  // hidden as B of the logits GEMM: packed once for all tokens in the forward; in the backward,
  // where memory is tighter, each task packs its own token block (task_panels, per thread: ~5%
  // more time on the backward's logits GEMM, T x H x 2 bytes less).
  uint32_t* hidden_panels = nullptr;
  uint32_t* task_panels = nullptr;
  std::size_t task_panels_stride = 0;  // words
  uint32_t* hidden_pairs = nullptr;      // hidden as B of the grad_weight GEMM (pairs of tokens)
  // The W block as A of the logits GEMM (strips of rows) and as B of the grad_hidden GEMM (pairs
  // of rows). Block b + 1 is packed by a work-sharing loop that runs anyway (no barrier of its
  // own): in the forward the one consuming block b, so the forward double-buffers (block b in
  // slot b % 2); in the backward step 2 of block b, which reads no packed W, so one buffer
  // serves (both slots point to it).
  uint32_t* weight_strips[2] = {nullptr, nullptr};
  uint32_t* weight_pairs[2] = {nullptr, nullptr};
  uint32_t* dz_strips = nullptr;         // per thread: a token block's dL/dz as A (grad_hidden)
  uint32_t* dz_rows = nullptr;           // per thread: a row group's dL/dz^T as A (grad_weight)
  std::size_t dz_strips_stride = 0, dz_rows_stride = 0;  // words
  std::size_t bytes = 0;
};

// The plan for this shape and thread count; with a null workspace it only sizes (plan.bytes).
Plan make_plan(const LmHeadShape& shape, int threads, bool backward, void* workspace);
// std::invalid_argument when workspace_bytes < plan.bytes.
void check_workspace(const Plan& plan, std::size_t workspace_bytes);

// ---- MKL GEMM: C[m, n] (row-major, ldc) = op(A) op(B) + beta C, f32 output ----------------------

class MklGemm {
 public:
  MklGemm(const void* function, DType dtype) : function_(function), dtype_(dtype) {}

  // op(A) is [m, k] (A stored [k, m] when trans_a), op(B) is [k, n] (B stored [n, k] when
  // trans_b); every size fits a 32-bit int (the Python wrapper checks T, V and H).
  void operator()(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                  int64_t lda, const void* b, int64_t ldb, float beta, float* c,
                  int64_t ldc) const;

 private:
  const void* function_;
  DType dtype_;
};

// What every task of both kernels reads.
struct Inputs {
  const void* hidden;
  const void* weight;
  LmHeadShape shape;
  MklGemm gemm;
  std::size_t es;  // element size
};

// ---- packing for the bf16 kernel, as work items of the loops ------------------------------------

// Items that pack vocabulary block `block` (strips of 12 rows; for the backward also pairs of
// rows) into its slot (block % 2). Zero past the last block or without the bf16 kernel.
int64_t weight_pack_items(const Inputs& in, const Plan& plan, int64_t block, bool backward);
void pack_weight_item(const Inputs& in, const Plan& plan, int64_t block, int64_t item);

// Packs hidden and vocabulary block 0 (inside a parallel region; ends with a barrier).
void pack_prologue(const Inputs& in, const Plan& plan, bool backward);

// tile[r][c] = z[t0 + c][v0 + r] for r < nv, c < kTokenBlock (columns past T hold 0).
// task_panels: this thread's panel buffer (used when hidden is not packed for all tokens).
void logits_tile(const Inputs& in, const Plan& plan, int64_t block, int64_t nv, int64_t t0,
                 float* tile, uint32_t* task_panels);

}  // namespace orsd::cpu::lm_head
