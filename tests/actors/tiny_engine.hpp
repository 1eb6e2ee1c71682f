#pragma once
// A tiny Llama and engine for the inference engine and rollout actor tests.

#include "actors/inference/engine.hpp"
#include "actors/rl/data.hpp"
#include "runtime/tensor_batch.hpp"
#include "models/llama.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>

namespace troupe::actors::inference::testing {

inline models::llama_config tiny_config() {
  models::llama_config c;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 96;
  return c;
}

inline models::llama_model tiny_model(uint64_t seed = 1) {
  torch::manual_seed(seed);
  auto m = models::make_llama(tiny_config(), models::head_kind::lm);
  EXPECT_TRUE(m) << describe(m.error());
  (*m)->eval();
  return *m;
}

inline std::unique_ptr<engine> make_engine(models::llama_model m, engine_config c = {}) {
  if (c.num_blocks == 0)
    c.num_blocks = 64;
  if (c.block_size == 16)
    c.block_size = 4;
  auto e = engine::make(std::move(m), c);
  EXPECT_TRUE(e) << describe(e.error());
  return std::move(*e);
}

inline sampling_params greedy(int64_t max_tokens) {
  sampling_params p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

inline sampling_params random_sampling(int64_t max_tokens, uint64_t seed) {
  sampling_params p;
  p.temperature = 0.9;
  p.top_p = 0.95;
  p.max_tokens = max_tokens;
  p.seed = seed;
  return p;
}

/// A model with `m`'s weights and another head (fresh, seeded).
inline models::llama_model copy_of(const models::llama_model& m, models::head_kind head) {
  torch::manual_seed(7);
  auto out = models::make_llama(m->config(), head);
  EXPECT_TRUE(out);
  auto ok = models::assign_hf_weights(*out, models::export_hf_weights(m), true);
  EXPECT_TRUE(ok) << describe(ok.error());
  return *out;
}

// A fixed batch of prompt + response rows for the update tests.
inline runtime::tensor_batch fixed_batch(int64_t rows, uint64_t seed) {
  std::vector<std::vector<int64_t>> prompts, responses;
  uint64_t s = seed;
  auto next = [&](int64_t mod) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(mod));
  };
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> p(static_cast<size_t>(2 + next(4))), q(static_cast<size_t>(1 + next(5)));
    for (auto& t : p)
      t = 1 + next(40);
    for (auto& t : q)
      t = 1 + next(40);
    prompts.push_back(p);
    responses.push_back(q);
  }
  auto b = rl::collate_sequences(prompts, responses, 0);
  EXPECT_TRUE(b) << describe(b.error());
  return *b;
}

/// fixed_batch with the RL columns an update reads: old and reference
/// log-probs, advantages, returns and values (seeded by `seed`; torch's
/// global generator, so make it before any rank thread starts).
inline runtime::tensor_batch rl_batch(int64_t rows, uint64_t seed) {
  auto b = fixed_batch(rows, seed);
  auto mask = b.get("response_mask").value();
  torch::manual_seed(static_cast<int64_t>(seed));
  auto shape = mask.sizes();
  EXPECT_TRUE(b.set("old_log_probs", (-torch::rand(shape) * 3) * mask));
  EXPECT_TRUE(b.set("ref_log_probs", (-torch::rand(shape) * 3) * mask));
  EXPECT_TRUE(b.set("advantages", torch::randn(shape) * mask));
  EXPECT_TRUE(b.set("returns", torch::randn(shape) * mask));
  EXPECT_TRUE(b.set("values", torch::randn(shape) * 0.1 * mask));
  return b;
}

/// A DPO batch of `pairs` preference pairs (NOTE [preference batches]):
/// fixed_batch's first rows as the chosen sequences, the rest as the
/// rejected ones, with seeded reference log-probs.
inline runtime::tensor_batch dpo_batch(int64_t pairs, uint64_t seed) {
  auto laid = rl::preference_layout(fixed_batch(2 * pairs, seed), pairs);
  EXPECT_TRUE(laid) << describe(laid.error());
  auto b = laid ? *laid : runtime::tensor_batch{};
  torch::manual_seed(static_cast<int64_t>(seed));
  EXPECT_TRUE(b.set("ref_chosen_logps", -torch::rand({pairs}) * 10));
  EXPECT_TRUE(b.set("ref_rejected_logps", -torch::rand({pairs}) * 10));
  return b;
}

/// The tensors of a training state (save_state's bytes), by key.
inline std::map<std::string, at::Tensor> state_tensors(const std::string& bytes) {
  torch::serialize::InputArchive a;
  a.load_from(bytes.data(), bytes.size());
  std::map<std::string, at::Tensor> out;
  for (const auto& key : a.keys()) {
    at::Tensor t;
    if (a.try_read(key, t))
      out[key] = t;
  }
  return out;
}

} // namespace troupe::actors::inference::testing
