// Types shared by every op's contract. The headers never include CUDA headers: a stream crosses
// them as an opaque handle, so the CPU-only build and bindings.cpp compile with a plain C++ compiler.
#pragma once

#include <cstdint>

namespace orsd {

// Element type of a floating-point input tensor; the codes are the ones orsd/ops/_backend.py sends.
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// A cudaStream_t (e.g. torch.cuda.current_stream().cuda_stream) passed through as a pointer.
using StreamHandle = void*;

}  // namespace orsd
