// lm_head_logprobs on CPU: the block loops around the GEMMs (math in orsd/lm_head_logprobs.h).
//
// Layout: the logits of one vocabulary block (rows) x one token block (columns) form a tile z^T,
// so tokens sit in vector lanes for the tile kernels (lm_head_logprobs_rows.h) and the block's
// dL/dz^T, kept for all tokens in gt [block, T], feeds both gradient GEMMs without a transpose.
//
// Forward: vocabulary blocks outermost (each W block is read from memory once and shared by all
// threads through the cache), OpenMP over token blocks inside; each tile is folded into the
// tokens' online state (max, sum, weighted sum, target logit). A token's state sees the blocks in
// vocabulary order whatever thread runs them.
//
// Backward, per vocabulary block:
//   1. OpenMP over token blocks: logits tile -> dL/dz^T into gt[:, tokens] -> the tokens' rows of
//      grad_hidden (f32) += dL/dz @ W_block (the task owns those rows);
//   2. OpenMP over row groups of the block: grad_weight rows = dL/dz^T @ hidden, one GEMM over all
//      T (f32), rounded once into grad_weight.
// Each output element has one writer and one summation order: no atomics, and the bits do not
// depend on the thread count.
//
// GEMMs: bf16 inputs with an even H on a CPU with AVX512-BF16 but no AMX (and the avx512 row-math
// set in use) run our own kernel (lm_head_logprobs_bf16.h) on operands packed here; everything else,
// bf16 on an AMX CPU included (lm_head_gemm in orsd/lm_head_logprobs.h), calls the MKL GEMM the
// Python wrapper found in torch (passed by address).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "lm_head_logprobs_bf16.h"
#include "lm_head_logprobs_rows.h"
#include "orsd/lm_head_logprobs.h"
#include "row_math.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>
#endif

