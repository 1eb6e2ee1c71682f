#include "models/config.hpp"
#include "runtime/error.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

using namespace troupe;
using namespace troupe::models;

namespace {

// TinyLlama-1.1B-Chat-v1.0's config.json.
const char* tinyllama_json = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0",
  "use_cache": true,
  "vocab_size": 32000
})";

// Llama-3.2-1B-Instruct's config.json (llama3 RoPE scaling, eos list).
const char* llama32_json = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// Qwen2.5-0.5B's config.json.
const char* qwen25_json = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// `base` with `patch` merged in (null values delete keys).
std::string patched(const char* base, const nlohmann::json& patch) {
  auto j = nlohmann::json::parse(base);
  j.merge_patch(patch);
  return j.dump();
}

} // namespace

TEST(HfConfig, ParsesTinyLlama) {
  auto c = parse_hf_config(tinyllama_json, "config.json");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->intermediate_size, 5632);
  EXPECT_EQ(c->num_hidden_layers, 22);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 0);
  EXPECT_EQ(c->resolved_head_dim(), 64);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{2}));
  EXPECT_FALSE(c->pad_token_id);
  EXPECT_FALSE(c->rope_scaling);
}

TEST(HfConfig, ParsesLlama32WithRopeScalingAndEosList) {
  auto c = parse_hf_config(llama32_json, "config.json");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  ASSERT_TRUE(c->rope_scaling);
  EXPECT_EQ(c->rope_scaling->rope_type, "llama3");
  EXPECT_EQ(c->rope_scaling->factor, 32.0);
  EXPECT_EQ(c->rope_scaling->low_freq_factor, 1.0);
  EXPECT_EQ(c->rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 8192);

  // High frequencies kept, low ones divided by 32, the band in between
  // interpolated (values from HF's _compute_llama3_parameters formula).
  auto f = rope_inv_freq(*c);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_DOUBLE_EQ(f[14], 0.0032114459947525913);
  EXPECT_NEAR(f[15], 0.001290547928209264, 1e-15);
  EXPECT_NEAR(f[16], 0.00042955679655936815, 1e-15);
  EXPECT_NEAR(f[17], 9.70828780262767e-05, 1e-16);
  EXPECT_NEAR(f[18], 0.000622772421914596 / 32, 1e-17);
  EXPECT_NEAR(f[31], 3.0138581521391708e-06 / 32, 1e-19);
}

TEST(HfConfig, ParsesQwen25WithBiasAndTiedEmbeddings) {
  auto c = parse_hf_config(qwen25_json, "config.json");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_EQ(c->hidden_size, 896);
  EXPECT_EQ(c->intermediate_size, 4864);
  EXPECT_EQ(c->num_hidden_layers, 24);
  EXPECT_EQ(c->num_attention_heads, 14);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->resolved_head_dim(), 64);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_EQ(c->rope_theta, 1000000.0);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{151643}));
}

TEST(HfConfig, MissingOptionalKeysTakeHfDefaults) {
  auto c = parse_hf_config(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
                               "intermediate_size": 128, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "head_dim": null})",
                           "mini.json");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 0);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->torch_dtype, "float32");
  EXPECT_TRUE(c->eos_token_ids.empty());
}

TEST(HfConfig, ExportRoundTripsAndIsWhatHfExpects) {
  std::vector<llama_config> configs;
  configs.push_back(llama_config{});
  configs.push_back(*parse_hf_config(llama32_json, "a"));
  configs.push_back(*parse_hf_config(qwen25_json, "b"));
  auto with_bias = llama_config{};
  with_bias.qkv_bias = with_bias.o_bias = with_bias.mlp_bias = true;
  with_bias.pad_token_id = 0;
  with_bias.rope_scaling = rope_scaling_config{"linear", 2.0};
  configs.push_back(with_bias);
  for (const auto& c : configs) {
    auto text = to_hf_config_json(c);
    auto back = parse_hf_config(text, "exported");
    ASSERT_TRUE(back) << describe(back.error()) << "\n" << text;
    EXPECT_EQ(*back, c) << text;
  }
  auto j = nlohmann::json::parse(to_hf_config_json(configs[2]));
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"Qwen2ForCausalLM"}));
  EXPECT_EQ(j["model_type"], "qwen2");
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["use_sliding_window"], false);
  EXPECT_EQ(j["eos_token_id"], 151643);
  j = nlohmann::json::parse(to_hf_config_json(configs[1]));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["eos_token_id"], (nlohmann::json{128001, 128008, 128009}));
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["head_dim"], 64);
}

struct bad_config {
  const char* label;
  std::string text;
  errc code;
  const char* reason;
};

