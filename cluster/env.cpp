#include "cluster/env.hpp"

#include "cluster/local_launcher.hpp"
#include "kernels/cuda_device.hpp"
#include "runtime/collectives.hpp"
#include "runtime/file_io.hpp"
#include "runtime/torch_guard.hpp"

#include "troupe/v1/env.pb.h"

#include <caf/config.hpp>
#include <google/protobuf/stubs/common.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <filesystem>
#include <sstream>

#include <dlfcn.h>

namespace troupe::cluster {

namespace {

std::string nccl_version_string() {
  void* lib = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr)
    return "";
  using get_version_fn = int (*)(int*);
  auto fn = reinterpret_cast<get_version_fn>(::dlsym(lib, "ncclGetVersion"));
  std::string out = "unknown";
  int v = 0;
  if (fn != nullptr && fn(&v) == 0)
    out = std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." +
          std::to_string(v % 100);
  ::dlclose(lib);
  return out;
}

// OpenBLAS's pthread build runs its own thread pool beside LibTorch's OpenMP
// pool; with more than one ATen thread they spin against each other.
std::string openblas_name(const char* config) {
  std::string out = std::string{"OpenBLAS "} + config;
  if (out.find("USE_OPENMP") == std::string::npos)
    out += " (pthread build: contends with LibTorch's OpenMP threads; run scripts/setup.sh to "
           "switch to the OpenMP build)";
  return out;
}

std::string blas_name() {
  using config_fn = char* (*)();
  if (auto fn = reinterpret_cast<config_fn>(::dlsym(RTLD_DEFAULT, "openblas_get_config")))
    return openblas_name(fn());
  // LibTorch loads libblas lazily; load the system BLAS to ask it.
  if (void* lib = ::dlopen("libblas.so.3", RTLD_NOW | RTLD_LOCAL)) {
    std::string out = "reference BLAS (slow: run scripts/setup.sh to install OpenBLAS)";
    if (auto fn = reinterpret_cast<config_fn>(::dlsym(lib, "openblas_get_config")))
      out = openblas_name(fn());
    ::dlclose(lib);
    return out;
  }
  return "unknown";
}

std::string caf_version() {
  return std::to_string(CAF_MAJOR_VERSION) + "." + std::to_string(CAF_MINOR_VERSION) + "." +
         std::to_string(CAF_PATCH_VERSION);
}

} // namespace

env_report collect_env(const std::string& troupe_version) {
  env_report r;
  r.troupe_version = troupe_version;
  r.libtorch_version = TORCH_VERSION;
  r.caf_version = caf_version();
  r.grpc_version = grpc::Version();
  r.protobuf_version = google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION);
#ifdef TROUPE_YAML_CPP_VERSION
  r.yaml_cpp_version = TROUPE_YAML_CPP_VERSION;
#endif
  r.cuda_compiled = kernels::cuda_compiled();
  r.cuda_runtime = kernels::cuda_runtime_version();
#if defined(TROUPE_TORCH_CUDA)
  r.torch_cuda = true;
#endif
  r.gpu_count = kernels::cuda_device_count(&r.gpu_note);
  r.nccl_version = nccl_version_string();
  r.nccl_available = !r.nccl_version.empty();
  r.c10d_backends = runtime::available_backends();
  r.blas = blas_name();
  r.cpu_threads = at::get_num_threads();
  return r;
}

int gloo_smoke_rank(int rank, int world_size, uint16_t store_port, int64_t timeout_ms) {
  auto fail = [&](const caf::error& err) {
    std::fprintf(stderr, "gloo smoke rank %d: %s\n", rank, describe(err).c_str());
    return 2;
  };
  runtime::store_options so;
  so.port = store_port;
  so.timeout_ms = timeout_ms;
  auto st = runtime::make_tcp_store(so);
  if (!st)
    return fail(st.error());
  runtime::group_options go;
  go.rank = rank;
  go.world_size = world_size;
  go.name = "env-smoke";
  go.timeout_ms = timeout_ms;
  auto pg = runtime::make_process_group(*st, go);
  if (!pg)
    return fail(pg.error());
  // Rank r contributes [r+1, 2(r+1), ..., 1024(r+1)]; the sum is known.
  auto t = torch::arange(1, 1025, torch::kFloat32) * static_cast<float>(rank + 1);
  if (auto ok = pg->all_reduce_sum(t); !ok)
    return fail(ok.error());
  double ranks_sum = world_size * (world_size + 1) / 2.0;
  auto expect = torch::arange(1, 1025, torch::kFloat32) * static_cast<float>(ranks_sum);
  if (!torch::equal(t, expect)) {
    std::fprintf(stderr, "gloo smoke rank %d: all_reduce gave %s, expected %s at index 0\n", rank,
                 std::to_string(t[0].item<float>()).c_str(),
                 std::to_string(expect[0].item<float>()).c_str());
    return 3;
  }
  if (auto ok = pg->barrier(); !ok)
    return fail(ok.error());
  return 0;
}

