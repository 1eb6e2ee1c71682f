// Multi-turn episodes (NOTE [episodes] in actors/rl/episodes.hpp), each
// against its baseline in the same run:
//  1. The KV of a conversation kept across turns against re-prefilling each
//     turn: the same episodes with the engine's prefix cache on (a turn
//     extends the conversation's cached blocks) and off (every turn computes
//     its whole sequence again): seconds, prompt tokens computed, generated
//     tokens per second.
//  2. Environment overhead: the Python reference server doing no work
//     (examples/python/tool_env_server.py --echo) against an in-process
//     environment doing the same: Step latency p50 / p99 and the batch's
//     seconds.
//  3. One slow environment among many (one session's steps take 0, 0.3 or
//     1 s): the batch's seconds with episodes overlapping against in lockstep.
// Medians of `rounds` interleaved rounds. A random byte-level model (4
// layers, width 256) samples; every 16th byte is a stop token that ends a
// turn.
//
// Usage: bench_episodes [episodes] [turns] [rounds]
#include "actors/actor_system.hpp"
#include "actors/inference/rollout.hpp"
#include "actors/rl/episodes.hpp"
#include "actors/rl/job_config.hpp"
#include "bench/python_server.hpp"
#include "cluster/remote_environment.hpp"
#include "models/llama.hpp"
#include "models/tokenizer.hpp"

#include <caf/all.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>

using namespace troupe;
using namespace troupe::actors::rl;

