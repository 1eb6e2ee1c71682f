// Weight transports (issue 5), each against the limit of its medium measured
// in the same run, on a 100M-parameter fp32 model (400 MB):
//   shm        publish + receive (copy in with checksum, map, verify)
//              vs memcpy of the same bytes into a warm buffer;
//   disk       publish + receive (safetensors + manifest, fsync, rename, read,
//              verify) vs a plain write + fsync + read of the same bytes;
//   broadcast  publish + receive between two gloo ranks vs the same bytes
//              sent over a raw loopback TCP socket;
//   alias      publish + receive (no copy), for scale.
// Usage: bench_transport [MB=400] [REPS=3] [BUCKET_MB=25]. Medians over REPS; baselines and
// transports alternate within each repetition.
#include "runtime/collectives.hpp"
#include "runtime/weight_transport.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace troupe;
using namespace troupe::runtime;

namespace {

using clock_type = std::chrono::steady_clock;

double seconds(const std::function<void()>& f) {
  auto t0 = clock_type::now();
  f();
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_transport: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T must(expected<T> r, const char* what) {
  if (!r)
    die(std::string{what} + ": " + describe(r.error()));
  return std::move(*r);
}

void must(expected<void> r, const char* what) {
  if (!r)
    die(std::string{what} + ": " + describe(r.error()));
}

// A Llama-like set of tensors adding up to about `bytes`.
tensor_map make_model(uint64_t bytes) {
  tensor_map m;
  const int64_t dim = 1024;
  uint64_t have = 0;
  int layer = 0;
  m["model.embed_tokens.weight"] = torch::randn({8192, dim});
  have += 8192 * dim * 4;
  while (have + uint64_t{7} * dim * dim * 4 <= bytes) {
    auto p = "model.layers." + std::to_string(layer++) + ".";
    for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                          "self_attn.o_proj"})
      m[p + n + ".weight"] = torch::randn({dim, dim});
    m[p + "mlp.gate_proj.weight"] = torch::randn({dim, dim});
    m[p + "mlp.up_proj.weight"] = torch::randn({dim, dim});
    m[p + "mlp.down_proj.weight"] = torch::randn({dim, dim});
    m[p + "input_layernorm.weight"] = torch::ones({dim});
    have += uint64_t{7} * dim * dim * 4 + dim * 4;
  }
  return m;
}

uint64_t total_bytes(const tensor_map& m) {
  uint64_t n = 0;
  for (const auto& [k, t] : m)
    n += static_cast<uint64_t>(t.numel()) * t.element_size();
  return n;
}

// Loopback TCP: one thread sends `n` bytes, this one receives them.
double socket_seconds(const std::vector<char>& src, std::vector<char>& dst) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(lfd, 1) != 0)
    die("socket baseline: bind/listen failed");
  socklen_t len = sizeof addr;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  double t = 0;
  std::thread sender([&] {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      die("socket baseline: connect failed");
    size_t off = 0;
    while (off < src.size()) {
      auto w = ::send(fd, src.data() + off, src.size() - off, 0);
      if (w <= 0)
        die("socket baseline: send failed");
      off += static_cast<size_t>(w);
    }
    ::close(fd);
  });
  int cfd = ::accept(lfd, nullptr, nullptr);
  t = seconds([&] {
    size_t off = 0;
    while (off < dst.size()) {
      auto r = ::recv(cfd, dst.data() + off, dst.size() - off, 0);
      if (r <= 0)
        die("socket baseline: recv failed");
      off += static_cast<size_t>(r);
    }
  });
  sender.join();
  ::close(cfd);
  ::close(lfd);
  return t;
}

// Plain write + fsync + read of `src` through a new file in `dir` (a new
// file, as each published version is: on these virtual disks rewriting
// freshly freed blocks is up to 3x faster than allocating new ones).
double disk_baseline_seconds(const std::string& dir, const std::vector<char>& src,
                             std::vector<char>& dst, int rep) {
  auto path = dir + "/baseline-" + std::to_string(rep) + ".bin";
  std::filesystem::remove(dir + "/baseline-" + std::to_string(rep - 2) + ".bin");
  return seconds([&] {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    size_t off = 0;
    while (off < src.size()) {
      auto w = ::write(fd, src.data() + off, src.size() - off);
      if (w <= 0)
        die("disk baseline: write failed");
      off += static_cast<size_t>(w);
    }
    ::fsync(fd);
    ::close(fd);
    fd = ::open(path.c_str(), O_RDONLY);
    off = 0;
    while (off < dst.size()) {
      auto r = ::read(fd, dst.data() + off, dst.size() - off);
      if (r <= 0)
        die("disk baseline: read failed");
      off += static_cast<size_t>(r);
    }
    ::close(fd);
  });
}

void report(const char* name, double transport_s, double baseline_s, uint64_t bytes,
            const char* baseline_name, const char* floor) {
  auto gbs = [&](double s) { return static_cast<double>(bytes) / s / 1e9; };
  std::printf("%-10s %7.1f ms  %6.2f GB/s   %-26s %7.1f ms  %6.2f GB/s   ratio %.2f%s\n", name,
              transport_s * 1e3, gbs(transport_s), baseline_name, baseline_s * 1e3,
              gbs(baseline_s), baseline_s / transport_s, floor);
}

} // namespace

