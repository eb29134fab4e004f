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
// set in use) run our own kernel (lm_head_logprobs_bf16.h) on operands packed for it; everything
// else, bf16 on an AMX CPU included (lm_head_gemm in orsd/lm_head_logprobs.h), calls the MKL GEMM
// the Python wrapper found in torch (passed by address). That choice, the block sizes, the
// workspace plan, the packing and the logits tile are in lm_head_blocks.{h,cpp}; this file holds
// the two loops.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "lm_head_blocks.h"

namespace orsd {

using namespace cpu::lm_head;  // the blocks these loops are made of (lm_head_blocks.h)

namespace {

namespace bf16 = cpu::bf16;

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
