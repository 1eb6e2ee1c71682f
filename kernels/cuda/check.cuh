#pragma once
// One check macro for CUDA runtime calls: converts a cudaError_t into a
// troupe-style error string with file, line and what was being done.

#include <cuda_runtime.h>

#include <string>

namespace troupe::kernels::cuda {

/// Returns "" on success, or "<file>:<line>: <what>: <cuda error string>".
inline std::string check(cudaError_t rc, const char* what, const char* file, int line) {
  if (rc == cudaSuccess)
    return {};
  return std::string{file} + ":" + std::to_string(line) + ": " + what + ": " +
         cudaGetErrorString(rc);
}

} // namespace troupe::kernels::cuda

#define TROUPE_CUDA_CHECK(expr, what) \
  ::troupe::kernels::cuda::check((expr), (what), __FILE__, __LINE__)
