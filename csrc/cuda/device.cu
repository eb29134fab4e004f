// cuda_probe: how many devices this module's (static) CUDA runtime can use, without throwing.
#include "cuda_utils.cuh"
#include "orsd/device.h"

namespace orsd {

CudaProbe cuda_probe() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // cudaErrorInsufficientDriver (no or old driver), cudaErrorNoDevice, ...: no usable device.
    (void)cudaGetLastError();
    return {0, static_cast<int>(error), cudaGetErrorString(error)};
  }
  return {count, 0, ""};
}

}  // namespace orsd
