// troupe-engine: the commands that need LibTorch (NOTE [lean client] in
// apps/cli.hpp). Thin: parse, validate, run.
#include "actors/actor_system.hpp"
#include "apps/cli.hpp"
#include "apps/generate.hpp"
#include "apps/run.hpp"
#include "apps/tokenize.hpp"
#include "cluster/api_server.hpp"
#include "cluster/env.hpp"
#include "cluster/local_launcher.hpp"
#include "cluster/workers.hpp"
#include "runtime/compute.hpp"

#include <CLI/CLI.hpp>
#include <caf/all.hpp>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>

namespace {

int run_env(bool json, bool smoke, int world, int64_t timeout_ms) {
  using namespace troupe;
  auto report = cluster::collect_env(TROUPE_VERSION);
  bool ok = true;
  if (smoke) {
    caf::actor_system_config cfg;
    actors::configure(cfg);
    caf::actor_system sys{cfg};
    auto t0 = std::chrono::steady_clock::now();
    auto rt = actors::measure_round_trip(sys, 10000, timeout_ms);
    auto& s = report.actor_round_trip;
    s.ran = true;
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rt) {
      s.ok = true;
      char buf[128];
      std::snprintf(buf, sizeof buf, "10000 requests, p50 %.2f us, p99 %.2f us", (*rt)[rt->size() / 2],
                    (*rt)[rt->size() * 99 / 100]);
      s.detail = buf;
    } else {
      s.detail = describe(rt.error());
    }
    auto exe = cluster::self_executable();
    if (exe)
      report.gloo_all_reduce = cluster::run_gloo_smoke(*exe, world, timeout_ms);
    else
      report.gloo_all_reduce = {true, false, describe(exe.error()), 0};
    ok = report.actor_round_trip.ok && report.gloo_all_reduce.ok;
  }
  std::cout << (json ? cluster::render_json(report) : cluster::render_text(report));
  if (json)
    std::cout << "\n";
  return ok ? 0 : 1;
}

using troupe::apps::command_help;
using troupe::apps::runner;

runner add_env(CLI::App& app) {
  auto* env = app.add_subcommand("env", command_help("env"));
  struct flags {
    bool json = false;
    bool no_smoke = false;
    int world = 2;
    int64_t timeout_ms = 60000;
  };
  auto f = std::make_shared<flags>();
  env->add_flag("--json", f->json, "Print the report as JSON");
  env->add_flag("--no-smoke", f->no_smoke, "Skip the actor and gloo smoke tests");
  env->add_option("--world", f->world, "Processes in the gloo all-reduce smoke test")
    ->check(CLI::Range(2, 64));
  env->add_option("--timeout-ms", f->timeout_ms, "Bound on each smoke test")->check(CLI::PositiveNumber);
  return [env, f]() -> std::optional<int> {
    if (!env->parsed())
      return std::nullopt;
    return run_env(f->json, !f->no_smoke, f->world, f->timeout_ms);
  };
}

// The names a flag of enum type accepts (NOTE [enum names]).
template <class E>
std::vector<std::string> choice_names() {
  std::vector<std::string> names;
  for (auto n : troupe::enum_choices<E>())
    names.emplace_back(n);
  return names;
}