namespace orsd {
namespace cpu {

namespace portable { extern const LmHeadRows kLmHeadRows; }
#ifdef ORSD_HAVE_ISA_AVX2
namespace avx2 { extern const LmHeadRows kLmHeadRows; }
#endif
#ifdef ORSD_HAVE_ISA_AVX512
namespace avx512 { extern const LmHeadRows kLmHeadRows; }
#endif

const LmHeadRows& lm_head_rows() {
  const char* isa = row_math().isa;
#ifdef ORSD_HAVE_ISA_AVX512
  if (std::strcmp(isa, "avx512") == 0) return avx512::kLmHeadRows;
#endif
#ifdef ORSD_HAVE_ISA_AVX2
  if (std::strcmp(isa, "avx2") == 0) return avx2::kLmHeadRows;
#endif
  (void)isa;
  return portable::kLmHeadRows;
}

#ifndef ORSD_HAVE_BF16_GEMM
// Built without the AVX512-BF16 kernel (compiler without -mavx512bf16, or not x86): these are never
// reached because use_bf16_kernel() is false, but the calls below must still link.
namespace bf16 {
bool available() { return false; }
void pack_row_strips(const uint16_t*, int64_t, int64_t, int64_t, uint32_t*, int64_t, int64_t) {}
void pack_row_panels(const uint16_t*, int64_t, int64_t, int64_t, uint32_t*, int64_t, int64_t) {}
void pack_column_strips(const uint16_t*, int64_t, int64_t, int64_t, uint32_t*, int64_t, int64_t) {}
void pack_column_panels(const uint16_t*, int64_t, int64_t, int64_t, uint32_t*, int64_t, int64_t) {}
void gemm(const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t, int64_t, int64_t, float*,
          int64_t, bool, bool) {}
}  // namespace bf16
#endif

}  // namespace cpu

namespace {

namespace bf16 = cpu::bf16;

// Vocabulary rows per block: gt is T x 1024 in the input dtype (0.7% of one T x V f32 tensor at
// V = 151,936) and a tile (1024 x 96 f32 = 384 KiB) stays in L2 between GEMM and tile kernel.
constexpr int64_t kVocabBlock = 1024;
// Tokens per block: a multiple of the bf16 kernel's panel (32) and strip (12) widths and of the
// tile kernels' column multiple (16). Fixed, so results never depend on the thread count.
constexpr int64_t kTokenBlock = 96;
// grad_weight rows per task in backward step 2 (10 bf16 strips).
constexpr int64_t kWeightRowsPerTask = 120;
constexpr std::size_t kAlign = 64;
static_assert(kTokenBlock % bf16::kPanelCols == 0 && kTokenBlock % bf16::kStripRows == 0 &&
              kTokenBlock % cpu::kTileColumnMultiple == 0);
static_assert(kWeightRowsPerTask % bf16::kStripRows == 0);

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
std::size_t element_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

int thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// AMX-BF16 and AMX-TILE in CPUID leaf 7 (EDX bits 22, 24) and the tile state enabled in XCR0
// (bits 17, 18): where MKL's bf16 GEMM runs on tiles. gcc 12's __builtin_cpu_supports("amx-bf16")
// answers false on such a CPU, hence CPUID.
bool cpu_has_amx_bf16() {
#if defined(__GNUC__) && defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 22) & 1u) || !((d >> 24) & 1u)) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1u)) return false;  // OSXSAVE: xgetbv exists
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((lo >> 17) & 3u) == 3u;
#else
  return false;
#endif
}

std::atomic<bool>& prefer_own_gemm() {
  static std::atomic<bool> own{[] {
    const bool can = bf16::available();
    if (const char* forced = std::getenv("ORSD_LM_HEAD_GEMM"); forced != nullptr && *forced != '\0') {
      if (std::strcmp(forced, "mkl") == 0) return false;
      if (std::strcmp(forced, "own") == 0 && can) return true;
      // an unusable request falls back to the automatic choice rather than failing import
    }
    return can && !cpu_has_amx_bf16();
  }()};
  return own;
}

bool use_bf16_kernel(const LmHeadShape& shape) {
  return prefer_own_gemm().load(std::memory_order_acquire) && shape.dtype == DType::kBFloat16 &&
         shape.hidden_size % 2 == 0 && std::strcmp(cpu::row_math().isa, "avx512") == 0;
}

// ---- workspace plan: one function sizes and lays out the scratch for both kernels ---------------

class Arena {
 public:
  explicit Arena(void* base) : base_(static_cast<unsigned char*>(base)) {}
  template <class T>
  T* take(std::size_t count) {
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += (count * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    return p;
  }
  std::size_t used() const { return used_; }

 private:
  unsigned char* base_;
  std::size_t used_ = 0;
};

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

Plan make_plan(const LmHeadShape& shape, int threads, bool backward, void* workspace) {
  const int64_t T = shape.num_tokens, H = shape.hidden_size;
  Plan plan;
  plan.tokens_padded = ceil_div(T, kTokenBlock) * kTokenBlock;
  plan.block_vocab = std::min(kVocabBlock, shape.vocab_size);
  plan.fast = use_bf16_kernel(shape);
  const std::size_t tp = static_cast<std::size_t>(plan.tokens_padded);
  const std::size_t nb = static_cast<std::size_t>(plan.block_vocab);
  const std::size_t h = static_cast<std::size_t>(H);
  const std::size_t nt = static_cast<std::size_t>(threads);
  const std::size_t tb = static_cast<std::size_t>(kTokenBlock);
  const std::size_t h_padded = static_cast<std::size_t>(ceil_div(H, bf16::kPanelCols) * bf16::kPanelCols);
  const std::size_t block_strips_rows =
      static_cast<std::size_t>(ceil_div(plan.block_vocab, bf16::kStripRows) * bf16::kStripRows);
  const std::size_t block_pairs = static_cast<std::size_t>(ceil_div(plan.block_vocab, 2));
  const std::size_t token_pairs = static_cast<std::size_t>(ceil_div(T, 2));

  Arena arena(workspace);
  plan.tile_stride = nb * tb;
  plan.tiles = arena.take<float>(nt * plan.tile_stride);
  if (!backward) {
    plan.state_max = arena.take<float>(tp);
    plan.state_target = arena.take<float>(tp);
    plan.state_sum = arena.take<double>(tp);
    plan.state_weighted = arena.take<double>(tp);
    plan.state_nan = arena.take<uint8_t>(tp);
    plan.column_max = arena.take<float>(nt * tb);
    plan.column_sum = arena.take<double>(nt * tb);
    plan.column_weighted = arena.take<double>(nt * tb);
    plan.column_nan = arena.take<uint8_t>(nt * tb);
  } else {
    plan.column_lse = arena.take<float>(nt * tb);
    plan.column_entropy = arena.take<float>(nt * tb);
    plan.column_grad_lp = arena.take<float>(nt * tb);
    plan.column_grad_entropy = arena.take<float>(nt * tb);
    plan.column_target = arena.take<int32_t>(nt * tb);
    plan.gt = arena.take<unsigned char>(nb * tp * element_size(shape.dtype));
    if (shape.dtype != DType::kFloat32) {
      plan.grad_hidden_f32 = arena.take<float>(static_cast<std::size_t>(T) * h);
      plan.weight_rows = arena.take<float>(nt * kWeightRowsPerTask * h);
    }
  }
  if (plan.fast) {
    if (!backward) {
      plan.hidden_panels = arena.take<uint32_t>(tp * h / 2);
    } else {
      plan.task_panels_stride = tb * h / 2;
      plan.task_panels = arena.take<uint32_t>(nt * plan.task_panels_stride);
    }
    plan.weight_strips[0] = arena.take<uint32_t>(block_strips_rows * h / 2);
    plan.weight_strips[1] = backward ? plan.weight_strips[0] : arena.take<uint32_t>(block_strips_rows * h / 2);
    if (backward) {
      plan.hidden_pairs = arena.take<uint32_t>(h_padded * token_pairs);
      plan.weight_pairs[0] = plan.weight_pairs[1] = arena.take<uint32_t>(h_padded * block_pairs);
      plan.dz_strips_stride = tb * block_pairs;
      plan.dz_strips = arena.take<uint32_t>(nt * plan.dz_strips_stride);
      plan.dz_rows_stride = static_cast<std::size_t>(kWeightRowsPerTask) * token_pairs;
      plan.dz_rows = arena.take<uint32_t>(nt * plan.dz_rows_stride);
    }
  }
  plan.bytes = arena.used();
  return plan;
}

void check_workspace(const Plan& plan, std::size_t workspace_bytes) {
  if (workspace_bytes < plan.bytes)
    throw std::invalid_argument("lm_head_logprobs: workspace of " + std::to_string(workspace_bytes) +
                                " bytes, the kernel needs " + std::to_string(plan.bytes) +
                                " (size it with lm_head_logprobs_workspace_cpu)");
}

// ---- MKL GEMM: C[m, n] (row-major, ldc) = op(A) op(B) + beta C, f32 output ----------------------

enum : int { kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112 };
using Cblas16 = void (*)(int layout, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const void* a, int lda, const void* b, int ldb, float beta, float* c,
                         int ldc);
using FortranSgemm = void (*)(const char* trans_a, const char* trans_b, const int* m, const int* n,
                              const int* k, const float* alpha, const float* a, const int* lda,
                              const float* b, const int* ldb, const float* beta, float* c,
                              const int* ldc);

class MklGemm {
 public:
  MklGemm(const void* function, DType dtype) : function_(function), dtype_(dtype) {}

