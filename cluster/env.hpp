#pragma once
// `troupe env`: what this machine and build offer (versions, devices, c10d
// backends) and smoke tests that exercise them for real.

#include "runtime/error.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::cluster {

struct smoke_result {
  bool ran = false;
  bool ok = false;
  std::string detail;
  double seconds = 0;
};

struct env_report {
  std::string troupe_version;
  std::string libtorch_version;
  std::string caf_version;
  std::string grpc_version;
  std::string protobuf_version;
  std::string yaml_cpp_version;
  bool cuda_compiled = false;
  std::string cuda_runtime;
  bool torch_cuda = false;
  int gpu_count = 0;
  std::string gpu_note;
  bool nccl_available = false;
  std::string nccl_version;
  std::vector<std::string> c10d_backends;
  std::string blas;
  int cpu_threads = 0;
  smoke_result actor_round_trip;
  smoke_result gloo_all_reduce;
};

/// Versions, devices and backends (no smoke tests).
env_report collect_env(const std::string& troupe_version);

/// Spawns `world_size` copies of `executable` as gloo ranks (hidden
/// subcommand `_gloo-smoke`) around a TCPStore on an ephemeral port; each
/// all-reduces a tensor and checks the sum. Output of failed ranks is
/// included in `detail`.
smoke_result run_gloo_smoke(const std::string& executable, int world_size, int64_t timeout_ms);

/// The rank side of run_gloo_smoke. Returns 0 on success, else prints why to
/// stderr and returns non-zero.
int gloo_smoke_rank(int rank, int world_size, uint16_t store_port, int64_t timeout_ms);

/// Human-readable report.
std::string render_text(const env_report& report);
/// JSON rendering through the troupe.v1.EnvReport protobuf message.
std::string render_json(const env_report& report);

} // namespace troupe::cluster
