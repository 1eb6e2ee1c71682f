// `troupe slurm run`: a job inside a Slurm allocation (docs/cluster.md).
//
// NOTE [slurm run]: the batch script's process (on the allocation's first
// node) starts a controller with its state dir on the shared filesystem,
// then one `srun` step with a task per node running `troupe node` (each
// agent offers what Slurm gave its node: SLURM_CPUS_ON_NODE cores, the GPUs
// it sees); once every agent has joined, it submits the job and follows it
// like `submit --wait`. A job the allocation can never hold is cancelled
// with the controller's reason rather than waited on. At the end the srun
// step's tasks get SIGTERM (scancel --signal: its agents end their workers
// and leave), then the controller stops; the exit status is the job's. One node: everything on
// loopback. More: the controller listens on all interfaces behind a
// certificate made for this run (openssl, in the state dir), and the agents
// trust it.

#include "apps/control.hpp"
#include "cluster/api_client.hpp"
#include "cluster/api_server.hpp"
#include "cluster/local_launcher.hpp"
#include "cluster/slurm.hpp"
#include "runtime/file_io.hpp"
#include "runtime/host.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include <sys/stat.h>
#include <unistd.h>

namespace troupe::apps {

namespace fs = std::filesystem;

namespace {

using clock_type = std::chrono::steady_clock;
constexpr const char* agents_step_name = "troupe-agents";

int fail(const std::string& what) {
  std::fprintf(stderr, "troupe slurm run: %s\n", what.c_str());
  return 2;
}

// `name` found on PATH (no shell: the launcher execs a path).
std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string list = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= list.size()) {
    auto end = list.find(':', start);
    auto dir = list.substr(start, end == std::string::npos ? std::string::npos : end - start);
    auto candidate = (fs::path{dir.empty() ? "." : dir} / name).string();
    if (::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (end == std::string::npos)
      break;
    start = end + 1;
  }
  return {};
}

bool wait_until(double timeout_s, const std::function<bool()>& done) {
  auto deadline = clock_type::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (clock_type::now() < deadline) {
    if (done())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

// Signals a child and waits for it, then kills it if it lingers.
void stop(cluster::local_process& p, int timeout_s) {
  if (!p.running())
    return;
  p.kill(SIGTERM);
  if (!p.wait_for(timeout_s * 1000)) {
    p.kill(SIGKILL);
    (void)p.wait_for(5000);
  }
}

struct run_setup {
  cluster::slurm_allocation alloc;
  std::string exe, srun, state;
  std::string host;
  bool tls = false;
  std::string cert, key;
};

// A certificate for this run's controller, named for its host.
expected<void> make_certificate(run_setup& s) {
  s.cert = (fs::path{s.state} / "slurm-cert.pem").string();
  s.key = (fs::path{s.state} / "slurm-key.pem").string();
  auto openssl = find_in_path("openssl");
  if (openssl.empty())
    return make_error(errc::unavailable, "a multi-node run needs TLS, and openssl is not on PATH to make its "
                                         "certificate");
  cluster::process_spec spec;
  spec.name = "openssl";
  spec.argv = {openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", s.key, "-out", s.cert,
               "-days", "30", "-subj", "/CN=troupe-slurm-" + s.alloc.job_id, "-addext",
               "subjectAltName=DNS:" + s.host};
  spec.output_path = (fs::path{s.state} / "openssl.log").string();
  auto p = cluster::local_process::spawn(spec);
  if (!p)
    return p.error();
  auto st = p->wait_for(60000);
  if (!st || !st->ok())
    return make_error(errc::process_failed, "openssl req: " + cluster::tail_of_file(spec.output_path, 400));
  ::chmod(s.key.c_str(), 0600);
  return {};
}

expected<cluster::local_process> start_controller(const run_setup& s, std::string& address) {
  cluster::process_spec spec;
  spec.name = "controller";
  spec.argv = {s.exe, "controller", "--state-dir", s.state, "--dashboard", "127.0.0.1:0"};
  if (s.tls)
    for (const auto& a : {std::string{"--listen"}, std::string{"0.0.0.0:0"}, std::string{"--advertise"}, s.host,
                          std::string{"--tls-cert"}, s.cert, std::string{"--tls-key"}, s.key})
      spec.argv.push_back(a);
  else
    spec.argv.insert(spec.argv.end(), {"--listen", "127.0.0.1:0"});
  spec.output_path = (fs::path{s.state} / "controller.log").string();
  auto info = fs::path{s.state} / "controller.json";
  std::error_code ec;
  fs::remove(info, ec);
  auto p = cluster::local_process::spawn(spec);
  if (!p)
    return p.error();
  if (!wait_until(60, [&] { return fs::exists(info) || !p->running() || p->poll(); }) || !fs::exists(info))
    return make_error(errc::process_failed, "the controller did not start: " +
                                                cluster::tail_of_file(spec.output_path, 800));
  auto j = nlohmann::json::parse(cluster::tail_of_file(info.string(), 1 << 16), nullptr, false);
  if (!j.is_object() || !j.contains("address") || !j["address"].is_string())
    return make_error(errc::parse_error, info.string() + ": no address");
  address = j["address"].get<std::string>();
  // Listening on every interface: the nodes reach it by the host's name.
  if (s.tls)
    address = s.host + address.substr(address.rfind(':'));
  return p;
}

expected<cluster::local_process> start_agents(const run_setup& s, const std::string& address) {
  auto n = std::to_string(s.alloc.nodes.size());
  cluster::process_spec spec;
  spec.name = "srun (node agents)";
  spec.argv = {s.srun, "--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1", "--overlap", "--kill-on-bad-exit=0",
               std::string{"--job-name="} + agents_step_name, s.exe, "node", "--controller", address, "--secret",
               (fs::path{s.state} / "cluster_secret").string(), "--reconnect-s", "60"};
  if (s.tls)
    spec.argv.insert(spec.argv.end(), {"--tls-ca", s.cert});
  spec.output_path = (fs::path{s.state} / "agents.log").string();
  return cluster::local_process::spawn(spec);
}

// Runs a Slurm tool to its end; its output ("" when it failed).
std::string slurm_tool(const std::string& state, const std::vector<std::string>& argv) {
  cluster::process_spec spec;
  spec.name = argv.front();
  spec.argv = argv;
  spec.output_path = (fs::path{state} / "slurm-tool.out").string();
  auto p = cluster::local_process::spawn(spec);
  if (!p)
    return {};
  auto st = p->wait_for(30000);
  return st && st->ok() ? cluster::tail_of_file(spec.output_path, 1 << 16) : std::string{};
}

// Ends the agents' step: SIGTERM to its tasks (each agent ends its workers
// and leaves), then srun exits; srun itself turns a signal into killing the
// step, so it is only signalled when the step lingers.
void stop_agents(const run_setup& s, cluster::local_process& srun) {
  auto squeue = find_in_path("squeue"), scancel = find_in_path("scancel");
  // squeue lists the job's steps as "<job>.<step> <name>".
  std::string step;
  if (!squeue.empty()) {
    std::istringstream lines{slurm_tool(s.state, {squeue, "-h", "-s", "-j", s.alloc.job_id, "-o", "%i %j"})};
    for (std::string line; std::getline(lines, line);) {
      std::istringstream fields{line};
      std::string id, name;
      if (fields >> id >> name && name == agents_step_name)
        step = id;
    }
  }
  if (!step.empty() && !scancel.empty()) {
    slurm_tool(s.state, {scancel, "--signal=TERM", step});
    if (srun.wait_for(30000))
      return;
  }
  stop(srun, 60);
}

} // namespace

int slurm_run_command(const slurm_run_options& o) {
  run_setup s;
  auto alloc = cluster::read_allocation([](const char* name) { return std::getenv(name); });
  if (!alloc)
    return fail(describe(alloc.error()));
  s.alloc = std::move(*alloc);
  auto exe = cluster::self_executable();
  if (!exe)
    return fail(describe(exe.error()));
  s.exe = *exe;
  s.srun = find_in_path("srun");
  if (s.srun.empty())
    return fail("srun is not on PATH");
  auto base = s.alloc.submit_dir.empty() ? fs::current_path().string() : s.alloc.submit_dir;
  s.state = o.state_dir.empty() ? (fs::path{base} / ("troupe-slurm-" + s.alloc.job_id)).string() : o.state_dir;
  std::error_code ec;
  fs::create_directories(s.state, ec);
  if (ec)
    return fail("state dir " + s.state + ": " + ec.message());
  ::chmod(s.state.c_str(), 0700);
  s.host = runtime::host_name();
  s.tls = s.alloc.nodes.size() > 1;
  if (s.tls)
    if (auto ok = make_certificate(s); !ok)
      return fail(describe(ok.error()));
  std::fprintf(stderr, "troupe slurm run: allocation %s, %zu node%s; state dir %s\n", s.alloc.job_id.c_str(),
               s.alloc.nodes.size(), s.alloc.nodes.size() == 1 ? "" : "s", s.state.c_str());

  std::string address;
  auto ctl = start_controller(s, address);
  if (!ctl)
    return fail(describe(ctl.error()));
  auto agents = start_agents(s, address);
  if (!agents) {
    stop(*ctl, 60);
    return fail(describe(agents.error()));
  }
  client_flags c;
  c.address = address;
  c.token_file = (fs::path{s.state} / "token").string();
  c.state_dir = s.state;
  if (s.tls)
    c.tls_ca = s.cert;
  // Every node's agent joins, or the run ends saying what went wrong.
  cluster::client_options co;
  co.address = address;
  co.ca_file = c.tls_ca;
  auto token = cluster::read_token_file(c.token_file);
  co.token = token ? *token : "";
  auto api = cluster::api_client::connect(co);
  size_t ready = 0;
  bool joined = api && wait_until(o.start_timeout_s, [&] {
                  auto nodes = api->nodes();
                  ready = 0;
                  if (nodes)
                    for (const auto& n : *nodes)
                      ready += n.state == cluster::node_state::ready ? 1 : 0;
                  return ready == s.alloc.nodes.size() || agents->poll().has_value();
                }) && ready == s.alloc.nodes.size();
  int code = 2;
  if (!joined) {
    std::fprintf(stderr, "troupe slurm run: %zu of %zu agents joined within %.0f s; srun's output ends: %s\n",
                 ready, s.alloc.nodes.size(), o.start_timeout_s,
                 cluster::tail_of_file((fs::path{s.state} / "agents.log").string(), 800).c_str());
  } else {
    submit_command_options so;
    so.file = o.file;
    so.overrides = o.overrides;
    so.wait = true;
    so.give_up_queued_s = 15;
    code = submit_command(c, so);
  }
  stop_agents(s, *agents);
  stop(*ctl, 120);
  return code;
}

} // namespace troupe::apps
