#include "models/hf_checkpoint.hpp"
#include "runtime/error.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

using namespace troupe;
using namespace troupe::models;
namespace fs = std::filesystem;

namespace {

llama_config checkpoint_config() {
  llama_config c;
  c.vocab_size = 10;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.eos_token_ids = {2};
  return c;
}

// HF-named tensors of a one-layer model; 1216 bytes in all.
tensor_map tiny_tensors() {
  torch::manual_seed(3);
  tensor_map t;
  t["model.embed_tokens.weight"] = torch::randn({10, 8});                                  // 320
  t["model.layers.0.self_attn.q_proj.weight"] = torch::randn({8, 8});                      // 256
  t["model.layers.0.self_attn.k_proj.weight"] = torch::randn({4, 8}).to(torch::kBFloat16); // 64
  t["model.layers.0.mlp.down_proj.weight"] = torch::randn({8, 16}).to(torch::kHalf);       // 256
  t["model.norm.weight"] = torch::ones({8});                                               // 32
  t["lm_head.weight"] = torch::randn({10, 8}).to(torch::kHalf);                            // 160
  t["model.layers.0.input_layernorm.weight"] = torch::ones({8}).to(torch::kBFloat16);      // 16
  t["model.layers.0.mlp.gate_proj.weight"] =
      torch::randn({16, 8}).to(torch::kHalf); // 256 -> total 1360
  return t;
}

void expect_same(const tensor_map& a, const tensor_map& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    const auto& u = b.at(name);
    EXPECT_EQ(u.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(u.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(u, t)) << name;
  }
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::set<std::string> files_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out.insert(e.path().filename().string());
  return out;
}

} // namespace

TEST(HfCheckpoint, SingleFileRoundTrip) {
  test::temp_dir dir;
  auto ckpt = dir.file("ckpt");
  ASSERT_TRUE(save_hf_checkpoint_dir(ckpt, checkpoint_config(), tiny_tensors()));
  EXPECT_EQ(files_in(ckpt), (std::set<std::string>{"config.json", "model.safetensors"}));
  auto md = runtime::read_safetensors_metadata(ckpt + "/model.safetensors");
  ASSERT_TRUE(md);
  EXPECT_EQ(*md, (string_map{{"format", "pt"}}));
  auto back = load_hf_checkpoint_dir(ckpt);
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(back->config, checkpoint_config());
  expect_same(tiny_tensors(), back->tensors);
}

TEST(HfCheckpoint, ShardedRoundTripWritesIndexAndShards) {
  test::temp_dir dir;
  auto ckpt = dir.file("ckpt");
  auto tensors = tiny_tensors();
  ASSERT_TRUE(save_hf_checkpoint_dir(ckpt, checkpoint_config(), tensors, 400));
  // Greedy packing in name order, at most 400 bytes per shard: [lm_head 160]
  // [embed 320, input_layernorm 16] [down 256] [gate 256, k 64] [q 256, norm 32].
  auto index = read_json(ckpt + "/model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"], 1360);
  const auto& wm = index["weight_map"];
  ASSERT_EQ(wm.size(), tensors.size());
  EXPECT_EQ(wm["lm_head.weight"], "model-00001-of-00005.safetensors");
  EXPECT_EQ(wm["model.embed_tokens.weight"], "model-00002-of-00005.safetensors");
  EXPECT_EQ(wm["model.layers.0.input_layernorm.weight"], "model-00002-of-00005.safetensors");
  EXPECT_EQ(wm["model.layers.0.mlp.down_proj.weight"], "model-00003-of-00005.safetensors");
  EXPECT_EQ(wm["model.layers.0.mlp.gate_proj.weight"], "model-00004-of-00005.safetensors");
  EXPECT_EQ(wm["model.layers.0.self_attn.k_proj.weight"], "model-00004-of-00005.safetensors");
  EXPECT_EQ(wm["model.layers.0.self_attn.q_proj.weight"], "model-00005-of-00005.safetensors");
  EXPECT_EQ(wm["model.norm.weight"], "model-00005-of-00005.safetensors");
  EXPECT_EQ(files_in(ckpt),
            (std::set<std::string>{
                "config.json", "model.safetensors.index.json", "model-00001-of-00005.safetensors",
                "model-00002-of-00005.safetensors", "model-00003-of-00005.safetensors",
                "model-00004-of-00005.safetensors", "model-00005-of-00005.safetensors"}));
  for (int i = 1; i <= 5; ++i) {
    auto md = runtime::read_safetensors_metadata(ckpt + "/model-0000" + std::to_string(i) +
                                        "-of-00005.safetensors");
    ASSERT_TRUE(md);
    EXPECT_EQ(md->at("format"), "pt");
  }
  auto back = load_hf_checkpoint_dir(ckpt);
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(back->config, checkpoint_config());
  expect_same(tensors, back->tensors);
}

TEST(HfCheckpoint, ResavingSwitchesLayoutAndRemovesStaleFiles) {
  test::temp_dir dir;
  auto ckpt = dir.file("ckpt");
  ASSERT_TRUE(save_hf_weights(ckpt, tiny_tensors(), 400));
  ASSERT_TRUE(save_hf_weights(ckpt, tiny_tensors(), 800));
  auto files = files_in(ckpt);
  EXPECT_EQ(files.size(), 3u); // index + 2 shards
  EXPECT_TRUE(files.count("model-00001-of-00002.safetensors"));
  ASSERT_TRUE(save_hf_weights(ckpt, tiny_tensors()));
  EXPECT_EQ(files_in(ckpt), (std::set<std::string>{"model.safetensors"}));
  auto back = load_hf_weights(ckpt);
  ASSERT_TRUE(back);
  expect_same(tiny_tensors(), *back);
}

