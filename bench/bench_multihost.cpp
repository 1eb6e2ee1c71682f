// Jobs across machines (issue 15), on hosts made of network namespaces
// joined by a bridge (tests/support/netns.hpp; needs root and iproute2):
//   broadcast  the weight transport between two hosts (gloo, bucketed) on a
//              100M-parameter fp32 model (400 MB), against a raw TCP stream
//              of the same bytes between the same two hosts, in one run;
//   start-up   a job's submit → first phase with its workers on 1, 2 and 3
//              nodes (controller on its own host, one agent per node), against
//              the same job with its workers on the controller's host.
// Usage: bench_multihost [MB=400] [REPS=3] [STARTS=3]. Medians. The two ends
// of each transfer are this program again, in its hosts (hidden modes).
#include "runtime/collectives.hpp"
#include "runtime/file_io.hpp"
#include "runtime/weight_transport.hpp"
#include "tests/support/netns.hpp"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

using namespace troupe;
namespace fs = std::filesystem;

namespace {

using clock_type = std::chrono::steady_clock;
constexpr uint16_t store_port = 29500;
constexpr uint16_t tcp_port = 29501;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_multihost: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T must(expected<T> r, const std::string& what) {
  if (!r)
    die(what + ": " + describe(r.error()));
  return std::move(*r);
}

void must(expected<void> r, const std::string& what) {
  if (!r)
    die(what + ": " + describe(r.error()));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// ---- the two ends (hidden modes, run inside a host) ----------------------------

// Receives `bytes` on tcp_port `reps` times; prints each transfer's seconds.
int tcp_receiver(uint64_t bytes, int reps) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(tcp_port);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(lfd, 4) != 0)
    die("tcp receiver: bind/listen failed");
  std::vector<char> buf(size_t{4} << 20);
  for (int r = 0; r < reps; ++r) {
    int fd = ::accept(lfd, nullptr, nullptr);
    uint64_t got = 0;
    // The clock starts with the first byte: connection set-up is not a cost
    // of a transport that keeps its connections.
    auto n = ::recv(fd, buf.data(), buf.size(), 0);
    auto t0 = clock_type::now();
    while (n > 0) {
      got += static_cast<uint64_t>(n);
      if (got >= bytes)
        break;
      n = ::recv(fd, buf.data(), buf.size(), 0);
    }
    auto s = since(t0);
    if (got < bytes)
      die("tcp receiver: short transfer");
    std::printf("%.6f\n", s);
    std::fflush(stdout);
    ::close(fd);
  }
  return 0;
}

int tcp_sender(const std::string& host, uint64_t bytes, int reps) {
  std::vector<char> buf(size_t{4} << 20, 'x');
  for (int r = 0; r < reps; ++r) {
    int fd = -1;
    auto deadline = clock_type::now() + std::chrono::seconds(30);
    for (;;) {
      fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(tcp_port);
      ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0)
        break;
      ::close(fd);
      if (clock_type::now() > deadline)
        die("tcp sender: cannot connect to " + host);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    uint64_t sent = 0;
    while (sent < bytes) {
      auto w = ::send(fd, buf.data(), std::min<uint64_t>(buf.size(), bytes - sent), 0);
      if (w <= 0)
        die("tcp sender: send failed");
      sent += static_cast<uint64_t>(w);
    }
    ::close(fd);
  }
  return 0;
}