  // op(A) is [m, k] (A stored [k, m] when trans_a), op(B) is [k, n] (B stored [n, k] when
  // trans_b); every size fits a 32-bit int (the Python wrapper checks T, V and H).
  void operator()(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                  int64_t lda, const void* b, int64_t ldb, float beta, float* c,
                  int64_t ldc) const {
    const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
    const int ilda = static_cast<int>(lda), ildb = static_cast<int>(ldb);
    const int ildc = static_cast<int>(ldc);
    const float alpha = 1.0f;
    if (dtype_ == DType::kFloat32) {
      // Fortran BLAS is column-major: row-major C = op(A) op(B) is column-major
      // C^T = op(B)^T op(A)^T, and a row-major matrix is its own transpose in column-major.
      const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
      reinterpret_cast<FortranSgemm>(function_)(&ta, &tb, &in, &im, &ik, &alpha,
                                                static_cast<const float*>(b), &ildb,
                                                static_cast<const float*>(a), &ilda, &beta, c,
                                                &ildc);
    } else {
      reinterpret_cast<Cblas16>(function_)(kCblasRowMajor, trans_a ? kCblasTrans : kCblasNoTrans,
                                           trans_b ? kCblasTrans : kCblasNoTrans, im, in, ik,
                                           alpha, a, ilda, b, ildb, beta, c, ildc);
    }
  }

