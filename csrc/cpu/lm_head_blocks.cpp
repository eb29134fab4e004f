// lm_head_logprobs on CPU (internal): block sizes, workspace plan, GEMM choice, packing and logits
// tiles for the loops of lm_head_logprobs.cpp (contracts in lm_head_blocks.h), and the public
// functions that choose the bf16 GEMM and size the workspace (orsd/lm_head_logprobs.h).
#include "lm_head_blocks.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

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

namespace cpu::lm_head {

namespace {

constexpr std::size_t kAlign = 64;

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

enum : int { kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112 };
using Cblas16 = void (*)(int layout, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const void* a, int lda, const void* b, int ldb, float beta, float* c,
                         int ldc);
using FortranSgemm = void (*)(const char* trans_a, const char* trans_b, const int* m, const int* n,
                              const int* k, const float* alpha, const float* a, const int* lda,
                              const float* b, const int* ldb, const float* beta, float* c,
                              const int* ldc);

}  // namespace

int thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

bool use_bf16_kernel(const LmHeadShape& shape) {
  return prefer_own_gemm().load(std::memory_order_acquire) && shape.dtype == DType::kBFloat16 &&
         shape.hidden_size % 2 == 0 && std::strcmp(cpu::row_math().isa, "avx512") == 0;
}

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

void MklGemm::operator()(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                         const void* a, int64_t lda, const void* b, int64_t ldb, float beta,
                         float* c, int64_t ldc) const {
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

namespace {

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

}  // namespace

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

}  // namespace cpu::lm_head

using cpu::lm_head::make_plan;
using cpu::lm_head::prefer_own_gemm;

std::string lm_head_gemm() { return prefer_own_gemm().load(std::memory_order_acquire) ? "own" : "mkl"; }

std::vector<std::string> lm_head_gemms_available() {
  if (cpu::bf16::available()) return {"own", "mkl"};
  return {"mkl"};
}

void set_lm_head_gemm(const std::string& name) {
  if (name == "mkl" || (name == "own" && cpu::bf16::available())) {
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

}  // namespace orsd
