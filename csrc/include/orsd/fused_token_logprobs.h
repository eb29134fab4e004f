// fused_token_logprobs: token_logprobs of hidden @ weight.T without a T x V tensor. The caller
// computes one f32 logits chunk at a time (a GEMM) and folds it into a per-token online
// log-sum-exp state; finalize turns the state into log-probs.
//
// State per token t (caller-initialised): state_max[t] = -inf (running max of raw logits),
// state_sum[t] = 0 (f64 running sum of exp((x - state_max) / temperature)),
// state_target[t] = raw logit of targets[t], written when its chunk is seen.
#pragma once

#include "orsd/common.h"

namespace orsd {

// chunk: [rows, cols] f32, row-major, holding logits of `rows` consecutive tokens (the pointers
// targets/mask/state_* are already offset to the first of them) for vocabulary ids [v0, v0+cols).
// Masked rows (mask[r] == 0) are skipped.
void fused_lse_update_cpu(const float* chunk, int64_t rows, int64_t cols, int64_t v0,
                          const int64_t* targets, const uint8_t* mask, float temperature,
                          float* state_max, double* state_sum, float* state_target,
                          int num_threads);

// out_lp[t] = target/temperature - max/temperature - log(sum) on unmasked rows, 0 on masked rows;
// NaN where the max is not finite or the sum is not finite. out_lse (nullable) likewise.
void fused_lse_finalize_cpu(int64_t num_tokens, const uint8_t* mask, float temperature,
                            const float* state_max, const double* state_sum,
                            const float* state_target, float* out_lp, float* out_lse,
                            int num_threads);

void fused_lse_update_cuda(const float* chunk, int64_t rows, int64_t cols, int64_t v0,
                           const int64_t* targets, const uint8_t* mask, float temperature,
                           float* state_max, double* state_sum, float* state_target, int device,
                           StreamHandle stream);

void fused_lse_finalize_cuda(int64_t num_tokens, const uint8_t* mask, float temperature,
                             const float* state_max, const double* state_sum,
                             const float* state_target, float* out_lp, float* out_lse, int device,
                             StreamHandle stream);

}  // namespace orsd