 private:
  const void* function_;
  DType dtype_;
};

const unsigned char* bytes_of(const void* p) { return static_cast<const unsigned char*>(p); }
unsigned char* bytes_of(void* p) { return static_cast<unsigned char*>(p); }
const uint16_t* halves_of(const void* p) { return static_cast<const uint16_t*>(p); }

// ---- shared steps --------------------------------------------------------------------------------

struct Inputs {
  const void* hidden;
  const void* weight;
  LmHeadShape shape;
  MklGemm gemm;
  std::size_t es;  // element size
};

// ---- packing for the bf16 kernel, as work items of the loops below ------------------------------

// Pair rows of W packed per item (a pair row is H words; 16 of them amortise the item's overhead).
constexpr int64_t kPairRowsPerItem = 16;

// Items that pack hidden: in the forward panels of 32 tokens for the logits GEMM, in the backward
// pairs of tokens for the grad_weight GEMM. Zero unless the bf16 kernel is in use.
int64_t hidden_pack_items(const Inputs& in, const Plan& plan, bool backward) {
  if (!plan.fast) return 0;
  if (!backward) return plan.tokens_padded / bf16::kPanelCols;
  return ceil_div(ceil_div(in.shape.num_tokens, 2), kPairRowsPerItem);
}

void pack_hidden_item(const Inputs& in, const Plan& plan, int64_t item) {
  const int64_t T = in.shape.num_tokens, H = in.shape.hidden_size;
  const int64_t panels = plan.hidden_panels == nullptr ? 0 : plan.tokens_padded / bf16::kPanelCols;
  if (item < panels) {
    bf16::pack_row_panels(halves_of(in.hidden), T, H, H, plan.hidden_panels, item, item + 1);
    return;
  }
  const int64_t kp0 = (item - panels) * kPairRowsPerItem;
  const int64_t kp1 = std::min(ceil_div(T, 2), kp0 + kPairRowsPerItem);
  bf16::pack_column_panels(halves_of(in.hidden), T, H, H, plan.hidden_pairs, kp0, kp1);
}

// Items that pack vocabulary block `block` (strips of 12 rows; for the backward also pairs of
// rows). Zero past the last block or without the bf16 kernel.
int64_t weight_pack_items(const Inputs& in, const Plan& plan, int64_t block, bool backward) {
  const int64_t v0 = block * plan.block_vocab;
  if (!plan.fast || v0 >= in.shape.vocab_size) return 0;
  const int64_t nv = std::min(plan.block_vocab, in.shape.vocab_size - v0);
  return ceil_div(nv, bf16::kStripRows) + (backward ? ceil_div(ceil_div(nv, 2), kPairRowsPerItem) : 0);
}

void pack_weight_item(const Inputs& in, const Plan& plan, int64_t block, int64_t item) {
  const int64_t H = in.shape.hidden_size, v0 = block * plan.block_vocab;
  const int64_t nv = std::min(plan.block_vocab, in.shape.vocab_size - v0);
  const uint16_t* rows = halves_of(in.weight) + v0 * H;
  const int slot = static_cast<int>(block % 2);
  const int64_t strips = ceil_div(nv, bf16::kStripRows);
  if (item < strips) {
    bf16::pack_row_strips(rows, nv, H, H, plan.weight_strips[slot], item, item + 1);
    return;
  }
  const int64_t kp0 = (item - strips) * kPairRowsPerItem;
  const int64_t kp1 = std::min(ceil_div(nv, 2), kp0 + kPairRowsPerItem);
  bf16::pack_column_panels(rows, nv, H, H, plan.weight_pairs[slot], kp0, kp1);
}

// Packs hidden and vocabulary block 0 (inside a parallel region; ends with a barrier).
void pack_prologue(const Inputs& in, const Plan& plan, bool backward) {
  const int64_t hidden_items = hidden_pack_items(in, plan, backward);
  const int64_t items = hidden_items + weight_pack_items(in, plan, 0, backward);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
  for (int64_t item = 0; item < items; ++item) {
    if (item < hidden_items) pack_hidden_item(in, plan, item);
    else pack_weight_item(in, plan, 0, item - hidden_items);
  }
}

// tile[r][c] = z[t0 + c][v0 + r] for r < nv, c < kTokenBlock (columns past T hold 0).
// task_panels: this thread's panel buffer (used when hidden is not packed for all tokens).
void logits_tile(const Inputs& in, const Plan& plan, int64_t block, int64_t nv, int64_t t0,
                 float* tile, uint32_t* task_panels) {
  const int64_t T = in.shape.num_tokens, H = in.shape.hidden_size, v0 = block * plan.block_vocab;
  const int64_t nt = std::min(kTokenBlock, T - t0);
  if (plan.fast) {
    const int64_t k2 = H / 2;
    const uint32_t* panels = task_panels;
    if (plan.hidden_panels != nullptr)
      panels = plan.hidden_panels + (t0 / bf16::kPanelCols) * k2 * bf16::kPanelCols;
    else
      bf16::pack_row_panels(halves_of(in.hidden) + t0 * H, nt, H, H, task_panels, 0,
                            kTokenBlock / bf16::kPanelCols);
    bf16::gemm(plan.weight_strips[block % 2], k2 * bf16::kStripRows, panels,
               k2 * bf16::kPanelCols, nv, kTokenBlock, k2, tile, kTokenBlock, false, false);
    return;  // the padding tokens were packed as zero rows: their columns are 0
  }
  in.gemm(false, true, nv, nt, H, bytes_of(in.weight) + v0 * H * in.es, H,
          bytes_of(in.hidden) + t0 * H * in.es, H, 0.0f, tile, kTokenBlock);
  if (nt < kTokenBlock)
    for (int64_t r = 0; r < nv; ++r)
      std::memset(tile + r * kTokenBlock + nt, 0, (kTokenBlock - nt) * sizeof(float));
}

// ---- forward state -------------------------------------------------------------------------------

// Folds a tile column (max mb, sum sb, weighted ab) into a token's running state (m, S, A), all
// in y units: e^(y - M) = e^(y - m) e^(m - M) and (y - M) = (y - m) + (m - M), so A picks up
// (m - M) S when the max moves.
void merge(float& max, double& sum, double& weighted, float block_max, double block_sum,
           double block_weighted) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (block_max == neg_inf) return;  // only -inf in this block: adds nothing
  if (max == neg_inf) {
    max = block_max;
    sum = block_sum;
    weighted = block_weighted;
    return;
  }
  const float new_max = std::max(max, block_max);
  const double shift_old = static_cast<double>(max) - new_max;
  const double shift_block = static_cast<double>(block_max) - new_max;
  const double scale_old = std::exp(shift_old), scale_block = std::exp(shift_block);
  weighted = scale_old * (weighted + shift_old * sum) +
             scale_block * (block_weighted + shift_block * block_sum);
  sum = scale_old * sum + scale_block * block_sum;
  max = new_max;
}

}  // namespace

std::string lm_head_gemm() { return prefer_own_gemm().load(std::memory_order_acquire) ? "own" : "mkl"; }

std::vector<std::string> lm_head_gemms_available() {
  if (bf16::available()) return {"own", "mkl"};
  return {"mkl"};
}

void set_lm_head_gemm(const std::string& name) {
  if (name == "mkl" || (name == "own" && bf16::available())) {
    prefer_own_gemm().store(name == "own", std::memory_order_release);
    return;
  }
  std::string names;
  for (const std::string& n : lm_head_gemms_available()) names += (names.empty() ? "" : ", ") + n;
  throw std::invalid_argument("lm_head_gemm: '" + name + "' is not available on this CPU (expected one of: " +
                              names + ")");
}

std::size_t lm_head_logprobs_workspace_cpu(const LmHeadShape& shape, int num_threads,
                                           bool backward) {
  return make_plan(shape, std::max(1, num_threads), backward, nullptr).bytes;
}

void lm_head_logprobs_forward_cpu(const void* hidden, const void* weight, const LmHeadShape& shape,
                                  const int64_t* targets, LogitMap map, float* out_lp,
                                  float* out_lse, float* out_entropy, const void* gemm_function,
                                  void* workspace, std::size_t workspace_bytes, int num_threads) {
  const int64_t T = shape.num_tokens, V = shape.vocab_size;
  if (T == 0) return;
  const int threads = std::max(1, num_threads);
  const Plan plan = make_plan(shape, threads, false, workspace);
  check_workspace(plan, workspace_bytes);
  const Inputs in{hidden, weight, shape, MklGemm(gemm_function, shape.dtype), element_size(shape.dtype)};
  const cpu::LmHeadRows& rows = cpu::lm_head_rows();
  const int64_t token_blocks = plan.tokens_padded / kTokenBlock;
  const float neg_inf = -std::numeric_limits<float>::infinity();

#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
  {
    const int tid = thread_index();
    float* tile = plan.tiles + tid * plan.tile_stride;
    uint32_t* task_panels = plan.task_panels == nullptr ? nullptr : plan.task_panels + tid * plan.task_panels_stride;
    const cpu::ColumnStats stats{plan.column_max + tid * kTokenBlock,
                                 plan.column_sum + tid * kTokenBlock,
                                 plan.column_weighted + tid * kTokenBlock,
                                 plan.column_nan + tid * kTokenBlock};
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t t = 0; t < T; ++t) {
      plan.state_max[t] = neg_inf;
      plan.state_target[t] = 0.0f;
      plan.state_sum[t] = plan.state_weighted[t] = 0.0;
      plan.state_nan[t] = 0;
    }
    pack_prologue(in, plan, false);

    for (int64_t block = 0; block * plan.block_vocab < V; ++block) {
      const int64_t v0 = block * plan.block_vocab, nv = std::min(plan.block_vocab, V - v0);
      // Token tasks of this block first, then (filling idle threads) the packing of the next one.
      const int64_t items = token_blocks + weight_pack_items(in, plan, block + 1, false);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
      for (int64_t item = 0; item < items; ++item) {
        if (item >= token_blocks) {
          pack_weight_item(in, plan, block + 1, item - token_blocks);
          continue;
        }
        const int64_t t0 = item * kTokenBlock, nt = std::min(kTokenBlock, T - t0);
        logits_tile(in, plan, block, nv, t0, tile, task_panels);
        rows.forward_tile(tile, nv, kTokenBlock, kTokenBlock, map, stats);  // tile now holds y
        for (int64_t c = 0; c < nt; ++c) {
          const int64_t t = t0 + c, target = targets[t];
          if (target >= v0 && target < v0 + nv) plan.state_target[t] = tile[(target - v0) * kTokenBlock + c];
          if (stats.nan[c]) plan.state_nan[t] = 1;
          if (plan.state_nan[t]) continue;
          merge(plan.state_max[t], plan.state_sum[t], plan.state_weighted[t], stats.max[c],
                stats.sum[c], stats.weighted[c]);
        }
      }  // implicit barrier: block + 1 is packed, block's slot may be overwritten next
    }

#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t t = 0; t < T; ++t) {
      const float max = plan.state_max[t];
      const double sum = plan.state_sum[t];
      if (plan.state_nan[t] || !std::isfinite(max) || !(sum > 0.0)) {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        out_lp[t] = out_lse[t] = nan;
        if (out_entropy != nullptr) out_entropy[t] = nan;
        continue;
      }
      const double log_sum = std::log(sum);
      out_lp[t] = (plan.state_target[t] - max) - static_cast<float>(log_sum);
      out_lse[t] = max + static_cast<float>(log_sum);
      if (out_entropy != nullptr)
        out_entropy[t] = static_cast<float>(log_sum - plan.state_weighted[t] / sum);
    }
  }
}

