// GAE / discounted returns: one thread per sequence, backward scan over the
// valid positions (NOTE [masked scans] in kernels/gae.hpp).

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launchers.hpp"
#include "kernels/gae_scan.hpp"

namespace troupe::kernels::cuda {

namespace {

template <class T>
__global__ void gae_kernel(const T* __restrict__ rewards, const T* __restrict__ values,
                           const uint8_t* __restrict__ mask, int64_t batch, int64_t steps, T gamma,
                           T lambda, T* __restrict__ advantages, T* __restrict__ returns) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batch)
    return;
  detail::gae_scan_row(rewards, values, mask, b, steps, gamma, lambda, advantages, returns);
}

template <class T>
std::string launch(const T* rewards, const T* values, const uint8_t* mask, int64_t batch,
                   int64_t steps, T gamma, T lambda, T* advantages, T* returns,
                   cudaStream_t stream) {
  if (batch <= 0 || steps <= 0)
    return {};
  constexpr int threads = 128;
  const auto blocks = static_cast<unsigned>((batch + threads - 1) / threads);
  gae_kernel<T><<<blocks, threads, 0, stream>>>(rewards, values, mask, batch, steps, gamma, lambda,
                                                advantages, returns);
  return TROUPE_CUDA_CHECK(cudaGetLastError(), "launching gae_kernel");
}

} // namespace

std::string launch_gae(const float* rewards, const float* values, const uint8_t* mask,
                       int64_t batch, int64_t steps, float gamma, float lambda, float* advantages,
                       float* returns, cudaStream_t stream) {
  return launch<float>(rewards, values, mask, batch, steps, gamma, lambda, advantages, returns,
                       stream);
}

std::string launch_gae(const double* rewards, const double* values, const uint8_t* mask,
                       int64_t batch, int64_t steps, double gamma, double lambda,
                       double* advantages, double* returns, cudaStream_t stream) {
  return launch<double>(rewards, values, mask, batch, steps, gamma, lambda, advantages, returns,
                        stream);
}

} // namespace troupe::kernels::cuda
