#pragma once
// Shared pieces of the GPU kernel tests: device buffers holding copies of CPU
// tensors, a fixture that skips without a device and owns a stream, and the
// launchers' dtype tag. Raw CUDA runtime only, so the tests need no
// CUDA-enabled LibTorch.

#if defined(TROUPE_WITH_CUDA)
#include "kernels/cuda/launchers.hpp"
#include "kernels/cuda_device.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace troupe::kernels::testing {

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// A device copy of a contiguous CPU tensor; freed on destruction.
struct device_buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit device_buffer(size_t n) : bytes(n) {
    if (cudaMalloc(&ptr, bytes == 0 ? 1 : bytes) != cudaSuccess)
      ptr = nullptr;
  }
  explicit device_buffer(const at::Tensor& t) : device_buffer(t.numel() * t.element_size()) {
    auto c = t.contiguous();
    if (ptr)
      cudaMemcpy(ptr, c.data_ptr(), bytes, cudaMemcpyHostToDevice);
  }
  ~device_buffer() { cudaFree(ptr); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  template <class T>
  T* as() {
    return static_cast<T*>(ptr);
  }
  // Copies back into a new CPU tensor of `shape` and `type`.
  at::Tensor to_cpu(at::IntArrayRef shape, at::ScalarType type) const {
    auto out = torch::empty(shape, type);
    cudaMemcpy(out.data_ptr(), ptr, bytes, cudaMemcpyDeviceToHost);
    return out;
  }
};

class gpu_fixture : public ::testing::Test {
protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0)
      GTEST_SKIP() << "no CUDA device: " << why;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_)
      cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

inline cuda::float_type float_type_of(at::ScalarType type) {
  switch (type) {
  case at::kHalf:
    return cuda::float_type::f16;
  case at::kBFloat16:
    return cuda::float_type::bf16;
  default:
    return cuda::float_type::f32;
  }
}

} // namespace troupe::kernels::testing
#endif
