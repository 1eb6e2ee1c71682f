#pragma once
// The control plane as users run it: `troupe controller` and the CLI as
// real processes on an ephemeral loopback port, with a state directory of
// their own; bounded waits, and every process stopped at the end.

#include "cluster/api_client.hpp"
#include "cluster/api_server.hpp"
#include "cluster/local_launcher.hpp"
#include "runtime/file_io.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace troupe::test {

/// A file's text, "" when it cannot be read.
inline std::string text_of(const std::string& path) {
  auto t = runtime::read_file(path);
  return t ? *t : std::string{};
}

struct cli_result {
  int code = -1;
  std::string out;
  std::string err;
};

/// Runs ARGV (no shell) and waits at most `timeout_s`.
inline cli_result run_process(const std::vector<std::string>& args, int timeout_s = 300) {
  temp_dir io;
  auto out_path = io.file("out"), err_path = io.file("err");
  pid_t pid = ::fork();
  if (pid == 0) {
    int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(o, STDOUT_FILENO);
    ::dup2(e, STDERR_FILENO);
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  cli_result r;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  for (;;) {
    if (::waitpid(pid, &status, WNOHANG) == pid)
      break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << args.at(0) << " " << (args.size() > 1 ? args[1] : "") << " ran past " << timeout_s
                    << " s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = text_of(out_path);
  r.err = text_of(err_path);
  return r;
}

/// Runs `troupe ARGS...`.
inline cli_result troupe_cli(std::vector<std::string> args, int timeout_s = 300) {
  args.insert(args.begin(), TROUPE_BINARY_PATH);
  return run_process(args, timeout_s);
}

/// Waits (bounded) until `pred` holds.
inline bool eventually(const std::function<bool()>& pred, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

class controller_process {
public:
  explicit controller_process(std::string state_dir) : state_dir_(std::move(state_dir)) {}

  /// Runs it as `wrapper... troupe controller` (on another host, say)
  /// listening on `listen`.
  void place(std::vector<std::string> wrapper, std::string listen) {
    wrapper_ = std::move(wrapper);
    listen_ = std::move(listen);
  }

  /// Starts `troupe controller` on 127.0.0.1:0 (or where place() said) and
  /// waits for its address.
  void start(const std::vector<std::string>& extra = {}) {
    std::error_code ec;
    std::filesystem::remove(info_path(), ec);
    cluster::process_spec spec;
    spec.name = "controller";
    spec.argv = wrapper_;
    for (const auto& a : {std::string{TROUPE_BINARY_PATH}, std::string{"controller"}, std::string{"--listen"}, listen_,
                          std::string{"--dashboard"}, std::string{"127.0.0.1:0"}, std::string{"--state-dir"},
                          state_dir_})
      spec.argv.push_back(a);
    spec.argv.insert(spec.argv.end(), extra.begin(), extra.end());
    spec.output_path = state_dir_ + ".log";
    auto p = cluster::local_process::spawn(spec);
    ASSERT_TRUE(p) << describe(p.error());
    proc_ = std::move(*p);
    ASSERT_TRUE(eventually([&] { return std::filesystem::exists(info_path()) || !proc_.running(); }, 60))
        << "the controller did not start: " << log();
    ASSERT_TRUE(proc_.running()) << log();
    auto j = nlohmann::json::parse(text_of(info_path()));
    address_ = j.at("address").get<std::string>();
    dashboard_ = j.value("dashboard", std::string{});
  }

  /// Signals the controller and waits for its exit status.
  cluster::exit_status stop(int sig = SIGTERM, int timeout_s = 120) {
    if (!proc_.running())
      return proc_.poll().value_or(cluster::exit_status{});
    proc_.kill(sig);
    auto st = proc_.wait_for(timeout_s * 1000);
    EXPECT_TRUE(st) << "the controller did not stop: " << log();
    return st ? *st : cluster::exit_status{};
  }

  cluster::api_client client(const std::string& token_override = {}) const {
    cluster::client_options o;
    o.address = address_;
    o.token = token_override.empty() ? token() : token_override;
    o.timeout_s = 60;
    auto c = cluster::api_client::connect(o);
    EXPECT_TRUE(c) << describe(c.error());
    return std::move(*c);
  }

  std::string token() const {
    auto t = cluster::read_token_file(state_dir_ + "/token");
    return t ? *t : std::string{};
  }

  /// `troupe ARGS... --state-dir DIR` (the client finds address and token there).
  cli_result cli(std::vector<std::string> args, int timeout_s = 300) const {
    args.push_back("--state-dir");
    args.push_back(state_dir_);
    return troupe_cli(args, timeout_s);
  }

  std::string log() const { return text_of(state_dir_ + ".log"); }
  const std::string& address() const { return address_; }
  /// The dashboard's base URL ("http://127.0.0.1:PORT").
  const std::string& dashboard() const { return dashboard_; }
  const std::string& state_dir() const { return state_dir_; }
  pid_t pid() const { return proc_.pid(); }

private:
  std::string info_path() const { return state_dir_ + "/controller.json"; }
  std::vector<std::string> wrapper_;
  std::string listen_ = "127.0.0.1:0";
  std::string state_dir_;
  std::string address_;
  std::string dashboard_;
  cluster::local_process proc_;
};

/// `troupe node`, joined to a controller_process on this machine with its
/// cluster secret; its output in <state dir>-node-<name>.log.
class node_process {
public:
  /// Starts the agent named `name` with `extra` flags (no wait), as
  /// `wrapper... troupe node` when a wrapper is given.
  void start(const controller_process& ctl, const std::string& name, const std::vector<std::string>& extra = {},
             const std::string& secret_file = {}, const std::vector<std::string>& wrapper = {}) {
    name_ = name;
    log_path_ = ctl.state_dir() + "-node-" + name + ".log";
    cluster::process_spec spec;
    spec.name = "node " + name;
    spec.argv = wrapper;
    for (const auto& a : {std::string{TROUPE_BINARY_PATH}, std::string{"node"}, std::string{"--controller"},
                          ctl.address(), std::string{"--name"}, name, std::string{"--secret"},
                          secret_file.empty() ? ctl.state_dir() + "/cluster_secret" : secret_file})
      spec.argv.push_back(a);
    spec.argv.insert(spec.argv.end(), extra.begin(), extra.end());
    spec.output_path = log_path_;
    auto p = cluster::local_process::spawn(spec);
    ASSERT_TRUE(p) << describe(p.error());
    proc_ = std::move(*p);
  }

  /// Waits (bounded) for the agent's exit.
  cluster::exit_status wait(int timeout_s = 30) {
    auto st = proc_.wait_for(timeout_s * 1000);
    EXPECT_TRUE(st) << "node " << name_ << " did not exit: " << log();
    return st ? *st : cluster::exit_status{};
  }

  /// Signals the agent and waits for its exit.
  cluster::exit_status stop(int sig = SIGTERM, int timeout_s = 30) {
    if (!proc_.running())
      return proc_.poll().value_or(cluster::exit_status{});
    proc_.kill(sig);
    return wait(timeout_s);
  }

  void signal(int sig) { proc_.kill(sig); }
  bool running() { return proc_.running() && !proc_.poll(); }
  pid_t pid() const { return proc_.pid(); }
  std::string log() const { return text_of(log_path_); }

private:
  std::string name_;
  std::string log_path_;
  cluster::local_process proc_;
};

/// The node `name` as the controller lists it (nullopt when absent).
inline std::optional<cluster::node_view> node_named(cluster::api_client& api, const std::string& name) {
  auto nodes = api.nodes();
  if (!nodes)
    return std::nullopt;
  for (const auto& n : *nodes)
    if (n.name == name)
      return n;
  return std::nullopt;
}

/// Waits (bounded) until node `name` is in `state`.
inline bool node_reaches(cluster::api_client& api, const std::string& name, cluster::node_state state,
                         double timeout_s = 30) {
  return eventually(
      [&] {
        auto n = node_named(api, name);
        return n && n->state == state;
      },
      timeout_s);
}

/// Submits `spec_file` with `troupe submit` and answers the job's id ("" and
/// a test failure when refused).
inline std::string submit(const controller_process& ctl, const std::string& spec_file,
                          std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"submit", spec_file};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = ctl.cli(args);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return r.code == 0 ? r.out.substr(0, r.out.find('\n')) : std::string{};
}

/// Waits (bounded) until the job's RL stage has done `iterations`.
inline bool reaches_rl_iteration(cluster::api_client& api, const std::string& id, int64_t iterations) {
  return eventually(
      [&] {
        auto v = api.get(id);
        return v && v->status.stage == "rl" && v->status.iteration >= iterations;
      },
      180);
}

/// A small job: SFT then RL on digit sorting, a checkpoint every iteration.
// A job that outlives any test: tests that pause, watch and cancel a running
// job must never find it finished on a faster machine (CI once did at 400).
inline constexpr int endless = 1'000'000;

inline std::string tiny_spec(int iterations) {
  return "run: {name: tiny, dir: run, seed: 5, threads: 1}\n"
         "stages: [sft, rl]\n"
         "data: {task: sort, min_digits: 2, max_digits: 3, train_size: 64, eval_size: 8}\n"
         "model: {hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 2,\n"
         "        num_kv_heads: 1, max_position_embeddings: 24}\n"
         "sft: {steps: 4, batch_size: 8, eval_every: 0}\n"
         "rl: {iterations: " +
         std::to_string(iterations) +
         ", prompts_per_iteration: 8, minibatches: 2, eval_every: 0,\n"
         "     checkpoint_every: 1, generation: {max_tokens: 5},\n"
         "     rollout: {num_blocks: 64, block_size: 4}}\n";
}

} // namespace troupe::test
