// Error checking, device scoping and small device helpers shared by the CUDA kernels (internal).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "orsd/common.h"

#define ORSD_CUDA_CHECK(expr) ::orsd::cuda::check((expr), #expr, __FILE__, __LINE__)
#define ORSD_CUDA_CHECK_LAUNCH(name) ::orsd::cuda::check(cudaGetLastError(), name, __FILE__, __LINE__)

namespace orsd::cuda {

inline void check(cudaError_t error, const char* what, const char* file, int line) {
  if (error == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so later calls start clean
  throw std::runtime_error(std::string("orsd CUDA error ") + cudaGetErrorName(error) + " (" +
                           cudaGetErrorString(error) + ") in " + what + " at " + file + ":" +
                           std::to_string(line));
}

inline cudaStream_t as_stream(StreamHandle stream) { return static_cast<cudaStream_t>(stream); }

// Makes `device` current for the scope (the tensors' device, which may differ from the caller's
// current device) and restores the previous one on exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    ORSD_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ == device) {
      previous_ = -1;
    } else {
      ORSD_CUDA_CHECK(cudaSetDevice(device));
    }
  }
  ~DeviceGuard() {
    // A destructor cannot throw; restoring the device of a caller that had one set cannot fail
    // unless the context is already broken, which the next checked call will report.
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items (n >= 1).
inline unsigned int grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned int>(blocks < 65536 ? blocks : 65536);
}

// 2^x with the SFU (ex2.approx, ~2 ulp); 2^-inf = 0, NaN stays NaN.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace orsd::cuda