smoke_result run_gloo_smoke(const std::string& executable, int world_size, int64_t timeout_ms) {
  smoke_result res;
  res.ran = true;
  auto t0 = std::chrono::steady_clock::now();
  auto finish = [&](bool ok, std::string detail) {
    res.ok = ok;
    res.detail = std::move(detail);
    res.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
  };
  runtime::store_options so;
  so.is_server = true;
  so.timeout_ms = timeout_ms;
  auto st = runtime::make_tcp_store(so);
  if (!st)
    return finish(false, describe(st.error()));
  std::error_code ec;
  auto dir = std::filesystem::temp_directory_path(ec) /
             ("troupe-env-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir, ec);
  std::vector<local_process> procs;
  std::vector<std::string> logs;
  for (int r = 0; r < world_size; ++r) {
    process_spec spec;
    spec.name = "gloo-smoke rank " + std::to_string(r);
    spec.argv = {executable,    "_gloo-smoke", "--rank", std::to_string(r),
                 "--world",     std::to_string(world_size), "--port", std::to_string(st->port()),
                 "--timeout-ms", std::to_string(timeout_ms)};
    spec.output_path = (dir / ("rank" + std::to_string(r) + ".log")).string();
    logs.push_back(spec.output_path);
    auto p = local_process::spawn(spec);
    if (!p) {
      std::filesystem::remove_all(dir, ec);
      return finish(false, describe(p.error()));
    }
    procs.push_back(std::move(*p));
  }
  auto done = wait_all(procs, timeout_ms + 5000);
  std::string detail;
  if (done) {
    detail = std::to_string(world_size) + " processes, all_reduce of 1024 floats over " +
             "TCPStore port " + std::to_string(st->port());
  } else {
    detail = describe(done.error());
    for (const auto& log : logs)
      if (auto text = runtime::read_file(log, 1 << 16); text && !text->empty())
        detail += "\n  " + *text;
  }
  std::filesystem::remove_all(dir, ec);
  return finish(static_cast<bool>(done), detail);
}

std::string render_text(const env_report& r) {
  std::ostringstream os;
  auto yes = [](bool b) { return b ? "yes" : "no"; };
  auto smoke = [&](const char* name, const smoke_result& s) {
    os << "  " << name << ": ";
    if (!s.ran)
      os << "skipped";
    else
      os << (s.ok ? "ok" : "FAILED") << " (" << s.seconds << " s) " << s.detail;
    os << "\n";
  };
  os << "troupe " << r.troupe_version << "\n"
     << "libraries\n"
     << "  LibTorch:  " << r.libtorch_version << "\n"
     << "  CAF:       " << r.caf_version << "\n"
     << "  gRPC:      " << r.grpc_version << "\n"
     << "  protobuf:  " << r.protobuf_version << "\n"
     << "  yaml-cpp:  " << r.yaml_cpp_version << "\n"
     << "  BLAS:      " << r.blas << "\n"
     << "devices\n"
     << "  CPU threads (intra-op): " << r.cpu_threads << "\n"
     << "  CUDA kernels compiled:  " << yes(r.cuda_compiled)
     << (r.cuda_runtime.empty() ? "" : " (runtime " + r.cuda_runtime + ")") << "\n"
     << "  LibTorch with CUDA:     " << yes(r.torch_cuda) << "\n"
     << "  GPUs:                   " << r.gpu_count
     << (r.gpu_count == 0 && !r.gpu_note.empty() ? " (" + r.gpu_note + ")" : "") << "\n"
     << "  NCCL library:           "
     << (r.nccl_available ? "yes (" + r.nccl_version + ")" : std::string{"no"}) << "\n"
     << "  c10d backends:          ";
  for (size_t i = 0; i < r.c10d_backends.size(); ++i)
    os << (i ? ", " : "") << r.c10d_backends[i];
  os << "\nsmoke tests\n";
  smoke("actor round-trip", r.actor_round_trip);
  smoke("gloo all-reduce ", r.gloo_all_reduce);
  return os.str();
}

std::string render_json(const env_report& r) {
  troupe::v1::EnvReport m;
  m.set_troupe_version(r.troupe_version);
  m.set_libtorch_version(r.libtorch_version);
  m.set_caf_version(r.caf_version);
  m.set_grpc_version(r.grpc_version);
  m.set_protobuf_version(r.protobuf_version);
  m.set_yaml_cpp_version(r.yaml_cpp_version);
  m.set_cuda_compiled(r.cuda_compiled);
  m.set_torch_cuda(r.torch_cuda);
  m.set_gpu_count(r.gpu_count);
  m.set_nccl_available(r.nccl_available);
  for (const auto& b : r.c10d_backends)
    m.add_c10d_backends(b);
  m.set_blas(r.blas);
  m.set_cpu_threads(r.cpu_threads);
  auto fill = [](troupe::v1::SmokeTest* out, const smoke_result& s) {
    out->set_ran(s.ran);
    out->set_ok(s.ok);
    out->set_detail(s.detail);
    out->set_seconds(s.seconds);
  };
  fill(m.mutable_actor_round_trip(), r.actor_round_trip);
  fill(m.mutable_gloo_all_reduce(), r.gloo_all_reduce);
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  auto st = google::protobuf::util::MessageToJsonString(m, &out, opts);
  if (!st.ok())
    return "{\"error\": \"cannot render report\"}";
  return out;
}

} // namespace troupe::cluster
