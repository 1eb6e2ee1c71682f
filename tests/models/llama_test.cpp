#include "models/llama.hpp"
#include "tests/models/tiny_llama.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <cmath>

using namespace troupe;
using namespace troupe::models;

namespace {

using troupe::models::testing::tiny_config;

llama_model tiny(head_kind head = head_kind::lm, llama_config c = tiny_config()) {
  torch::manual_seed(7);
  auto m = make_llama(c, head);
  EXPECT_TRUE(m) << describe(m.error());
  (*m)->eval();
  return *m;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

} // namespace

TEST(Llama, OutputShapesPerHead) {
  auto ids = torch::randint(0, 61, {3, 9}, torch::kLong);
  auto mask = torch::ones({3, 9}, torch::kLong);
  EXPECT_EQ(tiny(head_kind::lm)->forward(ids, mask).sizes(), (std::vector<int64_t>{3, 9, 61}));
  EXPECT_EQ(tiny(head_kind::value)->forward(ids, mask).sizes(), (std::vector<int64_t>{3, 9}));
  EXPECT_EQ(tiny(head_kind::reward)->forward(ids, mask).sizes(), (std::vector<int64_t>{3}));
}

TEST(Llama, ParameterCountMatchesFormula) {
  auto c = tiny_config();
  auto m = tiny(head_kind::lm, c);
  int64_t hd = c.resolved_head_dim();
  int64_t attn = c.hidden_size * c.num_attention_heads * hd * 2 +
                 c.hidden_size * c.num_key_value_heads * hd * 2;
  int64_t mlp = 3 * c.hidden_size * c.intermediate_size;
  int64_t per_layer = attn + mlp + 2 * c.hidden_size;
  int64_t expect = c.vocab_size * c.hidden_size * 2 + c.num_hidden_layers * per_layer + c.hidden_size;
  int64_t got = 0;
  for (const auto& p : m->parameters())
    got += p.numel();
  EXPECT_EQ(got, expect);
  c.tie_word_embeddings = true;
  auto tied = tiny(head_kind::lm, c);
  int64_t got_tied = 0;
  for (const auto& p : tied->parameters())
    got_tied += p.numel();
  EXPECT_EQ(got_tied, expect - c.vocab_size * c.hidden_size);
}

TEST(Llama, PaddingDoesNotChangeRealTokens) {
  auto m = tiny();
  torch::NoGradGuard ng;
  auto seq = torch::randint(0, 61, {1, 6}, torch::kLong);
  auto alone = m->forward(seq, torch::ones({1, 6}, torch::kLong));
  // Same tokens left-padded by 3 and right-padded by 2 in one row.
  auto padded = torch::zeros({1, 11}, torch::kLong);
  padded.narrow(1, 3, 6).copy_(seq);
  auto mask = torch::zeros({1, 11}, torch::kLong);
  mask.narrow(1, 3, 6).fill_(1);
  auto out = m->forward(padded, mask);
  EXPECT_LT(max_abs_diff(out.narrow(1, 3, 6), alone), 1e-5);
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
}

TEST(Llama, KvCacheDecodeEqualsFullRecompute) {
  auto m = tiny();
  torch::NoGradGuard ng;
  // Two prompts of lengths 5 and 3, left-padded to 5, then 6 decode steps.
  auto prompt = torch::randint(1, 61, {2, 5}, torch::kLong);
  auto pmask = torch::ones({2, 5}, torch::kLong);
  pmask[1].narrow(0, 0, 2).fill_(0);
  prompt[1].narrow(0, 0, 2).fill_(0);
  auto cache = m->make_cache(2, 16);
  auto logits = m->forward(prompt, pmask, &cache);
  auto full_ids = prompt;
  auto full_mask = pmask;
  for (int step = 0; step < 6; ++step) {
    auto next = logits.select(1, logits.size(1) - 1).argmax(-1).unsqueeze(1); // greedy
    full_ids = torch::cat({full_ids, next}, 1);
    full_mask = torch::cat({full_mask, torch::ones({2, 1}, torch::kLong)}, 1);
    logits = m->forward(next, torch::ones({2, 1}, torch::kLong), &cache);
    auto full = m->forward(full_ids, full_mask);
    ASSERT_LT(max_abs_diff(logits.select(1, 0), full.select(1, full.size(1) - 1)), 1e-5)
      << "step " << step;
  }
  EXPECT_EQ(cache.length, 11);
  EXPECT_EQ(cache.next_position[0].item<int64_t>(), 11);
  EXPECT_EQ(cache.next_position[1].item<int64_t>(), 9);
}

TEST(Llama, KvCacheChunkedPrefillEqualsOneShot) {
  auto m = tiny();
  torch::NoGradGuard ng;
  auto ids = torch::randint(0, 61, {1, 10}, torch::kLong);
  auto one = m->forward(ids, {});
  auto cache = m->make_cache(1, 10);
  auto a = m->forward(ids.narrow(1, 0, 4), {}, &cache);
  auto b = m->forward(ids.narrow(1, 4, 6), {}, &cache);
  EXPECT_LT(max_abs_diff(torch::cat({a, b}, 1), one), 1e-5);
}

TEST(Llama, CacheOverflowIsAnErrorNotACrash) {
  auto m = tiny();
  auto cache = m->make_cache(1, 4);
  auto out = run_forward(m, torch::zeros({1, 5}, torch::kLong), {}, &cache);
  ASSERT_FALSE(out);
  EXPECT_NE(describe(out.error()).find("capacity"), std::string::npos) << describe(out.error());
}

TEST(Llama, RopeThetaChangesEveryTokenButTheFirst) {
  // Same weights, different rope_theta: outputs differ (rotary is applied),
  // except at token 0, which attends only to itself (relative position 0).
  auto c = tiny_config();
  auto m = tiny(head_kind::lm, c);
  torch::NoGradGuard ng;
  auto ids = torch::randint(0, 61, {1, 7}, torch::kLong);
  auto out = m->forward(ids, {});
  c.rope_theta = 10000.0;
  auto m2 = tiny(head_kind::lm, c);
  auto out2 = m2->forward(ids, {});
  EXPECT_GT(max_abs_diff(out, out2), 1e-4);
  // Token 0's output never depends on rotary (it attends only to itself).
  EXPECT_LT(max_abs_diff(out.select(1, 0), out2.select(1, 0)), 1e-6);
}

TEST(Llama, GroupedQueryAttentionMatchesExpandedKvHeads) {
  // A GQA model equals the multi-head model whose k/v projections repeat each
  // kv head for its query group (HF's repeat_kv mapping: head h -> h / group).
  auto c = tiny_config();
  auto gqa = tiny(head_kind::lm, c);
  auto full_cfg = c;
  full_cfg.num_key_value_heads = c.num_attention_heads;
  auto mha = tiny(head_kind::lm, full_cfg);
  torch::NoGradGuard ng;
  auto src = gqa->named_weights();
  auto dst = mha->named_weights();
  int64_t hd = c.resolved_head_dim();
  int64_t group = c.num_attention_heads / c.num_key_value_heads;
  for (auto& [name, t] : dst) {
    bool kv = name.find("attention.wk") != std::string::npos ||
              name.find("attention.wv") != std::string::npos;
    if (kv)
      t.copy_(src.at(name).view({c.num_key_value_heads, hd, -1})
                .repeat_interleave(group, 0)
                .reshape(t.sizes()));
    else
      t.copy_(src.at(name));
  }
  auto ids = torch::randint(0, 61, {2, 8}, torch::kLong);
  EXPECT_LT(max_abs_diff(gqa->forward(ids, {}), mha->forward(ids, {})), 1e-5);
}

TEST(Llama, RewardHeadScoresLastRealToken) {
  auto m = tiny(head_kind::reward);
  torch::NoGradGuard ng;
  auto seq = torch::randint(0, 61, {1, 5}, torch::kLong);
  auto alone = m->forward(seq, {});
  auto padded = torch::zeros({1, 8}, torch::kLong);
  padded.narrow(1, 1, 5).copy_(seq);
  auto mask = torch::zeros({1, 8}, torch::kLong);
  mask.narrow(1, 1, 5).fill_(1);
  EXPECT_NEAR(m->forward(padded, mask).item<double>(), alone.item<double>(), 1e-5);
  // The score is the value-style projection of the last real hidden state.
  auto hidden = m->hidden_states(seq, {});
  auto w = m->named_weights().at("reward_head.weight");
  EXPECT_NEAR((hidden[0][4] * w[0]).sum().item<double>(), alone.item<double>(), 1e-5);
}

TEST(Llama, HfNamesMapBothWaysForEveryParameter) {
  auto c = tiny_config();
  c.qkv_bias = true; // Qwen2 style
  c.architecture = "Qwen2ForCausalLM";
  for (auto head : {head_kind::lm, head_kind::value, head_kind::reward}) {
    auto m = tiny(head, c);
    for (const auto& [name, t] : m->named_weights()) {
      auto hf = to_hf_name(name, head);
      ASSERT_TRUE(hf) << name;
      auto back = from_hf_name(*hf, head);
      ASSERT_TRUE(back) << *hf;
      EXPECT_EQ(*back, name);
    }
  }
  EXPECT_EQ(*to_hf_name("layers.1.attention.wq.bias", head_kind::lm),
            "model.layers.1.self_attn.q_proj.bias");
  EXPECT_EQ(*to_hf_name("layers.0.feed_forward.w1.weight", head_kind::lm),
            "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(*to_hf_name("layers.0.feed_forward.w3.weight", head_kind::lm),
            "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(*to_hf_name("layers.0.ffn_norm.weight", head_kind::lm),
            "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(*to_hf_name("output.weight", head_kind::lm), "lm_head.weight");
  EXPECT_EQ(*to_hf_name("value_head.bias", head_kind::value), "score.bias");
  EXPECT_EQ(*from_hf_name("score.weight", head_kind::reward), "reward_head.weight");
  EXPECT_FALSE(from_hf_name("model.layers.x.self_attn.q_proj.weight", head_kind::lm));
  EXPECT_FALSE(to_hf_name("bogus", head_kind::lm));
  EXPECT_EQ(hf_architecture(c, head_kind::value), "Qwen2ForTokenClassification");
  EXPECT_EQ(hf_architecture(c, head_kind::reward), "Qwen2ForSequenceClassification");
}

TEST(Llama, SaveAndLoadPretrainedRoundTrips) {
  test::temp_dir dir;
  auto c = tiny_config();
  c.tie_word_embeddings = true;
  auto m = tiny(head_kind::lm, c);
  ASSERT_TRUE(save_pretrained(m, dir.path().string(), 20000)); // several shards
  auto back = load_pretrained(dir.path().string(), head_kind::lm);
  ASSERT_TRUE(back) << describe(back.error());
  auto ids = torch::randint(0, 61, {2, 6}, torch::kLong);
  torch::NoGradGuard ng;
  EXPECT_EQ(max_abs_diff((*back)->forward(ids, {}), m->forward(ids, {})), 0.0);
  auto exported = export_hf_weights(m);
  EXPECT_EQ(exported.count("lm_head.weight"), 0u); // tied: not written
  EXPECT_EQ(exported.count("model.embed_tokens.weight"), 1u);
}

TEST(Llama, CriticStartsFromPolicyCheckpointWithFreshHead) {
  test::temp_dir dir;
  auto policy = tiny(head_kind::lm);
  ASSERT_TRUE(save_pretrained(policy, dir.path().string()));
  auto strict = load_pretrained(dir.path().string(), head_kind::value);
  ASSERT_FALSE(strict);
  EXPECT_EQ(code_of(strict.error()), errc::not_found);
  EXPECT_NE(describe(strict.error()).find("score.weight"), std::string::npos)
    << describe(strict.error());
  auto critic = load_pretrained(dir.path().string(), head_kind::value, true);
  ASSERT_TRUE(critic) << describe(critic.error());
  torch::NoGradGuard ng;
  auto ids = torch::randint(0, 61, {1, 4}, torch::kLong);
  EXPECT_EQ(max_abs_diff((*critic)->hidden_states(ids, {}), policy->hidden_states(ids, {})), 0.0);
}

TEST(Llama, LoadRejectsWrongShapesAndStrayTensors) {
  auto m = tiny();
  auto weights = export_hf_weights(m);
  auto bad = weights;
  bad["model.norm.weight"] = torch::ones({7});
  auto r = assign_hf_weights(m, bad);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::shape_mismatch);
  EXPECT_NE(describe(r.error()).find("model.norm.weight"), std::string::npos);
  auto stray = weights;
  stray["model.layers.9.mlp.gate_proj.weight"] = torch::ones({1});
  r = assign_hf_weights(m, stray);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("model.layers.9.mlp.gate_proj.weight"), std::string::npos);
  auto missing = weights;
  missing.erase("model.layers.1.self_attn.k_proj.weight");
  r = assign_hf_weights(m, missing);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("model.layers.1.self_attn.k_proj.weight"), std::string::npos);
}

TEST(Llama, HalfPrecisionForwardIsFiniteAndClose) {
  auto m = tiny();
  torch::NoGradGuard ng;
  auto ids = torch::randint(0, 61, {2, 6}, torch::kLong);
  auto mask = torch::ones({2, 6}, torch::kLong);
  mask[1][0] = 0;
  auto ref = m->forward(ids, mask);
  m->to(torch::kBFloat16);
  auto out = m->forward(ids, mask);
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
  EXPECT_LT(max_abs_diff(out.to(torch::kFloat32).narrow(1, 1, 5), ref.narrow(1, 1, 5)), 0.05);
}