void lm_head_logprobs_backward_cpu(const void* hidden, const void* weight,
                                   const LmHeadShape& shape, const int64_t* targets, LogitMap map,
                                   const float* lse, const float* entropy, const float* grad_lp,
                                   const float* grad_entropy, void* grad_hidden, void* grad_weight,
                                   const void* gemm_function, void* workspace,
                                   std::size_t workspace_bytes, int num_threads) {
  const int64_t T = shape.num_tokens, V = shape.vocab_size, H = shape.hidden_size;
  const DType dtype = shape.dtype;
  const std::size_t es = element_size(dtype);
  const bool want_hidden = grad_hidden != nullptr, want_weight = grad_weight != nullptr;
  if (!want_hidden && !want_weight) return;
  if (T == 0) {  // no token contributes: grad_weight is all zeros
    if (want_weight) std::memset(grad_weight, 0, static_cast<std::size_t>(V * H) * es);
    return;
  }
  const int threads = std::max(1, num_threads);
  const Plan plan = make_plan(shape, threads, true, workspace);
  check_workspace(plan, workspace_bytes);
  const Inputs in{hidden, weight, shape, MklGemm(gemm_function, dtype), es};
  const cpu::LmHeadRows& rows = cpu::lm_head_rows();
  const bool f32 = dtype == DType::kFloat32;
  // f32 inputs accumulate grad_hidden in place; 16-bit inputs in f32 scratch, rounded at the end.
  float* grad_hidden_acc = !want_hidden ? nullptr : f32 ? static_cast<float*>(grad_hidden) : plan.grad_hidden_f32;
  const int64_t token_blocks = plan.tokens_padded / kTokenBlock;
  const int64_t ldg = plan.tokens_padded;  // row length of gt
  const int64_t token_pairs = ceil_div(T, 2);

#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
  {
    const int tid = thread_index();
    float* tile = plan.tiles + tid * plan.tile_stride;
    uint32_t* task_panels = plan.task_panels == nullptr ? nullptr : plan.task_panels + tid * plan.task_panels_stride;
    float* column_lse = plan.column_lse + tid * kTokenBlock;
    float* column_entropy = plan.column_entropy + tid * kTokenBlock;
    float* column_grad_lp = plan.column_grad_lp + tid * kTokenBlock;
    float* column_grad_entropy = plan.column_grad_entropy + tid * kTokenBlock;
    int32_t* column_target = plan.column_target + tid * kTokenBlock;
    const cpu::ColumnGrads column_grads{column_lse, column_entropy, column_grad_lp,
                                        column_grad_entropy, column_target};

    if (want_hidden) {
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
      for (int64_t t = 0; t < T; ++t) std::memset(grad_hidden_acc + t * H, 0, H * sizeof(float));
    }
    pack_prologue(in, plan, true);

    for (int64_t block = 0; block * plan.block_vocab < V; ++block) {
      const int64_t v0 = block * plan.block_vocab, nv = std::min(plan.block_vocab, V - v0);
      const int64_t block_pairs = ceil_div(nv, 2);

      // Step 1: dL/dz^T of this block for every token and its share of grad_hidden.
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
      for (int64_t item = 0; item < token_blocks; ++item) {
        const int64_t t0 = item * kTokenBlock, nt = std::min(kTokenBlock, T - t0);
        logits_tile(in, plan, block, nv, t0, tile, task_panels);
        for (int64_t c = 0; c < kTokenBlock; ++c) {
          const int64_t t = t0 + c;
          if (c >= nt) {  // padding column: lse 0, no gradient, no target -> dL/dz = 0
            column_lse[c] = column_entropy[c] = column_grad_lp[c] = column_grad_entropy[c] = 0.0f;
            column_target[c] = -1;
            continue;
          }
          column_lse[c] = lse[t];
          column_entropy[c] = entropy == nullptr ? 0.0f : entropy[t];
          column_grad_lp[c] = grad_lp == nullptr ? 0.0f : grad_lp[t];
          column_grad_entropy[c] = grad_entropy == nullptr ? 0.0f : grad_entropy[t];
          const int64_t target = targets[t];
          column_target[c] = target >= v0 && target < v0 + nv ? static_cast<int32_t>(target - v0) : -1;
        }
        unsigned char* gt_block = plan.gt + t0 * es;
        rows.backward_tile(tile, nv, kTokenBlock, kTokenBlock, map, column_grads, gt_block, ldg, dtype);
        if (!want_hidden) continue;
        if (plan.fast) {
          uint32_t* dz = plan.dz_strips + tid * plan.dz_strips_stride;
          bf16::pack_column_strips(reinterpret_cast<const uint16_t*>(gt_block), nv, kTokenBlock, ldg,
                                   dz, 0, block_pairs);
          bf16::gemm(dz, block_pairs * bf16::kStripRows, plan.weight_pairs[block % 2],
                     block_pairs * bf16::kPanelCols, nt, H, block_pairs,
                     grad_hidden_acc + t0 * H, H, true, true);
        } else {
          in.gemm(true, false, nt, H, nv, gt_block, ldg, bytes_of(weight) + v0 * H * es, H, 1.0f,
                  grad_hidden_acc + t0 * H, H);
        }
      }  // implicit barrier: gt is complete

      // Step 2: grad_weight rows of this block, one GEMM over all tokens per row group; then,
      // filling idle threads, the packing of the next block (step 1 is done with this one).
      const int64_t groups = want_weight ? ceil_div(nv, kWeightRowsPerTask) : 0;
      const int64_t step2_items = groups + weight_pack_items(in, plan, block + 1, true);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
      for (int64_t item = 0; item < step2_items; ++item) {
        if (item >= groups) {
          pack_weight_item(in, plan, block + 1, item - groups);
          continue;
        }
        const int64_t r0 = item * kWeightRowsPerTask, nr = std::min(kWeightRowsPerTask, nv - r0);
        unsigned char* destination = bytes_of(grad_weight) + (v0 + r0) * H * es;
        float* rows_f32 = f32 ? reinterpret_cast<float*>(destination)
                              : plan.weight_rows + tid * kWeightRowsPerTask * H;
        const unsigned char* gt_rows = plan.gt + r0 * ldg * es;
        if (plan.fast) {
          uint32_t* dz = plan.dz_rows + tid * plan.dz_rows_stride;
          bf16::pack_row_strips(reinterpret_cast<const uint16_t*>(gt_rows), nr, 2 * token_pairs,
                                ldg, dz, 0, ceil_div(nr, bf16::kStripRows));
          bf16::gemm(dz, token_pairs * bf16::kStripRows, plan.hidden_pairs,
                     token_pairs * bf16::kPanelCols, nr, H, token_pairs, rows_f32, H, false, true);
        } else {
          in.gemm(false, false, nr, H, T, gt_rows, ldg, hidden, H, 0.0f, rows_f32, H);
        }
        if (!f32) rows.convert(rows_f32, nr * H, destination, dtype);
      }  // implicit barrier: the next block overwrites gt
    }

    if (want_hidden && !f32) {
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
      for (int64_t t = 0; t < T; ++t)
        rows.convert(grad_hidden_acc + t * H, H, bytes_of(grad_hidden) + t * H * es, dtype);
    }
  }
}

}  // namespace orsd