TEST(HfConfig, RejectsMalformedConfigsNamingTheKey) {
  using nlohmann::json;
  std::vector<bad_config> cases = {
      {"bad_json", R"({"vocab_size": 3,)", errc::parse_error,
       "not valid JSON: [json.exception.parse_error.101] parse error at line 1, column "},
      {"not_object", "[1]", errc::parse_error, "expected a JSON object, got array"},
      {"wrong_type", patched(tinyllama_json, {{"num_attention_heads", "32"}}), errc::invalid_config,
       "key 'num_attention_heads': expected an integer, got string"},
      {"float_for_int", patched(tinyllama_json, {{"vocab_size", 32000.5}}), errc::invalid_config,
       "key 'vocab_size': expected an integer, got number"},
      {"missing_hidden", patched(tinyllama_json, {{"hidden_size", nullptr}}), errc::invalid_config,
       "missing required key 'hidden_size'"},
      {"null_required", R"({"model_type": "llama", "vocab_size": 10, "hidden_size": null,
                          "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2})",
       errc::invalid_config, "key 'hidden_size': expected an integer, got null"},
      {"missing_key", patched(tinyllama_json, {{"intermediate_size", nullptr}}),
       errc::invalid_config, "missing required key 'intermediate_size'"},
      {"bool_type", patched(tinyllama_json, {{"tie_word_embeddings", "yes"}}), errc::invalid_config,
       "key 'tie_word_embeddings': expected a boolean, got string"},
      {"eos_list_type", patched(tinyllama_json, {{"eos_token_id", json::array({2, "x"})}}),
       errc::invalid_config, "key 'eos_token_id[1]': expected an integer, got string"},
      {"huge_int", patched(tinyllama_json, {{"vocab_size", 18446744073709551615ull}}),
       errc::invalid_config, "key 'vocab_size': integer 18446744073709551615 is out of range"},
      {"unsupported_arch",
       patched(tinyllama_json,
               {{"architectures", json::array({"GPT2LMHeadModel"})}, {"model_type", "gpt2"}}),
       errc::unsupported, "architecture 'GPT2LMHeadModel' is not supported"},
      {"unsupported_model_type",
       patched(tinyllama_json, {{"architectures", nullptr}, {"model_type", "gemma"}}),
       errc::unsupported, "key 'model_type': model type 'gemma' is not supported"},
      {"no_arch", patched(tinyllama_json, {{"architectures", nullptr}, {"model_type", nullptr}}),
       errc::invalid_config, "missing required key 'architectures' (or 'model_type')"},
      {"type_mismatch", patched(tinyllama_json, {{"model_type", "qwen2"}}), errc::invalid_config,
       "key 'model_type': 'qwen2' does not match architecture 'LlamaForCausalLM'"},
      {"heads_not_dividing_hidden",
       patched(tinyllama_json,
               {{"hidden_size", 2000}, {"num_attention_heads", 30}, {"num_key_value_heads", 6}}),
       errc::invalid_config,
       "'hidden_size' (2000) must be divisible by 'num_attention_heads' (30)"},
      {"kv_not_dividing_heads", patched(tinyllama_json, {{"num_key_value_heads", 5}}),
       errc::invalid_config,
       "'num_attention_heads' (32) must be divisible by 'num_key_value_heads' (5)"},
      {"odd_head_dim", patched(tinyllama_json, {{"hidden_size", 36}, {"num_attention_heads", 4}}),
       errc::invalid_config, "'head_dim' (9) must be even"},
      {"zero_layers", patched(tinyllama_json, {{"num_hidden_layers", 0}}), errc::invalid_config,
       "'num_hidden_layers' must be positive, got 0"},
      {"eos_out_of_vocab", patched(tinyllama_json, {{"eos_token_id", 32000}}), errc::invalid_config,
       "'eos_token_id' (32000) must lie in [0, vocab_size 32000)"},
      {"rope_yarn",
       patched(tinyllama_json, {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}}),
       errc::unsupported, "key 'rope_scaling': rope_type 'yarn' is not supported"},
      {"rope_missing_factor", patched(tinyllama_json, {{"rope_scaling", {{"type", "linear"}}}}),
       errc::invalid_config, "rope_scaling: missing required key 'factor'"},
      {"gelu", patched(tinyllama_json, {{"hidden_act", "gelu"}}), errc::unsupported,
       "key 'hidden_act': 'gelu' is not supported"},
      {"int8_dtype", patched(tinyllama_json, {{"torch_dtype", "int8"}}), errc::unsupported,
       "key 'torch_dtype': 'int8' is not supported"},
      {"qwen_sliding", patched(qwen25_json, {{"use_sliding_window", true}}), errc::unsupported,
       "key 'use_sliding_window': sliding-window attention is not supported"},
      {"mistral_window",
       patched(tinyllama_json, {{"architectures", json::array({"MistralForCausalLM"})},
                                {"model_type", "mistral"},
                                {"sliding_window", 1024}}),
       errc::unsupported, "key 'sliding_window': sliding-window attention (window 1024"},
  };
  for (const auto& c : cases) {
    auto out = parse_hf_config(c.text, "/ckpt/config.json");
    ASSERT_FALSE(out) << c.label;
    EXPECT_EQ(code_of(out.error()), c.code) << c.label << ": " << describe(out.error());
    auto msg = context_of(out.error());
    EXPECT_EQ(msg.rfind("/ckpt/config.json: ", 0), 0u) << c.label << ": " << msg;
    EXPECT_NE(msg.find(c.reason), std::string::npos) << c.label << ": " << msg;
  }
}