runner add_generate(CLI::App& app) {
  auto* gen = app.add_subcommand("generate", command_help("generate"));
  struct flags {
    troupe::apps::generate_options go;
    uint64_t seed = 0;
    bool no_prefix = false;
    bool quiet = false;
    int threads = 0;
    std::string decode_panels = "auto";
    std::string decode_isa = "auto";
  };
  auto f = std::make_shared<flags>();
  auto& go = f->go;
  gen->add_option("--model", go.model_dir, "HF model directory (config.json, *.safetensors, tokenizer.json)")
    ->required();
  gen->add_option("--prompts", go.prompts_path,
                  "JSONL file: {\"id\": ..., \"prompt\": \"text\"} or {\"prompt_ids\": [...]} per line");
  gen->add_option("--prompt", go.prompt, "A single prompt");
  gen->add_option("--output", go.output_path, "Write JSONL results here (default: stdout)");
  gen->add_option("--max-tokens", go.sampling.max_tokens, "Tokens to generate per sample");
  gen->add_option("--temperature", go.sampling.temperature, "0 = greedy");
  gen->add_option("--top-k", go.sampling.top_k, "0 = off");
  gen->add_option("--top-p", go.sampling.top_p, "1 = off");
  gen->add_option("-n,--n", go.sampling.n, "Samples per prompt");
  auto* seed_opt = gen->add_option("--seed", f->seed, "Seed of every request's sample streams");
  gen->add_option("--stop-token-ids", go.sampling.stop_token_ids, "Extra stop token ids");
  gen->add_flag("--ignore-eos", go.sampling.ignore_eos, "Do not stop at EOS");
  gen->add_option("--block-size", go.engine.block_size, "Tokens per KV block");
  gen->add_option("--num-blocks", go.engine.num_blocks, "KV blocks (0 = what the requests need at once, within --kv-cache-mb)");
  gen->add_option("--kv-cache-mb", go.engine.kv_cache_mb, "The KV pool's cap when --num-blocks is 0 (MiB)");
  gen->add_option("--max-num-seqs", go.engine.max_num_seqs, "Running sequences at most");
  gen->add_option("--max-batched-tokens", go.engine.max_batched_tokens, "Tokens per step at most");
  gen->add_flag("--no-prefix-caching", f->no_prefix, "Disable prefix reuse");
  using troupe::actors::inference::isa_mode;
  using troupe::actors::inference::panels_mode;
  gen->add_option("--decode-panels", f->decode_panels,
                  "CPU decode of batches from a packed copy of the weights: auto (where it "
                  "wins), on, off")
      ->check(CLI::IsMember(choice_names<panels_mode>()));
  gen->add_option("--decode-isa", f->decode_isa,
                  "CPU decode instruction set: auto (the widest this CPU runs), avx512, avx2, "
                  "baseline")
      ->check(CLI::IsMember(choice_names<isa_mode>()));
  gen->add_flag("--batch-invariant", go.engine.batch_invariant,
                "Batch-invariant CPU kernels: each request's tokens and log-probs as if it ran "
                "alone (fp32 CPU model; slower)");
  gen->add_flag("--quiet", f->quiet, "Do not print the metrics line to stderr");
  gen->add_option("--threads", f->threads, "CPU compute threads (0 = one per core)")
      ->check(CLI::NonNegativeNumber);
  return [gen, f, seed_opt]() -> std::optional<int> {
    if (!gen->parsed())
      return std::nullopt;
    if (seed_opt->count() > 0)
      f->go.sampling.seed = f->seed;
    f->go.engine.enable_prefix_caching = !f->no_prefix;
    f->go.engine.decode_panels = *troupe::enum_from_name<panels_mode>(f->decode_panels);
    f->go.engine.decode_isa = *troupe::enum_from_name<isa_mode>(f->decode_isa);
    f->go.print_metrics = !f->quiet;
    troupe::runtime::set_compute_threads(f->threads);
    return troupe::apps::run_generate(f->go);
  };
}

runner add_tokenize(CLI::App& app) {
  auto* tok = app.add_subcommand("tokenize", command_help("tokenize"));
  auto o = std::make_shared<troupe::apps::tokenize_options>();
  tok->add_option("--model", o->model, "HF model directory with tokenizer.json (or the file)")
      ->required();
  auto* text = tok->add_option("--text", o->text,
                               "The text (or ids with --decode); default: all of stdin, verbatim");
  tok->add_flag("--json", o->json, "Print ids and pieces (or the decoded text) as JSON");
  tok->add_flag("--decode", o->decode, "The input is ids (JSON array or separated by spaces/commas)");
  tok->add_flag("--add-special", o->add_special,
                "Add the tokenizer's special tokens (BOS/EOS) as a model's prompt gets them");
  tok->add_flag("--skip-special", o->skip_special, "Leave special tokens out of decoded text");
  tok->add_option("--chat", o->chat,
                  "A conversation (JSON: a list of messages, or {messages, tools}) to render "
                  "through the model's chat template and encode");
  tok->add_flag("--add-generation-prompt", o->add_generation_prompt,
                "--chat: end with the assistant's turn opening, as a prompt for generation");
  return [tok, o, text]() -> std::optional<int> {
    if (!tok->parsed())
      return std::nullopt;
    o->text_given = text->count() > 0;
    return troupe::apps::run_tokenize(*o);
  };
}

