// Start-up of troupe's processes (issue 19), each against its baseline in
// the same run, runs interleaved:
//  1. `troupe --help` (the lean front, NOTE [lean client]) vs the same
//     through the engine binary, which loads LibTorch (the path every
//     command took before the front);
//  2. a client command against a live controller (`jobs`), front vs engine;
//  3. `troupe generate` of one token on the 15M Llama shape (dim 288, 6
//     layers, vocab 32000; random weights in an HF directory), with the
//     engine's bare process start (`troupe-engine --version`) beside it;
//  4. the peak RSS of that generate with the KV pool sized to the work
//     (NOTE [kv pool size]) vs the former default, a pool of kv_cache_mb
//     (256 MiB) whatever the work (--num-blocks of that size).
// Prints the median and p90 wall time of each over N runs (default 20).
//
// Usage: bench_startup [runs] [extra generate flags...]
#include "actors/inference/engine.hpp"
#include "bench/llama_shapes.hpp"
#include "models/llama.hpp"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <optional>
#include <spawn.h>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char** environ;

using namespace troupe;
namespace fs = std::filesystem;

namespace {

struct run_result {
  double seconds = 0;
  double peak_rss_mb = 0; // as `troupe generate` reports it on stderr
  int status = -1;
};

// Runs argv (no shell), stdout to /dev/null and stderr to `err`; wall time
// from spawn to reaped. (The child's rusage would count this benchmark's own
// memory: posix_spawn shares it until the exec.)
run_result run(const std::vector<std::string>& argv, const std::string& err = "/dev/null") {
  std::vector<char*> args;
  for (const auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  run_result r;
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ) != 0) {
    posix_spawn_file_actions_destroy(&fa);
    return r;
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  posix_spawn_file_actions_destroy(&fa);
  std::ifstream in(err);
  std::stringstream text;
  text << in.rdbuf();
  auto at = text.str().find("peak RSS ");
  if (at != std::string::npos)
    r.peak_rss_mb = std::atof(text.str().c_str() + at + 9);
  return r;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

struct series {
  std::string name;
  std::vector<std::string> argv;
  std::vector<double> seconds;
  double peak_rss_mb = 0;
  bool failed = false;
};

void print(const series& s) {
  std::printf("  %-48s median %7.1f ms  p90 %7.1f ms", s.name.c_str(),
              1e3 * percentile(s.seconds, 0.5), 1e3 * percentile(s.seconds, 0.9));
  if (s.peak_rss_mb > 0)
    std::printf("  peak RSS %6.1f MiB", s.peak_rss_mb);
  std::printf("%s\n", s.failed ? "  (a run FAILED)" : "");
}

// Runs each series `runs` times, interleaved (stderr to `err`).
void measure(std::vector<series>& all, int runs, const std::string& err) {
  for (auto& s : all) // warm-up: page cache
    run(s.argv, err);
  for (int i = 0; i < runs; ++i)
    for (auto& s : all) {
      auto r = run(s.argv, err);
      s.seconds.push_back(r.seconds);
      s.peak_rss_mb = std::max(s.peak_rss_mb, r.peak_rss_mb);
      s.failed = s.failed || r.status != 0;
    }
}

double ratio(const series& a, const series& b) {
  return percentile(a.seconds, 0.5) / percentile(b.seconds, 0.5);
}

// A random Llama of the 15M shape saved as an HF directory.
bool write_model(const std::string& dir) {
  torch::manual_seed(1);
  auto m = models::make_llama(bench::shape_15m(), models::head_kind::lm);
  return m && models::save_pretrained(*m, dir);
}

} // namespace

int main(int argc, char** argv) {
  int runs = argc > 1 ? std::max(3, std::atoi(argv[1])) : 20;
  const std::string front = TROUPE_BINARY_PATH;
  const std::string engine = fs::path{front}.parent_path() / "troupe-engine";
  auto dir = fs::temp_directory_path() / ("troupe_bench_startup_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto model = (dir / "model15m").string();
  if (!write_model(model)) {
    std::fprintf(stderr, "cannot write the model\n");
    return 1;
  }
  std::printf("machine: %ld cores online; %d runs each, interleaved\n",
              sysconf(_SC_NPROCESSORS_ONLN), runs);

  // A controller for the client commands.
  auto state = (dir / "state").string();
  pid_t ctl = -1;
  {
    std::vector<std::string> a{engine,        "controller", "--listen",    "127.0.0.1:0",
                               "--dashboard", "off",        "--state-dir", state};
    std::vector<char*> args;
    for (auto& s : a)
      args.push_back(s.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, (dir / "controller.log").c_str(), O_WRONLY | O_CREAT,
                                     0600);
    posix_spawn(&ctl, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
  }
  for (int i = 0; i < 600 && !fs::exists(fs::path{state} / "controller.json"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));

  std::vector<series> help{{"troupe --help (front)", {front, "--help"}},
                           {"troupe-engine --help (loads LibTorch)", {engine, "--help"}}};
  std::vector<series> client{{"troupe jobs (front)", {front, "jobs", "--state-dir", state}},
                             {"troupe-engine jobs", {engine, "jobs", "--state-dir", state}}};
  std::vector<std::string> gen{
      front,          "generate", "--model",       model, "--prompt", "Once upon a time",
      "--max-tokens", "1",        "--temperature", "0"};
  for (int i = 2; i < argc; ++i)
    gen.push_back(argv[i]);
  // The former default pool: 256 MiB of blocks, whatever the requests.
  auto old_gen = gen;
  old_gen.push_back("--num-blocks");
  old_gen.push_back(std::to_string(256ll * 1024 * 1024 /
                                   actors::inference::kv_block_bytes({}, bench::shape_15m(), 4)));
  std::vector<series> engine_start{
      {"troupe generate, 1 token (15M shape)", gen},
      {"troupe-engine --version (process start)", {engine, "--version"}}};
  std::vector<series> memory{{"generate, KV pool sized to the requests", gen},
                             {"generate, KV pool of 256 MiB (former default)", old_gen}};
  auto err = (dir / "stderr.txt").string();
  measure(help, runs, err);
  measure(client, runs, err);
  measure(engine_start, runs, err);
  measure(memory, std::max(3, runs / 4), err);
  ::kill(ctl, SIGTERM);
  ::waitpid(ctl, nullptr, 0);
  fs::remove_all(dir);

  std::printf("help:\n");
  for (const auto& s : help)
    print(s);
  std::printf("  front / engine: %.3fx\n", ratio(help[0], help[1]));
  std::printf("a client command against a controller:\n");
  for (const auto& s : client)
    print(s);
  std::printf("  front / engine: %.3fx\n", ratio(client[0], client[1]));
  std::printf("an engine process:\n");
  for (const auto& s : engine_start)
    print(s);
  std::printf(
      "  generate beyond the bare process start: %.1f ms (median)\n",
      1e3 * (percentile(engine_start[0].seconds, 0.5) - percentile(engine_start[1].seconds, 0.5)));
  std::printf("memory of troupe generate (15M shape, one request):\n");
  for (const auto& s : memory)
    print(s);
  std::printf("  sized / former: %.3fx peak RSS\n", memory[0].peak_rss_mb / memory[1].peak_rss_mb);
  bool failed = false;
  for (const auto* group : {&help, &client, &engine_start, &memory})
    for (const auto& s : *group)
      failed = failed || s.failed;
  return failed ? 1 : 0;
}
