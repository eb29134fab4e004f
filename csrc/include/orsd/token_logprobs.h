// token_logprobs: out_lp[t] = log_softmax(logits[t] / temperature)[targets[t]] on rows where
// mask[t] (mask may be null: every row), exactly 0 elsewhere. Accumulation is f32 within blocks of
// a row and f64 across blocks (CPU) or f32 per thread and across the block tree (CUDA); the max
// starts at -inf. A row whose max is not finite (a NaN, a +inf, or only -inf) gives NaN.
// out_lse (nullable) receives logsumexp(logits[t] / temperature) on the same rows, 0 elsewhere.
#pragma once

#include "orsd/common.h"

namespace orsd {

void token_logprobs_cpu(const void* logits, DType dtype, int64_t num_tokens, int64_t vocab_size,
                        const int64_t* targets, const uint8_t* mask, float temperature,
                        float* out_lp, float* out_lse, int num_threads);

void token_logprobs_cuda(const void* logits, DType dtype, int64_t num_tokens, int64_t vocab_size,
                         const int64_t* targets, const uint8_t* mask, float temperature,
                         float* out_lp, float* out_lse, int device, StreamHandle stream);

}  // namespace orsd
