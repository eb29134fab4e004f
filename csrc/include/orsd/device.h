// CUDA availability as seen by the kernels in this module (defined only in CUDA builds).
#pragma once

#include <string>

namespace orsd {

struct CudaProbe {
  int device_count;     // 0 when there is no usable device or driver
  int error_code;       // the cudaError_t of cudaGetDeviceCount (0 = success)
  std::string message;  // cudaGetErrorString of it, "" on success
};

// Never throws: "no driver" (cudaErrorInsufficientDriver) and "no device" (cudaErrorNoDevice),
// like every other failure of cudaGetDeviceCount, report 0 devices and the error.
CudaProbe cuda_probe();

}  // namespace orsd