int main(int argc, char** argv) {
  uint64_t mb = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 400;
  int reps = argc > 2 ? std::atoi(argv[2]) : 3;
  int64_t bucket_mb = argc > 3 ? std::atoll(argv[3]) : 25;
  if (mb < 8 || reps < 1)
    die("usage: bench_transport [MB >= 8] [REPS >= 1]");
  torch::manual_seed(0);
  auto model = make_model(mb << 20);
  auto bytes = total_bytes(model);
  std::printf("machine: %ld cores online; model: %zu tensors, %.1f M parameters, %.0f MB fp32\n",
              sysconf(_SC_NPROCESSORS_ONLN), model.size(), static_cast<double>(bytes) / 4e6,
              static_cast<double>(bytes) / 1e6);
  // The baselines move the model's own bytes (storage may treat zeros or
  // repeated pages specially).
  std::vector<char> src(bytes), dst(bytes);
  {
    size_t off = 0;
    for (const auto& [k, t] : model) {
      auto n = static_cast<size_t>(t.numel()) * t.element_size();
      std::memcpy(src.data() + off, t.data_ptr(), n);
      off += n;
    }
  }
  std::memset(dst.data(), 1, dst.size());

  auto tmp = std::filesystem::temp_directory_path() /
             ("troupe-bench-transport-" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  auto channel = "bench-" + std::to_string(::getpid());

  // ---- alias ----
  {
    transport_options o;
    o.kind = runtime::transport_kind::alias;
    o.channel = channel;
    auto pub = must(make_weight_transport(o), "alias");
    auto sub = must(make_weight_transport(o), "alias");
    std::vector<double> t;
    for (int r = 0; r < reps; ++r)
      t.push_back(seconds([&] {
        must(pub->publish(r + 1, model), "alias publish");
        auto got = must(sub->receive(r + 1), "alias receive");
      }));
    std::printf("alias      %7.3f ms  (no copy; for scale)\n", median(t) * 1e3);
  }

  // ---- shm vs memcpy ----
  {
    transport_options o;
    o.kind = runtime::transport_kind::shm;
    o.channel = channel;
    auto pub = must(make_weight_transport(o), "shm");
    auto sub = must(make_weight_transport(o), "shm");
    std::vector<double> base, pub_t, recv_t, total;
    // Versions 1 and 2 touch both slots first: steady state afterwards.
    for (int r = -2; r < reps; ++r) {
      auto b = seconds([&] { std::memcpy(dst.data(), src.data(), bytes); });
      double p = seconds([&] { must(pub->publish(r + 3, model), "shm publish"); });
      double q = seconds([&] { auto got = must(sub->receive(r + 3), "shm receive"); });
      if (r < 0)
        continue;
      base.push_back(b);
      pub_t.push_back(p);
      recv_t.push_back(q);
      total.push_back(p + q);
    }
    report("shm", median(total), median(base), bytes, "memcpy", "  (floor ≥ 0.50)");
    std::printf("           publish %.1f ms + receive %.1f ms\n", median(pub_t) * 1e3,
                median(recv_t) * 1e3);
  }

  // ---- disk vs write+fsync+read ----
  {
    transport_options o;
    o.kind = runtime::transport_kind::disk;
    o.channel = "bench";
    o.dir = tmp.string();
    auto pub = must(make_weight_transport(o), "disk");
    auto sub = must(make_weight_transport(o), "disk");
    std::vector<double> base, pub_t, recv_t, total;
    for (int r = 0; r < reps; ++r) {
      base.push_back(disk_baseline_seconds(tmp.string(), src, dst, r));
      double p = seconds([&] { must(pub->publish(r + 1, model), "disk publish"); });
      double q = seconds([&] { auto got = must(sub->receive(r + 1), "disk receive"); });
      pub_t.push_back(p);
      recv_t.push_back(q);
      total.push_back(p + q);
    }
    report("disk", median(total), median(base), bytes, "write+fsync+read", "  (floor ≥ 0.50)");
    std::printf("           publish %.1f ms + receive %.1f ms\n", median(pub_t) * 1e3,
                median(recv_t) * 1e3);
  }

  // ---- broadcast vs loopback socket ----
  {
    group_options go;
    go.name = "bench";
    go.timeout_ms = 120000;
    auto ranks = must(make_local_groups(2, go), "gloo group");
    auto& g0 = ranks.groups[0];
    auto& g1 = ranks.groups[1];
    transport_options o;
    o.kind = runtime::transport_kind::broadcast;
    o.channel = "bench";
    o.bucket_bytes = bucket_mb << 20;
    o.group = &g0;
    auto root = must(make_weight_transport(o), "broadcast");
    o.group = &g1;
    auto peer = must(make_weight_transport(o), "broadcast");
    std::vector<double> base, total;
    for (int r = 0; r < reps; ++r) {
      base.push_back(socket_seconds(src, dst));
      total.push_back(seconds([&] {
        auto got = std::async(std::launch::async, [&] { return peer->receive(r + 1); });
        must(root->publish(r + 1, model), "broadcast publish");
        auto w = must(got.get(), "broadcast receive");
      }));
    }
    report("broadcast", median(total), median(base), bytes, "loopback TCP socket", "");
  }
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return 0;
}
