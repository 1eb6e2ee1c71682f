#pragma once
// Loads a job spec from YAML text (named job.yaml in messages) with --set
// overrides, and a tiny job, for the job tests.

#include "actors/rl/job_config.hpp"
#include "runtime/file_io.hpp"
#include "runtime/weight_transport.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace troupe::actors::rl::testing {

inline expected<job_config> parse_job(const std::string& yaml, std::vector<std::string> sets = {}) {
  auto doc = runtime::yaml_document::from_text(yaml, "job.yaml");
  if (!doc)
    return doc.error();
  for (const auto& s : sets)
    if (auto ok = doc->set(s); !ok)
      return ok.error();
  return runtime::load_config<job_config>(*doc);
}

/// A metrics line without the wall-clock metrics (which cannot repeat).
inline nlohmann::json deterministic_part(nlohmann::json j) {
  for (auto it = j.begin(); it != j.end();) {
    const auto& k = it.key();
    if (k.rfind("timing_s/", 0) == 0 || k == "perf/throughput" || k == "perf/orchestration_share" ||
        k == "rollout/tokens_per_s" || k == "rollout/ttft_ms" || k == "rollout/itl_ms" ||
        k == "rollout/dynamic_sampling/refill_s")
      it = j.erase(it);
    else
      ++it;
  }
  return j;
}

/// The two runs' final policies (<run dir>/rl/model) are the same bytes.
inline void expect_same_final_weights(const std::string& run_a, const std::string& run_b) {
  auto read = [](const std::string& dir) {
    return runtime::read_file(
        (std::filesystem::path{dir} / "rl" / "model" / "model.safetensors").string());
  };
  auto wa = read(run_a), wb = read(run_b);
  ASSERT_TRUE(wa && wb) << run_a << ", " << run_b;
  EXPECT_TRUE(*wa == *wb) << "the final weights differ";
}

// A job small enough for a unit test: 2-layer width-32 model, 3-digit sorting.
inline std::string tiny_job(const std::string& dir, const std::string& extra = "") {
  return "run: {dir: '" + dir + "', seed: 3, progress: none, timeouts: {compute_s: 60, generate_s: 60}}\n"
         "data: {task: sort, min_digits: 2, max_digits: 3, train_size: 64, eval_size: 8}\n"
         "model: {hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 2,\n"
         "        num_kv_heads: 1, max_position_embeddings: 24}\n"
         "sft: {steps: 3, batch_size: 8, eval_every: 0}\n"
         "rm: {steps: 2, batch_size: 8, eval_every: 0}\n"
         "rl:\n"
         "  iterations: 3\n"
         "  prompts_per_iteration: 4\n"
         "  minibatches: 2\n"
         "  eval_every: 2\n"
         "  checkpoint_every: 1\n"
         "  generation: {max_tokens: 5}\n"
         "  rollout: {num_blocks: 64, block_size: 4}\n" +
         extra;
}

/// The disaggregated placement of configs/disaggregated.yaml: trainers at
/// dp 2 on two devices, the rollout on a third, the judges on a fourth.
inline const char* disaggregated_placement =
    "placement:\n"
    "  mode: disaggregated\n"
    "  pools: [{name: train, devices: 2}, {name: gen, devices: 1}, {name: judge, devices: 1}]\n"
    "  roles:\n"
    "    - {role: policy, pool: train, dp: 2}\n"
    "    - {role: critic, pool: train, dp: 2}\n"
    "    - {role: rollout, pool: gen}\n"
    "    - {role: reward, pool: judge}\n"
    "    - {role: reference, pool: judge}\n";

/// The journal's events of `kind` (<run dir>/events.jsonl), in order; a
/// line still being written (a running job's) is left out.
inline std::vector<nlohmann::json> events_of(const std::string& run_dir, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::ifstream in(std::filesystem::path{run_dir} / "events.jsonl");
  for (std::string line; std::getline(in, line);)
    if (auto j = nlohmann::json::parse(line, nullptr, false);
        j.is_object() && j.value("kind", "") == kind)
      out.push_back(std::move(j));
  return out;
}

/// NOTE [sync staging]: every weight sync of the run reports its temporary
/// bytes — the publisher its staged copy, and more when its export makes
/// tensors (`makes`: a TP gather, a later stage's part; one at a time, so
/// less than a second copy); the receiver the version where the transport
/// stages it, else nothing.
inline void expect_sync_staging(const std::string& run_dir, bool makes) {
  const auto syncs = events_of(run_dir, "weight_sync");
  ASSERT_FALSE(syncs.empty()) << run_dir;
  for (const auto& e : syncs) {
    const auto bytes = e.at("bytes").get<int64_t>();
    const auto published = e.at("publisher_temporary_bytes").get<int64_t>();
    if (makes) {
      EXPECT_GT(published, bytes) << e.dump();
      EXPECT_LT(published, 2 * bytes) << e.dump();
    } else {
      EXPECT_EQ(published, bytes) << e.dump();
    }
    const auto kind = enum_from_name<runtime::transport_kind>(e.at("transport").get<std::string>());
    ASSERT_TRUE(kind) << e.dump();
    const bool staged = runtime::traits_of(*kind).receiver_stages;
    EXPECT_EQ(e.at("receiver_temporary_bytes").get<int64_t>(), staged ? bytes : 0) << e.dump();
  }
}

} // namespace troupe::actors::rl::testing
