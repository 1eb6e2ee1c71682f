#include "kernels/cuda_device.hpp"

#if defined(TROUPE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace troupe::kernels {

bool cuda_compiled() noexcept {
#if defined(TROUPE_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

int cuda_device_count(std::string* why) noexcept {
#if defined(TROUPE_WITH_CUDA)
  int n = 0;
  auto rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    if (why != nullptr)
      *why = cudaGetErrorString(rc);
    return 0;
  }
  return n;
#else
  if (why != nullptr)
    *why = "CUDA not compiled in";
  return 0;
#endif
}

std::string cuda_runtime_version() {
#if defined(TROUPE_WITH_CUDA)
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess)
    return "";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
#else
  return "";
#endif
}

} // namespace troupe::kernels
