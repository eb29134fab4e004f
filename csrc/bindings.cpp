// The Python module orsd._C. Tensors cross as integers (data_ptr), sizes, a dtype code and, for
// CUDA, a device index and stream handle; every output and workspace is allocated by the Python
// wrapper (orsd/ops/*.py), which also validates every argument. The GIL is released around
// every kernel call.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "orsd/device.h"
#include "orsd/fused_token_logprobs.h"
#include "orsd/grpo_advantages.h"
#include "orsd/lm_head_logprobs.h"
#include "orsd/microbatch_weights.h"
#include "orsd/shape_advantages.h"
#include "orsd/splice_rubric.h"
#include "orsd/token_logprobs.h"
#include "row_math.h"

namespace py = pybind11;
using Ptr = std::uintptr_t;

namespace {

template <class T>
T* as(Ptr p) {
  return reinterpret_cast<T*>(p);
}

orsd::DType as_dtype(int code) {
  if (code < 0 || code > 2) throw py::value_error("dtype code must be 0 (f32), 1 (f16) or 2 (bf16)");
  return static_cast<orsd::DType>(code);
}

#ifdef ORSD_WITH_CUDA
orsd::StreamHandle as_stream(Ptr p) { return reinterpret_cast<orsd::StreamHandle>(p); }
#endif

orsd::LmHeadShape lm_head_shape(int64_t T, int64_t V, int64_t H, int dtype) {
  return {T, V, H, as_dtype(dtype)};
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "orsd native replay ops (raw-pointer interface; use orsd.ops, not this module)";
  const auto nogil = py::call_guard<py::gil_scoped_release>();

  // ---- build / runtime information --------------------------------------------------------
  m.def("openmp_enabled", [] {
#ifdef _OPENMP
    return true;
#else
    return false;
#endif
  });
  m.def("cpu_isa", &orsd::cpu::row_math_isa, "instruction set the CPU row math runs on");
  m.def("cpu_isas_available", &orsd::cpu::row_math_available);
  m.def("set_cpu_isa", [](const std::string& name) {
    try {
      orsd::cpu::set_row_math_isa(name);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("lm_head_gemm", &orsd::lm_head_gemm, "GEMM the CPU lm_head_logprobs uses for bf16: own or mkl");
  m.def("lm_head_gemms_available", &orsd::lm_head_gemms_available);
  m.def("set_lm_head_gemm", [](const std::string& name) {
    try {
      orsd::set_lm_head_gemm(name);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("cuda_compiled", [] {
#ifdef ORSD_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  m.def("cuda_archs", [] {
#ifdef ORSD_WITH_CUDA
    return std::string(ORSD_CUDA_ARCHS_STRING);
#else
    return std::string();
#endif
  });
  m.def("cuda_probe", [] {
#ifdef ORSD_WITH_CUDA
    const orsd::CudaProbe p = orsd::cuda_probe();
    return py::make_tuple(p.device_count, p.error_code, p.message);
#else
    return py::make_tuple(0, -1, std::string("CUDA kernels were not compiled"));
#endif
  }, "(device_count, cuda_error_code, message); never raises");

  // ---- CPU kernels ------------------------------------------------------------------------
  m.def("token_logprobs_cpu",
        [](Ptr logits, int dtype, int64_t T, int64_t V, Ptr targets, Ptr mask, float temperature,
           Ptr out_lp, Ptr out_lse, int num_threads) {
          orsd::token_logprobs_cpu(as<const void>(logits), as_dtype(dtype), T, V,
                                   as<const int64_t>(targets), as<const uint8_t>(mask),
                                   temperature, as<float>(out_lp), as<float>(out_lse),
                                   num_threads);
        }, nogil);
  m.def("fused_lse_update_cpu",
        [](Ptr chunk, int64_t rows, int64_t cols, int64_t v0, Ptr targets, Ptr mask,
           float temperature, Ptr state_max, Ptr state_sum, Ptr state_target, int num_threads) {
          orsd::fused_lse_update_cpu(as<const float>(chunk), rows, cols, v0,
                                     as<const int64_t>(targets), as<const uint8_t>(mask),
                                     temperature, as<float>(state_max), as<double>(state_sum),
                                     as<float>(state_target), num_threads);
        }, nogil);
  m.def("fused_lse_finalize_cpu",
        [](int64_t T, Ptr mask, float temperature, Ptr state_max, Ptr state_sum, Ptr state_target,
           Ptr out_lp, Ptr out_lse, int num_threads) {
          orsd::fused_lse_finalize_cpu(T, as<const uint8_t>(mask), temperature,
                                       as<const float>(state_max), as<const double>(state_sum),
                                       as<const float>(state_target), as<float>(out_lp),
                                       as<float>(out_lse), num_threads);
        }, nogil);
  m.def("grpo_advantages_cpu",
        [](Ptr rewards, Ptr group_ids, int64_t n, int64_t num_groups, double eps, bool norm_by_std,
           Ptr workspace, Ptr out) {
          orsd::grpo_advantages_cpu(as<const float>(rewards), as<const int64_t>(group_ids), n,
                                    num_groups, eps, norm_by_std, as<double>(workspace),
                                    as<float>(out));
        }, nogil);
  m.def("splice_rubric_cpu",
        [](Ptr ids, int elem_size, Ptr cu_seqlens, int64_t num_seqs, Ptr slots, Ptr rubric_ids,
           Ptr rubric_cu, Ptr rubric_index, Ptr new_cu_seqlens, Ptr new_ids, Ptr pos_map,
           int num_threads) {
          orsd::splice_rubric_cpu(as<const void>(ids), elem_size, as<const int64_t>(cu_seqlens),
                                  num_seqs, as<const int64_t>(slots), as<const void>(rubric_ids),
                                  as<const int64_t>(rubric_cu), as<const int64_t>(rubric_index),
                                  as<const int64_t>(new_cu_seqlens), as<void>(new_ids),
                                  as<int64_t>(pos_map), num_threads);
        }, nogil);
  m.def("shape_advantages_cpu",
        [](Ptr lp_plain, Ptr lp_rubric, Ptr pos_map, Ptr response_mask, Ptr seq_ids, Ptr seq_adv,
           float alpha, Ptr eligible, int64_t length, Ptr adv, Ptr delta, Ptr valid,
           int num_threads) {
          orsd::shape_advantages_cpu(as<const float>(lp_plain), as<const float>(lp_rubric),
                                     as<const int64_t>(pos_map), as<const uint8_t>(response_mask),
                                     as<const int64_t>(seq_ids), as<const float>(seq_adv), alpha,
                                     as<const uint8_t>(eligible), length, as<float>(adv),
                                     as<float>(delta), as<uint8_t>(valid), num_threads);
        }, nogil);
  m.def("lm_head_logprobs_workspace_cpu",
        [](int64_t T, int64_t V, int64_t H, int dtype, int num_threads, bool backward) {
          return orsd::lm_head_logprobs_workspace_cpu(lm_head_shape(T, V, H, dtype), num_threads,
                                                      backward);
        });
  m.def("lm_head_logprobs_forward_cpu",
        [](Ptr hidden, Ptr weight, int64_t T, int64_t V, int64_t H, int dtype, Ptr targets,
           float scale, float softcap, Ptr out_lp, Ptr out_lse, Ptr out_entropy, Ptr gemm,
           Ptr workspace, std::size_t workspace_bytes, int num_threads) {
          orsd::lm_head_logprobs_forward_cpu(
              as<const void>(hidden), as<const void>(weight), lm_head_shape(T, V, H, dtype),
              as<const int64_t>(targets), {scale, softcap}, as<float>(out_lp), as<float>(out_lse),
              as<float>(out_entropy), as<const void>(gemm), as<void>(workspace), workspace_bytes,
              num_threads);
        }, nogil);
  m.def("lm_head_logprobs_backward_cpu",
        [](Ptr hidden, Ptr weight, int64_t T, int64_t V, int64_t H, int dtype, Ptr targets,
           float scale, float softcap, Ptr lse, Ptr entropy, Ptr grad_lp, Ptr grad_entropy,
           Ptr grad_hidden, Ptr grad_weight, Ptr gemm, Ptr workspace, std::size_t workspace_bytes,
           int num_threads) {
          orsd::lm_head_logprobs_backward_cpu(
              as<const void>(hidden), as<const void>(weight), lm_head_shape(T, V, H, dtype),
              as<const int64_t>(targets), {scale, softcap}, as<const float>(lse),
              as<const float>(entropy), as<const float>(grad_lp), as<const float>(grad_entropy),
              as<void>(grad_hidden), as<void>(grad_weight), as<const void>(gemm),
              as<void>(workspace), workspace_bytes, num_threads);
        }, nogil);
  m.def("microbatch_weights_cpu",
        [](Ptr mask, Ptr microbatch_ids, int64_t length, int64_t num_microbatches, Ptr counts,
           Ptr out, int num_threads) {
          orsd::microbatch_weights_cpu(as<const uint8_t>(mask), as<const int64_t>(microbatch_ids),
                                       length, num_microbatches, as<int64_t>(counts),
                                       as<float>(out), num_threads);
        }, nogil);

#ifdef ORSD_WITH_CUDA
  // ---- CUDA kernels (launched on the caller's stream; errors raise RuntimeError) ----------
  m.def("token_logprobs_cuda",
        [](Ptr logits, int dtype, int64_t T, int64_t V, Ptr targets, Ptr mask, float temperature,
           Ptr out_lp, Ptr out_lse, int device, Ptr stream) {
          orsd::token_logprobs_cuda(as<const void>(logits), as_dtype(dtype), T, V,
                                    as<const int64_t>(targets), as<const uint8_t>(mask),
                                    temperature, as<float>(out_lp), as<float>(out_lse), device,
                                    as_stream(stream));
        }, nogil);
  m.def("fused_lse_update_cuda",
        [](Ptr chunk, int64_t rows, int64_t cols, int64_t v0, Ptr targets, Ptr mask,
           float temperature, Ptr state_max, Ptr state_sum, Ptr state_target, int device,
           Ptr stream) {
          orsd::fused_lse_update_cuda(as<const float>(chunk), rows, cols, v0,
                                      as<const int64_t>(targets), as<const uint8_t>(mask),
                                      temperature, as<float>(state_max), as<double>(state_sum),
                                      as<float>(state_target), device, as_stream(stream));
        }, nogil);
  m.def("fused_lse_finalize_cuda",
        [](int64_t T, Ptr mask, float temperature, Ptr state_max, Ptr state_sum, Ptr state_target,
           Ptr out_lp, Ptr out_lse, int device, Ptr stream) {
          orsd::fused_lse_finalize_cuda(T, as<const uint8_t>(mask), temperature,
                                        as<const float>(state_max), as<const double>(state_sum),
                                        as<const float>(state_target), as<float>(out_lp),
                                        as<float>(out_lse), device, as_stream(stream));
        }, nogil);
  m.def("grpo_advantages_cuda",
        [](Ptr rewards, Ptr group_ids, int64_t n, int64_t num_groups, double eps, bool norm_by_std,
           Ptr out, int device, Ptr stream) {
          orsd::grpo_advantages_cuda(as<const float>(rewards), as<const int64_t>(group_ids), n,
                                     num_groups, eps, norm_by_std, as<float>(out), device,
                                     as_stream(stream));
        }, nogil);
  m.def("splice_rubric_cuda",
        [](Ptr ids, int elem_size, Ptr cu_seqlens, int64_t num_seqs, Ptr slots, Ptr rubric_ids,
           Ptr rubric_cu, Ptr rubric_index, Ptr new_cu_seqlens, int64_t new_length, Ptr new_ids,
           Ptr pos_map, int device, Ptr stream) {
          orsd::splice_rubric_cuda(as<const void>(ids), elem_size, as<const int64_t>(cu_seqlens),
                                   num_seqs, as<const int64_t>(slots), as<const void>(rubric_ids),
                                   as<const int64_t>(rubric_cu), as<const int64_t>(rubric_index),
                                   as<const int64_t>(new_cu_seqlens), new_length,
                                   as<void>(new_ids), as<int64_t>(pos_map), device,
                                   as_stream(stream));
        }, nogil);
  m.def("shape_advantages_cuda",
        [](Ptr lp_plain, Ptr lp_rubric, Ptr pos_map, Ptr response_mask, Ptr seq_ids, Ptr seq_adv,
           float alpha, Ptr eligible, int64_t length, Ptr adv, Ptr delta, Ptr valid, int device,
           Ptr stream) {
          orsd::shape_advantages_cuda(as<const float>(lp_plain), as<const float>(lp_rubric),
                                      as<const int64_t>(pos_map), as<const uint8_t>(response_mask),
                                      as<const int64_t>(seq_ids), as<const float>(seq_adv), alpha,
                                      as<const uint8_t>(eligible), length, as<float>(adv),
                                      as<float>(delta), as<uint8_t>(valid), device,
                                      as_stream(stream));
        }, nogil);
  m.def("lm_head_logprobs_workspace_cuda",
        [](int64_t T, int64_t V, int64_t H, int dtype, bool backward) {
          return orsd::lm_head_logprobs_workspace_cuda(lm_head_shape(T, V, H, dtype), backward);
        });
  m.def("lm_head_logprobs_forward_cuda",
        [](Ptr hidden, Ptr weight, int64_t T, int64_t V, int64_t H, int dtype, Ptr targets,
           float scale, float softcap, Ptr out_lp, Ptr out_lse, Ptr out_entropy, Ptr gemm_ex,
           Ptr blas_handle, Ptr workspace, std::size_t workspace_bytes, int device, Ptr stream) {
          orsd::lm_head_logprobs_forward_cuda(
              as<const void>(hidden), as<const void>(weight), lm_head_shape(T, V, H, dtype),
              as<const int64_t>(targets), {scale, softcap}, as<float>(out_lp), as<float>(out_lse),
              as<float>(out_entropy), as<const void>(gemm_ex), as<void>(blas_handle),
              as<void>(workspace), workspace_bytes, device, as_stream(stream));
        }, nogil);
  m.def("lm_head_logprobs_backward_cuda",
        [](Ptr hidden, Ptr weight, int64_t T, int64_t V, int64_t H, int dtype, Ptr targets,
           float scale, float softcap, Ptr lse, Ptr entropy, Ptr grad_lp, Ptr grad_entropy,
           Ptr grad_hidden, Ptr grad_weight, Ptr gemm_ex, Ptr blas_handle, Ptr workspace,
           std::size_t workspace_bytes, int device, Ptr stream) {
          orsd::lm_head_logprobs_backward_cuda(
              as<const void>(hidden), as<const void>(weight), lm_head_shape(T, V, H, dtype),
              as<const int64_t>(targets), {scale, softcap}, as<const float>(lse),
              as<const float>(entropy), as<const float>(grad_lp), as<const float>(grad_entropy),
              as<void>(grad_hidden), as<void>(grad_weight), as<const void>(gemm_ex),
              as<void>(blas_handle), as<void>(workspace), workspace_bytes, device,
              as_stream(stream));
        }, nogil);
  m.def("microbatch_weights_cuda",
        [](Ptr mask, Ptr microbatch_ids, int64_t length, int64_t num_microbatches, Ptr counts,
           Ptr out, int device, Ptr stream) {
          orsd::microbatch_weights_cuda(as<const uint8_t>(mask),
                                        as<const int64_t>(microbatch_ids), length,
                                        num_microbatches, as<unsigned long long>(counts),
                                        as<float>(out), device, as_stream(stream));
        }, nogil);
#endif
}
