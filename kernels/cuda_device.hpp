#pragma once
// What CUDA this build and this machine offer, asked of the CUDA runtime
// directly (works with a CPU-only LibTorch too).

#include <string>

namespace troupe::kernels {

/// True when troupe's .cu kernels were compiled into this build.
bool cuda_compiled() noexcept;

/// Number of visible CUDA devices; 0 without a driver or device (then `why`,
/// if given, receives the runtime's reason).
int cuda_device_count(std::string* why = nullptr) noexcept;

/// "13.0" style runtime version, or "" when CUDA is not compiled in.
std::string cuda_runtime_version();

} // namespace troupe::kernels