struct bad_index {
  const char* label;
  nlohmann::json weight_map;
  errc code;
  const char* reason;
};

TEST(HfCheckpoint, RejectsInconsistentIndexes) {
  test::temp_dir dir;
  auto ckpt = dir.file("ckpt");
  ASSERT_TRUE(save_hf_checkpoint_dir(ckpt, checkpoint_config(), tiny_tensors(), 400));
  auto index_path = ckpt + "/model.safetensors.index.json";
  auto good = read_json(index_path)["weight_map"];
  auto with = [&](std::initializer_list<std::pair<const char*, nlohmann::json>> edits) {
    auto wm = good;
    for (const auto& [k, v] : edits) {
      if (v.is_null())
        wm.erase(k);
      else
        wm[k] = v;
    }
    return wm;
  };
  std::vector<bad_index> cases = {
      {"missing_shard", with({{"model.norm.weight", "model-00009-of-00009.safetensors"}}),
       errc::not_found,
       "shard 'model-00009-of-00009.safetensors' (holding 'model.norm.weight') does not exist"},
      {"traversal", with({{"model.norm.weight", "../model-00005-of-00005.safetensors"}}),
       errc::invalid_config,
       "shard name '../model-00005-of-00005.safetensors' is not a plain file name"},
      {"absolute", with({{"model.norm.weight", "/etc/passwd"}}), errc::invalid_config,
       "'weight_map.model.norm.weight': shard name '/etc/passwd'"},
      {"dotdot", with({{"model.norm.weight", ".."}}), errc::invalid_config, "shard name '..'"},
      {"not_in_shard", with({{"model.extra.weight", "model-00001-of-00005.safetensors"}}),
       errc::corrupted,
       "tensor 'model.extra.weight' is mapped to 'model-00001-of-00005.safetensors', which does "
       "not contain it"},
      {"unlisted", with({{"model.norm.weight", nullptr}}), errc::corrupted,
       "tensor 'model.norm.weight' is not listed in"},
      {"wrong_shard", with({{"model.norm.weight", "model-00001-of-00005.safetensors"}}),
       errc::corrupted,
       "tensor 'model.norm.weight' is mapped to 'model-00001-of-00005.safetensors', which does not "
       "contain it"},
      {"not_a_string", with({{"model.norm.weight", 5}}), errc::parse_error,
       "'weight_map.model.norm.weight': expected a file name string"},
  };
  for (const auto& c : cases) {
    std::ofstream(index_path) << nlohmann::json{
        {"metadata", {{"total_size", 1}}},
        {"weight_map", c.weight_map}}.dump();
    auto out = load_hf_checkpoint_dir(ckpt);
    ASSERT_FALSE(out) << c.label;
    EXPECT_EQ(code_of(out.error()), c.code) << c.label << ": " << describe(out.error());
    auto msg = context_of(out.error());
    EXPECT_NE(msg.find("model"), std::string::npos) << c.label << ": " << msg;
    EXPECT_NE(msg.find(c.reason), std::string::npos) << c.label << ": " << msg;
  }
  std::ofstream(index_path) << "{\"weight_map\": [}";
  auto out = load_hf_weights(ckpt);
  ASSERT_FALSE(out);
  EXPECT_EQ(code_of(out.error()), errc::parse_error);
  EXPECT_NE(context_of(out.error()).find(index_path + ": not valid JSON"), std::string::npos);
}

TEST(HfCheckpoint, ReportsMissingPieces) {
  test::temp_dir dir;
  auto out = load_hf_checkpoint_dir(dir.file("nope"));
  ASSERT_FALSE(out);
  EXPECT_EQ(code_of(out.error()), errc::not_found);
  EXPECT_NE(context_of(out.error()).find("nope"), std::string::npos);

  auto ckpt = dir.file("ckpt");
  ASSERT_TRUE(save_hf_weights(ckpt, tiny_tensors()));
  out = load_hf_checkpoint_dir(ckpt); // no config.json
  ASSERT_FALSE(out);
  EXPECT_EQ(code_of(out.error()), errc::not_found);
  EXPECT_NE(context_of(out.error()).find("config.json"), std::string::npos);

  fs::remove(ckpt + "/model.safetensors");
  auto weights = load_hf_weights(ckpt);
  ASSERT_FALSE(weights);
  EXPECT_EQ(code_of(weights.error()), errc::not_found);
  EXPECT_NE(context_of(weights.error()).find("neither model.safetensors nor"), std::string::npos);

  dir.write("ckpt/pytorch_model.bin", "x");
  weights = load_hf_weights(ckpt);
  ASSERT_FALSE(weights);
  EXPECT_EQ(code_of(weights.error()), errc::unsupported);
  EXPECT_NE(context_of(weights.error()).find("pytorch_model.bin"), std::string::npos);
}

TEST(HfCheckpoint, SaveRefusesAnInvalidConfig) {
  test::temp_dir dir;
  auto c = checkpoint_config();
  c.num_key_value_heads = 3;
  auto r = save_hf_checkpoint_dir(dir.file("ckpt"), c, tiny_tensors());
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::invalid_config);
  EXPECT_NE(context_of(r.error()).find("'num_key_value_heads' (3)"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir.file("ckpt")));
}