// A Llama-like set of tensors adding up to about `bytes`.
runtime::tensor_map make_model(uint64_t bytes) {
  runtime::tensor_map m;
  const int64_t dim = 1024;
  uint64_t have = 0;
  for (int layer = 0; have + uint64_t{4} * dim * dim * 4 <= bytes; ++layer) {
    auto p = "model.layers." + std::to_string(layer) + ".";
    for (const char* n : {"self_attn.q_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      m[p + n + ".weight"] = torch::randn({dim, dim});
    have += uint64_t{4} * dim * dim * 4;
  }
  return m;
}

// One end of the broadcast channel: rank 0 (root, hosts the store) publishes
// `reps` versions, rank 1 receives them; each prints every version's seconds,
// timed after a barrier so both start together.
int broadcast_end(int rank, const std::string& root_host, const std::string& own_host, uint64_t bytes, int reps) {
  runtime::store_options so;
  so.host = root_host;
  so.port = store_port;
  so.is_server = rank == 0;
  so.timeout_ms = 120000;
  auto st = must(runtime::make_tcp_store(so), "store");
  runtime::group_options go;
  go.rank = rank;
  go.world_size = 2;
  go.name = "bench";
  go.interface_host = own_host;
  go.timeout_ms = 120000;
  auto group = must(runtime::make_process_group(st, go), "gloo group");
  runtime::transport_options o;
  o.kind = runtime::transport_kind::broadcast;
  o.channel = "bench";
  o.group = &group;
  auto t = must(runtime::make_weight_transport(o), "broadcast transport");
  auto model = rank == 0 ? make_model(bytes) : runtime::tensor_map{};
  for (int r = 0; r < reps; ++r) {
    must(group.barrier(), "barrier");
    auto t0 = clock_type::now();
    if (rank == 0)
      must(t->publish(r + 1, model), "publish");
    else
      must(t->receive(r + 1), "receive");
    std::printf("%.6f\n", since(t0));
    std::fflush(stdout);
  }
  return 0;
}

// ---- the driver ------------------------------------------------------------------

std::string self_path() {
  return must(cluster::self_executable(), "self");
}

// Runs this program's `args` on host `h` and in parallel `other` on host `o`;
// answers the numbers the first printed.
std::vector<double> pair_run(const test::netns_lab& lab, int h, const std::vector<std::string>& args, int o,
                             const std::vector<std::string>& other, const fs::path& tmp) {
  auto out = (tmp / "out.txt").string();
  cluster::process_spec a, b;
  a.name = "first end", b.name = "second end";
  a.argv = lab.on(h, args), b.argv = lab.on(o, other);
  a.argv.insert(a.argv.begin() + 4, self_path()), b.argv.insert(b.argv.begin() + 4, self_path());
  a.output_path = out, b.output_path = (tmp / "other.txt").string();
  auto pa = must(cluster::local_process::spawn(a), "spawn");
  auto pb = must(cluster::local_process::spawn(b), "spawn");
  auto sa = pa.wait_for(600000), sb = pb.wait_for(600000);
  if (!sa || !sa->ok() || !sb || !sb->ok())
    die("a transfer end failed: " + cluster::tail_of_file(out, 800) + " / " +
        cluster::tail_of_file(b.output_path, 800));
  std::vector<double> v;
  std::ifstream in(out);
  for (double x; in >> x;)
    v.push_back(x);
  return v;
}

void bench_broadcast(const test::netns_lab& lab, uint64_t bytes, int reps, const fs::path& tmp) {
  auto n = std::to_string(bytes);
  // A job syncs every iteration over the same channel: the first version
  // (fresh buffers, first touch of their pages) is a warm-up, not counted.
  auto versions = std::to_string(reps + 1);
  std::vector<double> tcp, bcast;
  // Alternate: each round measures both, so drift hits both alike.
  for (int round = 0; round < 2; ++round) {
    auto t = pair_run(lab, 1, {"--tcp-recv", n, versions}, 0, {"--tcp-send", lab.address(1), n, versions}, tmp);
    auto b = pair_run(lab, 1, {"--bcast", "1", lab.address(0), lab.address(1), n, versions}, 0,
                      {"--bcast", "0", lab.address(0), lab.address(0), n, versions}, tmp);
    tcp.insert(tcp.end(), t.begin() + 1, t.end());
    bcast.insert(bcast.end(), b.begin() + 1, b.end());
  }
  double mb = static_cast<double>(bytes) / 1e6;
  std::printf("broadcast weight sync across hosts (%.0f MB, fp32, 25 MiB buckets; median of %zu versions after "
              "the first, two rounds):\n",
              mb, bcast.size());
  std::printf("  raw TCP stream          %8.1f ms  %7.1f MB/s\n", median(tcp) * 1e3, mb / median(tcp));
  std::printf("  broadcast transport     %8.1f ms  %7.1f MB/s   %.2f× the raw stream's throughput\n",
              median(bcast) * 1e3, mb / median(bcast), median(tcp) / median(bcast));
}

// ---- start-up with 1, 2, 3 nodes --------------------------------------------------

std::string job_spec(int nodes, const std::string& launcher) {
  std::string pools, roles;
  const char* gen_pool = nodes == 1 ? "p0" : "p1";
  for (int p = 0; p < nodes; ++p)
    pools += std::string{p ? ", " : ""} + "{name: p" + std::to_string(p) + ", devices: 1}";
  roles = std::string{"[{role: policy, pool: p0}, {role: critic, pool: p0}, {role: rollout, pool: "} + gen_pool +
          "}, {role: reward, pool: p" + std::to_string(nodes - 1) + "}, {role: reference, pool: p" +
          std::to_string(nodes - 1) + "}]";
  return "run: {name: start, dir: run, seed: 1, threads: 1}\n"
         "stages: [sft, rl]\n"
         "sft: {steps: 1000000, batch_size: 8, eval_every: 0}\n"
         "data: {task: sort, min_digits: 2, max_digits: 3, train_size: 64, eval_size: 8}\n"
         "model: {hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 2, num_kv_heads: 1,\n"
         "        max_position_embeddings: 24}\n"
         "rl: {iterations: 1000000, prompts_per_iteration: 8, minibatches: 2, eval_every: 0,\n"
         "     checkpoint_every: 0, generation: {max_tokens: 5}, rollout: {num_blocks: 64, block_size: 4}}\n"
         "placement: {mode: hybrid, pools: [" +
         pools + "], roles: " + roles + "}\n" + "resources: {nodes: " + std::to_string(nodes) +
         ", launcher: " + launcher + "}\n";
}

struct control_plane {
  const test::netns_lab& lab;
  fs::path tmp;
  std::string state, address, cert;
  std::vector<cluster::local_process> procs;

  std::vector<std::string> troupe(int host, std::vector<std::string> args) const {
    args.insert(args.begin(), TROUPE_BINARY_PATH);
    return lab.on(host, args);
  }

  void start(int agents) {
    state = (tmp / "state").string();
    std::string why;
    if (!test::make_test_certificate(tmp.string(), lab.address(0), why))
      die(why);
    cert = (tmp / "cert.pem").string();
    cluster::process_spec c;
    c.name = "controller";
    c.argv = troupe(0, {"controller", "--listen", lab.address(0) + ":0", "--state-dir", state, "--dashboard", "off",
                        "--tls-cert", cert, "--tls-key", (tmp / "key.pem").string(), "--max-running-jobs", "1"});
    c.output_path = (tmp / "controller.log").string();
    procs.push_back(must(cluster::local_process::spawn(c), "controller"));
    auto info = fs::path{state} / "controller.json";
    for (int i = 0; i < 600 && !fs::exists(info); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto j = nlohmann::json::parse(cluster::tail_of_file(info.string(), 1 << 16), nullptr, false);
    if (!j.is_object() || !j.contains("address"))
      die("the controller did not start: " + cluster::tail_of_file(c.output_path, 800));
    address = j["address"].template get<std::string>();
    for (int a = 1; a <= agents; ++a) {
      cluster::process_spec n;
      n.name = "agent";
      n.argv = troupe(a, {"node", "--controller", address, "--secret", state + "/cluster_secret", "--name",
                          "host-" + std::to_string(a), "--tls-ca", cert, "--cores", "1"});
      n.output_path = (tmp / ("agent-" + std::to_string(a) + ".log")).string();
      procs.push_back(must(cluster::local_process::spawn(n), "agent"));
    }
    for (int i = 0; i < 300; ++i) {
      auto r = cli({"nodes", "--json"});
      auto nodes = nlohmann::json::parse(r, nullptr, false);
      if (nodes.is_array() && static_cast<int>(nodes.size()) == agents)
        return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    die("the agents did not join");
  }

  // `troupe ARGS` on the controller's host; its standard output.
  std::string cli(std::vector<std::string> args) const {
    for (const auto& a : {std::string{"--address"}, address, std::string{"--tls-ca"}, cert, std::string{"--state-dir"},
                          state})
      args.push_back(a);
    auto out = (tmp / "cli.out").string();
    cluster::process_spec s;
    s.name = "cli";
    s.argv = troupe(0, args);
    s.output_path = out;
    auto p = must(cluster::local_process::spawn(s), "cli");
    auto st = p.wait_for(120000);
    if (!st)
      die("the CLI hung");
    return cluster::tail_of_file(out, 1 << 20);
  }

  // Submit → the first phase_started event, seconds; the job is then cancelled.
  double start_up(int nodes, const std::string& launcher) {
    auto spec = (tmp / "job.yaml").string();
    must(runtime::write_file_atomic(spec, job_spec(nodes, launcher)), "spec");
    auto id = cli({"submit", spec});
    id = id.substr(0, id.find('\n'));
    auto events = fs::path{state} / "jobs" / id / "run" / "events.jsonl";
    int64_t first_phase = 0;
    for (int i = 0; i < 6000 && first_phase == 0; ++i) {
      std::ifstream in(events);
      for (std::string line; std::getline(in, line);)
        if (line.find("\"kind\":\"phase_started\"") != std::string::npos) {
          first_phase = nlohmann::json::parse(line)["time_us"].get<int64_t>();
          break;
        }
      if (first_phase == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    auto status = nlohmann::json::parse(cli({"status", id, "--json"}), nullptr, false);
    if (first_phase == 0 || !status.is_object())
      die("job " + id + " did not reach its first phase: " + status.dump());
    auto submitted = status["submit_time_us"].get<int64_t>();
    cli({"cancel", id, "--now"});
    for (int i = 0; i < 600; ++i) {
      auto s = nlohmann::json::parse(cli({"status", id, "--json"}), nullptr, false);
      auto state = s.is_object() ? s.value("state", "") : "";
      if (state == "cancelled" || state == "failed" || state == "succeeded")
        return static_cast<double>(first_phase - submitted) / 1e6;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    die("job " + id + " did not end after cancel --now");
  }

  ~control_plane() {
    for (auto it = procs.rbegin(); it != procs.rend(); ++it) {
      it->kill(SIGTERM);
      if (!it->wait_for(30000))
        it->kill(SIGKILL);
    }
  }
};

void bench_start_up(const test::netns_lab& lab, int starts, const fs::path& tmp) {
  control_plane cp{lab, tmp, {}, {}, {}, {}};
  cp.start(3);
  std::printf("job start-up, submit → first phase (median of %d; workers: one per node):\n", starts);
  for (int nodes = 1; nodes <= 3; ++nodes) {
    std::vector<double> remote, local;
    for (int r = 0; r < starts; ++r) {
      local.push_back(cp.start_up(nodes, "local"));
      remote.push_back(cp.start_up(nodes, "nodes"));
    }
    std::printf("  %d node%s  on nodes %6.2f s   on the controller's host %6.2f s   ratio %.2f×\n", nodes,
                nodes == 1 ? " " : "s", median(remote), median(local), median(remote) / median(local));
  }
}

} // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  if (!a.empty() && a[0] == "--tcp-recv" && a.size() == 3)
    return tcp_receiver(std::stoull(a[1]), std::stoi(a[2]));
  if (!a.empty() && a[0] == "--tcp-send" && a.size() == 4)
    return tcp_sender(a[1], std::stoull(a[2]), std::stoi(a[3]));
  if (!a.empty() && a[0] == "--bcast" && a.size() == 6)
    return broadcast_end(std::stoi(a[1]), a[2], a[3], std::stoull(a[4]), std::stoi(a[5]));
  uint64_t mb = a.size() > 0 ? std::stoull(a[0]) : 400;
  int reps = a.size() > 1 ? std::stoi(a[1]) : 3;
  int starts = a.size() > 2 ? std::stoi(a[2]) : 3;
  std::string why;
  auto lab = test::netns_lab::create(4, why);
  if (!lab)
    die("cannot make hosts: " + why);
  utsname u{};
  ::uname(&u);
  std::printf("bench_multihost: %s %s, %u cores; hosts are network namespaces on one bridge (veth)\n", u.sysname,
              u.release, std::thread::hardware_concurrency());
  auto tmp = fs::temp_directory_path() / ("bench-multihost-" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  bench_broadcast(*lab, mb * 1000 * 1000, reps, tmp);
  bench_start_up(*lab, starts, tmp);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  return 0;
}