TEST(HfConfig, AcceptsRewardAndValueHeadArchitectures) {
  using nlohmann::json;
  auto reward = parse_hf_config(
      patched(qwen25_json, {{"architectures", json::array({"Qwen2ForSequenceClassification"})},
                            {"id2label", {{"0", "LABEL_0"}}},
                            {"pad_token_id", 151643}}),
      "rm/config.json");
  ASSERT_TRUE(reward) << describe(reward.error());
  EXPECT_EQ(reward->architecture, "Qwen2ForSequenceClassification");
  EXPECT_TRUE(reward->qkv_bias);
  EXPECT_EQ(reward->pad_token_id, 151643);
  auto j = json::parse(to_hf_config_json(*reward));
  EXPECT_EQ(j["model_type"], "qwen2");
  EXPECT_EQ(j["id2label"], (json{{"0", "LABEL_0"}}));
  EXPECT_EQ(*parse_hf_config(j.dump(), "again"), *reward);

  auto value = llama_config{};
  value.architecture = "LlamaForTokenClassification";
  EXPECT_TRUE(validate(value));
  EXPECT_EQ(*parse_hf_config(to_hf_config_json(value), "v"), value);
  EXPECT_EQ(json::parse(to_hf_config_json(llama_config{})).count("id2label"), 0u);

  auto two = parse_hf_config(
      patched(tinyllama_json, {{"architectures", json::array({"LlamaForSequenceClassification"})},
                               {"id2label", {{"0", "bad"}, {"1", "good"}}}}),
      "config.json");
  ASSERT_FALSE(two);
  EXPECT_EQ(code_of(two.error()), errc::unsupported);
  EXPECT_NE(context_of(two.error()).find("key 'id2label': 2 labels"), std::string::npos);
  value.architecture = "LlamaForQuestionAnswering";
  EXPECT_FALSE(validate(value));
}

TEST(HfConfig, ValidateCollectsEveryViolation) {
  llama_config c;
  c.vocab_size = 0;
  c.num_key_value_heads = 4;
  c.rms_norm_eps = -1;
  auto r = validate(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::invalid_config);
  auto msg = context_of(r.error());
  EXPECT_NE(msg.find("'vocab_size' must be positive, got 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'num_attention_heads' (6) must be divisible by 'num_key_value_heads' (4)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("'rms_norm_eps' must be a positive number"), std::string::npos) << msg;
  EXPECT_TRUE(validate(llama_config{}));
}

// Found by the hf_config fuzz target (tests/fuzz/reproducers/hf_config/):
// a hidden_size of 3.8e16 validated, then the rotary table asked for
// petabytes. Sizes beyond any model's are refused, naming the limit.
TEST(HfConfig, SizesBeyondAnyModelAreRefusedWithTheirLimit) {
  llama_config c;
  c.hidden_size = 38446744073419096;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  auto r = validate(c);
  ASSERT_FALSE(r);
  auto msg = context_of(r.error());
  EXPECT_NE(msg.find("'hidden_size' is 38446744073419096, above the limit of 262144"),
            std::string::npos)
      << msg;
  c = llama_config{};
  c.vocab_size = (int64_t{1} << 24) + 1;
  c.max_position_embeddings = int64_t{1} << 40;
  msg = validate(c) ? std::string{} : context_of(validate(c).error());
  EXPECT_NE(msg.find("'vocab_size' is 16777217, above the limit of 16777216"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("'max_position_embeddings'"), std::string::npos) << msg;
}

TEST(HfConfig, LoadsFromFileAndReportsMissingFile) {
  test::temp_dir dir;
  auto path = dir.write("config.json", qwen25_json);
  auto c = load_hf_config(path);
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  auto missing = load_hf_config(dir.file("nope.json"));
  ASSERT_FALSE(missing);
  EXPECT_EQ(code_of(missing.error()), errc::not_found);
  EXPECT_NE(context_of(missing.error()).find("nope.json"), std::string::npos);
}

TEST(HfConfig, PlainRopeHasTheTextbookFrequencies) {
  llama_config c; // head_dim 48, theta 1e4
  auto f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 24u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_DOUBLE_EQ(f[1], std::pow(10000.0, -2.0 / 48));
  EXPECT_DOUBLE_EQ(f[23], std::pow(10000.0, -46.0 / 48));
  c.rope_scaling = rope_scaling_config{"linear", 4.0};
  EXPECT_DOUBLE_EQ(rope_inv_freq(c)[1], std::pow(10000.0, -2.0 / 48) / 4);
}
