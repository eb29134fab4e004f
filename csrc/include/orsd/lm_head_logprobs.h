// lm_head_logprobs: log-probs (and entropies) of target tokens straight from the LM head, with a
// backward, never holding a T x V tensor.
//
// For token t with hidden row h_t and vocabulary row w_v (hidden [T, H], weight [V, H], one dtype
// of f32 / f16 / bf16):
//   z[t,v] = h_t . w_v                                    (f32 accumulation of the given values)
//   y[t,v] = scale * (softcap > 0 ? softcap * tanh(z / softcap) : z)
//            with scale = logit_scale / temperature        (HF's final_logit_softcapping, then
//                                                           logit_scale, then the temperature)
//   lse[t] = logsumexp_v y[t,v],  lp[t] = y[t,targets[t]] - lse[t]
//   entropy[t] = -sum_v p log p = log S - A / S  with S = sum e^(y-m), A = sum e^(y-m) (y-m), m the
//                running max: accumulated online in the same pass as lse (no second pass).
// A row whose y has a NaN or a +inf, or only -inf, gives NaN lp, lse and entropy.
//
// Backward, given grad_lp[t] (g) and optionally grad_entropy[t] (e), with p = e^(y - lse):
//   dL/dy[t,v] = g (1[v == target] - p) - e p (log p + entropy)
//   dL/dz[t,v] = dL/dy * scale * (softcap > 0 ? 1 - tanh^2(z / softcap) : 1)
//   grad_hidden = dL/dz @ weight,  grad_weight = dL/dz^T @ hidden
// The logits are recomputed block by block (V blocks outermost, T blocks inside); dL/dz of one V
// block for all tokens is the only large scratch (block x T, in the input dtype, as the GEMMs take
// it: dL/dz is rounded to the input dtype before the two gradient GEMMs, as torch autograd of a
// bf16 model does). Sums are f32 (GEMM accumulators, grad_hidden accumulated across V blocks in
// f32); results are rounded to the input dtype once. Every output element has one owner and one
// summation order: results are bitwise reproducible and independent of the thread count. No float
// atomics.
//
// CPU: bf16 with an even H on a CPU with AVX512-BF16 but no AMX uses our own GEMM kernel
// (csrc/cpu/lm_head_logprobs_bf16.h; MKL ran bf16 at f32 speed on the AMD EPYC it was written
// for); with AMX-BF16 tiles, MKL's bf16 GEMM runs on them and was 4x faster than ours (one
// warm-start head, T=1,024 H=576 V=49,152 fwd+bwd on a 2-core Xeon: 353 vs 1,451 ms), so MKL
// is used there (lm_head_gemm below); otherwise the GEMMs are MKL's, borrowed from the torch
// already loaded in the process (torch's libtorch_cpu exports them; orsd/ops/lm_head_logprobs.py
// finds and self-tests them) and passed in by address, so this module still does not link
// libtorch:
//   bf16: cblas_gemm_bf16bf16f32, f16: cblas_gemm_f16f16f32 (CBLAS, row-major),
//   f32:  sgemm_ (Fortran BLAS, column-major).
// The kernels run OpenMP over token blocks (forward; backward grad_hidden) and over row groups of
// a V block (backward grad_weight); the GEMM runs single-threaded inside each task.
//
// CUDA: the same block loop on the caller's stream with this module's own tiled GEMM kernels
// (WMMA tensor cores for bf16/f16, FFMA for f32; no cuBLAS), scratch from the Python wrapper.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "orsd/common.h"

namespace orsd {

struct LmHeadShape {
  int64_t num_tokens;   // T >= 0
  int64_t vocab_size;   // V >= 1
  int64_t hidden_size;  // H >= 1
  DType dtype;
};

// y = scale * (softcap > 0 ? softcap * tanh(z / softcap) : z)
struct LogitMap {
  float scale;    // logit_scale / temperature, finite and > 0
  float softcap;  // 0: no soft-capping
};

// Which GEMM the CPU kernels use for bf16: "own" (the AVX512-BF16 kernel) or "mkl". The first
// choice is ORSD_LM_HEAD_GEMM when it names an available one, else "mkl" on a CPU whose AMX-BF16
// tiles the OS enabled and "own" elsewhere when the CPU runs it. set_lm_head_gemm switches at run
// time (std::invalid_argument for a name not in lm_head_gemms_available()); results agree to
// rounding (f32 sums in another order), each choice bitwise reproducible on its own.
std::string lm_head_gemm();
std::vector<std::string> lm_head_gemms_available();
void set_lm_head_gemm(const std::string& name);

// Bytes of scratch the CPU kernels need for this shape and thread count (forward or backward).
std::size_t lm_head_logprobs_workspace_cpu(const LmHeadShape& shape, int num_threads,
                                           bool backward);

// out_lp, out_lse: [T] f32; out_entropy: [T] f32 or null (not computed). gemm: address of the
// dtype's MKL GEMM (see above). workspace: lm_head_logprobs_workspace_cpu(shape, num_threads,
// false) bytes, 64-byte aligned (std::invalid_argument when workspace_bytes is smaller).
void lm_head_logprobs_forward_cpu(const void* hidden, const void* weight, const LmHeadShape& shape,
                                  const int64_t* targets, LogitMap map, float* out_lp,
                                  float* out_lse, float* out_entropy, const void* gemm,
                                  void* workspace, std::size_t workspace_bytes, int num_threads);

// lse, entropy: the forward's outputs (entropy may be null when grad_entropy is null).
// grad_lp, grad_entropy: [T] f32 or null (a null gradient counts as zeros). grad_hidden [T, H] and
// grad_weight [V, H] in the input dtype, either may be null (not computed); both are overwritten.
void lm_head_logprobs_backward_cpu(const void* hidden, const void* weight,
                                   const LmHeadShape& shape, const int64_t* targets, LogitMap map,
                                   const float* lse, const float* entropy, const float* grad_lp,
                                   const float* grad_entropy, void* grad_hidden, void* grad_weight,
                                   const void* gemm, void* workspace, std::size_t workspace_bytes,
                                   int num_threads);

// CUDA: the same contract on device pointers, launched on `stream`; the workspace (device memory
// from the caller's allocator) holds lm_head_logprobs_workspace_cuda(shape, backward) bytes.
// gemm_ex (the address of cuBLAS's cublasGemmEx) and blas_handle (a cublasHandle_t bound to
// `stream`) route the GEMMs to cuBLAS; both null: the module's own GEMM kernels.
std::size_t lm_head_logprobs_workspace_cuda(const LmHeadShape& shape, bool backward);

void lm_head_logprobs_forward_cuda(const void* hidden, const void* weight,
                                   const LmHeadShape& shape, const int64_t* targets, LogitMap map,
                                   float* out_lp, float* out_lse, float* out_entropy,
                                   const void* gemm_ex, void* blas_handle, void* workspace,
                                   std::size_t workspace_bytes, int device, StreamHandle stream);

void lm_head_logprobs_backward_cuda(const void* hidden, const void* weight,
                                    const LmHeadShape& shape, const int64_t* targets, LogitMap map,
                                    const float* lse, const float* entropy, const float* grad_lp,
                                    const float* grad_entropy, void* grad_hidden,
                                    void* grad_weight, const void* gemm_ex, void* blas_handle,
                                    void* workspace, std::size_t workspace_bytes, int device,
                                    StreamHandle stream);

}  // namespace orsd