namespace {

// Answers every turn with "[turn:text]" and never ends (the turn limit
// does), as tool_env_server.py --echo does; a session may be slow.
struct echo_env final : environment {
  std::map<std::string, double> delay_s;
  std::string name() const override { return "echo"; }
  expected<std::vector<reset_result>> reset(const std::vector<reset_task>& tasks) override {
    std::vector<reset_result> out;
    for (const auto& t : tasks) {
      reset_result r{t.session, {}, nullptr};
      r.first.text = t.row.prompt;
      out.push_back(std::move(r));
    }
    return out;
  }
  expected<std::vector<step_result>> step(const std::vector<env_turn>& turns) override {
    std::vector<step_result> out;
    for (const auto& t : turns) {
      if (auto it = delay_s.find(t.session); it != delay_s.end())
        std::this_thread::sleep_for(std::chrono::duration<double>(it->second));
      step_result r;
      r.session = t.session;
      r.next.text = "[" + std::to_string(t.turn) + ":" + t.text + "]";
      out.push_back(std::move(r));
    }
    return out;
  }
};

models::llama_model bench_model() {
  models::llama_config c;
  c.vocab_size = models::byte_tokenizer::size;
  c.hidden_size = 256;
  c.intermediate_size = 768;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.max_position_embeddings = 2048;
  c.eos_token_ids = {models::byte_tokenizer::eos_token};
  torch::manual_seed(3);
  auto m = models::make_llama(c, models::head_kind::lm);
  if (!m) {
    std::fprintf(stderr, "model: %s\n", describe(m.error()).c_str());
    std::exit(1);
  }
  (*m)->eval();
  return *m;
}

std::vector<episode_prompt> prompts(int episodes) {
  std::vector<episode_prompt> out;
  for (int i = 0; i < episodes; ++i) {
    episode_prompt p;
    p.id = "0/" + std::to_string(i);
    p.row.prompt = "task " + std::to_string(i) + ": say something, then listen.";
    p.sampling.max_tokens = 64;
    p.sampling.seed = 1000 + static_cast<uint64_t>(i);
    for (int64_t t = 16; t < 256; t += 16) // ~6 % of the bytes end a turn
      p.sampling.stop_token_ids.push_back(t);
    out.push_back(p);
  }
  return out;
}

struct measured {
  double seconds = 0;
  episode_batch batch;
};

struct bench_context {
  caf::actor_system& sys;
  std::shared_ptr<models::byte_tokenizer> tok = std::make_shared<models::byte_tokenizer>();
  prompt_encoder enc{tok, false};
  models::llama_model model = bench_model();
};

measured run_once(bench_context& b, std::shared_ptr<environment> env, bool prefix_cache,
                  episode_options o, int episodes) {
  actors::inference::engine_config c;
  c.enable_prefix_caching = prefix_cache;
  c.max_num_seqs = 256;
  auto rollout = actors::inference::spawn_rollout(b.sys, b.model, c);
  if (!rollout) {
    std::fprintf(stderr, "rollout: %s\n", describe(rollout.error()).c_str());
    std::exit(1);
  }
  auto t0 = std::chrono::steady_clock::now();
  auto got = run_episodes(b.sys, *rollout, std::move(env), b.enc, prompts(episodes), o);
  measured out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  caf::anon_send_exit(*rollout, caf::exit_reason::user_shutdown);
  if (!got) {
    std::fprintf(stderr, "episodes: %s\n", describe(got.error()).c_str());
    std::exit(1);
  }
  out.batch = std::move(*got);
  return out;
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs.empty() ? 0 : xs[xs.size() / 2];
}

void kv_across_turns(bench_context& b, int episodes, int turns, int rounds) {
  episode_options o;
  o.max_turns = turns;
  o.max_context = 2048;
  std::map<bool, std::vector<double>> secs, computed, tokps;
  for (int r = 0; r < rounds; ++r)
    for (bool cache : {true, false}) {
      auto m = run_once(b, std::make_shared<echo_env>(), cache, o, episodes);
      const auto& e = m.batch.stats.engine;
      secs[cache].push_back(m.seconds);
      computed[cache].push_back(static_cast<double>(e.prefill_tokens_computed));
      tokps[cache].push_back(static_cast<double>(e.generated_tokens) / m.seconds);
    }
  std::printf("1. KV across turns (%d episodes, %d turns, echo observations)\n", episodes, turns);
  for (bool cache : {true, false})
    std::printf(
        "   prefix cache %-3s: %7.3f s  %9.0f prompt tokens computed  %8.0f generated tok/s\n",
        cache ? "on" : "off", median(secs[cache]), median(computed[cache]), median(tokps[cache]));
  std::printf("   kept / re-prefilled: %.2fx the throughput, %.2fx the prompt tokens computed\n",
              median(tokps[true]) / median(tokps[false]),
              median(computed[true]) / median(computed[false]));
}

void environment_overhead(bench_context& b, int episodes, int turns, int rounds) {
  auto dir =
      std::filesystem::temp_directory_path() / ("bench_episodes_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  bench::python_server srv;
  std::printf("2. Environment overhead (Step calls of one session each)\n");
  if (!srv.start("tool_env_server.py", (dir / "port").string(), {"--echo", "--workers", "64"})) {
    std::printf("   (the Python server did not start: skipped)\n");
    return;
  }
  remote_service_config rc;
  rc.address = srv.address;
  rc.timeout_s = 30;
  episode_options o;
  o.max_turns = turns;
  o.max_context = 2048;
  std::map<std::string, std::vector<double>> secs, p50, p99;
  for (int r = 0; r < rounds; ++r)
    for (std::string kind : {"in-process", "python"}) {
      std::shared_ptr<environment> env;
      if (kind == "python") {
        auto remote = cluster::make_remote_environment(rc, "bench");
        if (!remote) {
          std::fprintf(stderr, "remote: %s\n", describe(remote.error()).c_str());
          return;
        }
        env = std::move(*remote);
      } else {
        env = std::make_shared<echo_env>();
      }
      auto m = run_once(b, env, true, o, episodes);
      auto metrics = episode_metrics(m.batch);
      secs[kind].push_back(m.seconds);
      p50[kind].push_back(metrics["env/step_latency_ms/p50"]);
      p99[kind].push_back(metrics["env/step_latency_ms/p99"]);
    }
  for (std::string kind : {"in-process", "python"})
    std::printf("   %-10s: %7.3f s  step p50 %7.3f ms  p99 %7.3f ms\n", kind.c_str(),
                median(secs[kind]), median(p50[kind]), median(p99[kind]));
  std::printf("   python / in-process: %.2fx the batch's time, +%.3f ms per step (p50)\n",
              median(secs["python"]) / median(secs["in-process"]),
              median(p50["python"]) - median(p50["in-process"]));
  std::filesystem::remove_all(dir);
}

void slow_environment(bench_context& b, int episodes, int turns, int rounds) {
  std::printf("3. One slow session among %d: overlapping episodes against lockstep\n", episodes);
  for (double delay : {0.0, 0.3, 1.0}) {
    std::map<bool, std::vector<double>> secs, steps, fused;
    int slow_steps = 0;
    for (int r = 0; r < rounds; ++r)
      for (bool overlap : {true, false}) {
        auto env = std::make_shared<echo_env>();
        if (delay > 0)
          env->delay_s["0/0/0"] = delay;
        episode_options o;
        o.max_turns = turns;
        o.max_context = 2048;
        o.overlap = overlap;
        auto m = run_once(b, env, true, o, episodes);
        secs[overlap].push_back(m.seconds);
        const auto& e = m.batch.stats.engine;
        steps[overlap].push_back(static_cast<double>(e.steps));
        fused[overlap].push_back(static_cast<double>(e.fused_decode_steps) /
                                 static_cast<double>(std::max<int64_t>(1, e.steps)));
        slow_steps = m.batch.episodes.front().turns;
      }
    std::printf("   %.1f s per step (%d steps): overlapping %7.3f s   lockstep %7.3f s   "
                "lockstep / overlapping %.2fx\n",
                delay, slow_steps, median(secs[true]), median(secs[false]),
                median(secs[false]) / median(secs[true]));
    std::printf("      engine steps %5.0f vs %5.0f, fused decode %3.0f %% vs %3.0f %%\n",
                median(steps[true]), median(steps[false]), 100 * median(fused[true]),
                100 * median(fused[false]));
  }
}

} // namespace

int main(int argc, char** argv) {
  const int episodes = argc > 1 ? std::atoi(argv[1]) : 32;
  const int turns = argc > 2 ? std::atoi(argv[2]) : 4;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
  caf::actor_system_config cfg;
  actors::configure(cfg);
  caf::actor_system sys{cfg};
  bench_context b{sys};
  std::printf("bench_episodes: %d episodes x %d turns, medians of %d rounds, %d threads\n",
              episodes, turns, rounds, torch::get_num_threads());
  kv_across_turns(b, episodes, turns, rounds);
  environment_overhead(b, episodes, turns, rounds);
  slow_environment(b, episodes, turns, rounds);
  return 0;
}