runner add_run(CLI::App& app) {
  struct flags {
    troupe::apps::run_command_options ro;
    std::string plan_path;
    std::vector<std::string> plan_sets;
    bool plan_suggest = false;
    std::string show_path;
    std::vector<std::string> show_sets;
    bool no_comments = false;
    std::string job_dir;
    bool driver_resume = false;
    bool driver_nodes = false;
  };
  auto f = std::make_shared<flags>();
  auto* run = app.add_subcommand("run", command_help("run"));
  run->add_option("config", f->ro.config_path, "Job YAML file")->required();
  run->add_option("--set", f->ro.overrides, "Override a key: --set rl.iterations=10 (repeatable)");
  run->add_flag("--resume", f->ro.resume, "Continue the run in run.dir from its checkpoints");

  auto* plan = app.add_subcommand("plan", command_help("plan"));
  plan->add_option("config", f->plan_path, "Job YAML file")->required();
  plan->add_option("--set", f->plan_sets, "Override a key (repeatable)");
  plan->add_flag(
      "--suggest", f->plan_suggest,
      "List the training strategies that fit each trained role, cheapest communication first");

  auto* config = app.add_subcommand("config", command_help("config"));
  config->require_subcommand(1);
  auto* show = config->add_subcommand("show", "Print the resolved config (defaults, overrides)");
  show->add_option("config", f->show_path, "Job YAML file")->required();
  show->add_option("--set", f->show_sets, "Override a key (repeatable)");
  show->add_flag("--no-comments", f->no_comments, "Leave out the key descriptions");

  auto* driver = app.add_subcommand("driver", command_help("driver"));
  driver->add_option("--job-dir", f->job_dir, "The job's folder (spec.yaml)")->required();
  driver->add_flag("--resume", f->driver_resume, "Continue from the run's checkpoints");
  driver->add_flag("--nodes", f->driver_nodes,
                   "The workers run on the nodes of <job dir>/nodes.json (NOTE [remote workers])");

  return [=]() -> std::optional<int> {
    if (run->parsed())
      return troupe::apps::run_job_command(f->ro);
    if (show->parsed())
      return troupe::apps::config_show_command(f->show_path, f->show_sets, !f->no_comments);
    if (plan->parsed())
      return troupe::apps::plan_command(f->plan_path, f->plan_sets, f->plan_suggest);
    if (driver->parsed())
      return troupe::apps::driver_command(f->job_dir, f->driver_resume, f->driver_nodes);
    return std::nullopt;
  };
}

int run_worker_command(troupe::cluster::worker_options wo, const std::string& driver_address) {
  auto address = troupe::cluster::parse_listen_address(driver_address);
  if (!address || address->second < 1) {
    std::fprintf(stderr, "troupe worker: --driver '%s': expected HOST:PORT\n", driver_address.c_str());
    return 2;
  }
  wo.driver_host = address->first;
  wo.driver_port = static_cast<uint16_t>(address->second);
  if (wo.rank >= wo.world) {
    std::fprintf(stderr, "troupe worker: --rank %d outside --world %d\n", wo.rank, wo.world);
    return 2;
  }
  return troupe::cluster::run_worker(wo);
}

runner add_worker(CLI::App& app) {
  struct flags {
    troupe::cluster::worker_options wo;
    std::string driver_address;
    int rank = 0;
    int world = 2;
    int port = 0;
    int64_t timeout_ms = 60000;
  };
  auto f = std::make_shared<flags>();
  auto* worker = app.add_subcommand("worker", command_help("worker"));
  worker->add_option("--driver", f->driver_address, "The driver's registrar, HOST:PORT")->required();
  worker->add_option("--rank", f->wo.rank, "This worker's rank")->required()->check(CLI::NonNegativeNumber);
  worker->add_option("--world", f->wo.world, "Number of workers")->required()->check(CLI::PositiveNumber);
  worker->add_option("--role", f->wo.role, "Role hosted (for messages)");
  worker->add_option("--timeout-ms", f->wo.timeout_ms, "Bound on registering")->check(CLI::PositiveNumber);

  // Hidden: the rank side of the gloo smoke test, spawned by `troupe env`.
  auto* smoke = app.add_subcommand("_gloo-smoke", "")->group("");
  smoke->add_option("--rank", f->rank)->required();
  smoke->add_option("--world", f->world)->required();
  smoke->add_option("--port", f->port)->required()->check(CLI::Range(1, 65535));
  smoke->add_option("--timeout-ms", f->timeout_ms);
  return [=]() -> std::optional<int> {
    if (worker->parsed())
      return run_worker_command(f->wo, f->driver_address);
    if (smoke->parsed())
      return troupe::cluster::gloo_smoke_rank(f->rank, f->world, static_cast<uint16_t>(f->port),
                                              f->timeout_ms);
    return std::nullopt;
  };
}

} // namespace

int main(int argc, char** argv) {
  // Every command here talks over sockets (gloo pairs, the CAF middleman,
  // gRPC, TCPStores), and gloo writes without MSG_NOSIGNAL: a peer whose
  // connection closed (a killed worker, a controller restarting) must come
  // back as an error value, not end this process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"troupe: actor-based distributed RLHF"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string{"troupe "} + TROUPE_VERSION);
  std::vector<runner> runners{add_env(app), add_generate(app), add_tokenize(app), add_run(app),
                              add_worker(app)};
  for (auto& r : troupe::apps::add_daemon_commands(app))
    runners.push_back(std::move(r));
  // The client commands work here too (the front is what people type; the
  // startup benchmark compares the two paths).
  for (auto& r : troupe::apps::add_client_commands(app))
    runners.push_back(std::move(r));
  CLI11_PARSE(app, argc, argv);
  for (auto& r : runners)
    if (auto code = r())
      return *code;
  return 0;
}
