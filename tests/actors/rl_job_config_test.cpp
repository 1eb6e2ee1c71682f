// The job spec: defaults, a table of bad specs (each message names the exact
// file:line:col and YAML path), the reference file in configs/ kept in sync
// with the structs, and every example in configs/ valid.
#include "actors/rl/job_config.hpp"

#include "runtime/file_io.hpp"
#include "tests/actors/job_yaml.hpp"

#include <gtest/gtest.h>

#include <filesystem>

using namespace troupe;
using namespace troupe::actors::rl;

namespace {

expected<job_config> parse(const std::string& yaml, std::vector<std::string> sets = {}) {
  return troupe::actors::rl::testing::parse_job(yaml, std::move(sets));
}

std::filesystem::path source_dir() { return TROUPE_SOURCE_DIR; }

} // namespace

TEST(RlJobConfig, DefaultsAreValid) {
  auto c = parse("");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->stages, (std::vector<std::string>{"sft", "rm", "rl"}));
  EXPECT_EQ(resolved_advantage(c->rl), kernels::advantage_estimator::gae);
  EXPECT_TRUE(uses_critic(c->rl));
  EXPECT_FALSE(kl_in_loss(c->rl));
  auto g = parse("rl: {algorithm: grpo, samples_per_prompt: 4}\n");
  ASSERT_TRUE(g) << describe(g.error());
  EXPECT_EQ(resolved_advantage(g->rl), kernels::advantage_estimator::grpo);
  EXPECT_FALSE(uses_critic(g->rl));
  EXPECT_TRUE(kl_in_loss(g->rl));
}

TEST(RlJobConfig, BadSpecsNameTheLineAndPath) {
  struct row {
    std::string yaml;
    std::string expected; // a substring of the message
  };
  const std::vector<row> table = {
      {"rl:\n  prompts_per_iteration: 6\n  minibatches: 4\n",
       "job.yaml:3:16: rl.minibatches: the batch of 6 responses (prompts_per_iteration 6 × "
       "samples_per_prompt 1) is not divisible by 4 minibatches"},
      {"model:\n  num_heads: 4\n  num_kv_heads: 3\n",
       "job.yaml:3:17: model.num_kv_heads: num_heads 4 is not divisible by 3 kv heads"},
      {"model:\n  hidden_size: 100\n  num_heads: 8\n",
       "job.yaml:3:14: model.num_heads: hidden_size 100 is not divisible by 8 heads"},
      {"rl:\n  algorithm: grpo\n", "job.yaml (default): rl.samples_per_prompt: advantage 'grpo' "
                                   "compares samples of a group: needs >= 2"},
      {"rl:\n  algorithm: grpo\n  advantage: gae\n  samples_per_prompt: 2\n",
       "job.yaml:3:14: rl.advantage: grpo has no critic: gae is not available"},
      {"stages: [rl, sft]\n", "job.yaml:1:9: stages: item 2: stage 'sft' must come before"},
      {"stages: [sft, dpo]\n", "job.yaml:1:9: stages: item 2: unknown stage 'dpo'"},
      {"stages: [sft, rl]\nrl:\n  reward: {kind: model}\n",
       "job.yaml:3:18: rl.reward.kind: 'model' needs a reward model"},
      {"stages: [sft, rl]\nrl:\n  critic: {init: rm}\n",
       "job.yaml:3:18: rl.critic.init: 'rm' needs the rm stage"},
      {"rl:\n  generation:\n    temperature: 0\n",
       "job.yaml:3:18: rl.generation.temperature: must be > 0"},
      {"model:\n  max_position_embeddings: 28\n",
       "job.yaml:2:28: model.max_position_embeddings: must hold the longest sort prompt (13 "
       "tokens with BOS) plus rl.generation.max_tokens (16): at least 29"},
      {"sft:\n  optim:\n    lr: -1\n", "job.yaml:3:9: sft.optim.lr: must be > 0"},
      {"rl:\n  kl:\n    estimator: k4\n", "job.yaml:3:16: rl.kl.estimator: expected one of"},
      {"rl:\n  iteratons: 5\n", "job.yaml:2:3: rl.iteratons: unknown key 'iteratons'"},
      {"run:\n  seed: one\n", "job.yaml:2:9: run.seed: expected an integer"},
      {"debug: {fail_role: critc}\n", "debug.fail_role: expected one of policy"},
      {"rl:\n  reward:\n    rules:\n      - {kind: format}\n",
       "rl.reward.rules[0].pattern: a format rule needs the regex its responses must match"},
      {"rl:\n  reward:\n    rules:\n      - {kind: math}\n      - {kind: format, pattern: '(x'}\n",
       "job.yaml:5:33: rl.reward.rules[1].pattern: invalid regex '(x'"},
      {"rl:\n  reward:\n    rules:\n      - {kind: overlong, buffer: 100}\n",
       "job.yaml:4:34: rl.reward.rules[0].buffer: expected an integer in [1, 16]"},
      {"rl:\n  reward:\n    rules:\n      - {kind: math, extract: boxd}\n",
       "rl.reward.rules[0].extract: expected one of none, strict, flexible, boxed"},
      {"rl:\n  reward:\n    rule: exact\n    rules: [{kind: math}]\n",
       "rl.reward.rule: set either rule (the built-in tasks') or rules, not both"},
      {"rl:\n  reward:\n    rule: math\n", "rl.reward.rule: expected one of positional, exact"},
  };
  for (const auto& r : table) {
    auto c = parse(r.yaml);
    ASSERT_FALSE(c) << r.yaml;
    auto msg = describe(c.error());
    EXPECT_NE(msg.find(r.expected), std::string::npos) << "spec:\n"
                                                       << r.yaml << "message: " << msg;
  }
}

TEST(RlJobConfig, EveryViolationIsReportedAtOnce) {
  auto c = parse("rl:\n  iterations: 0\n  epochs: 0\n  gamma: 2\n");
  ASSERT_FALSE(c);
  auto msg = describe(c.error());
  for (const char* path : {"job.yaml:2:15: rl.iterations", "job.yaml:3:11: rl.epochs",
                           "job.yaml:4:10: rl.gamma"})
    EXPECT_NE(msg.find(path), std::string::npos) << path << " in " << msg;
}

TEST(RlJobConfig, OverridesAreLocatedAtTheOverride) {
  auto c = parse("rl: {minibatches: 2}\n", {"rl.prompts_per_iteration=7"});
  ASSERT_FALSE(c);
  EXPECT_NE(describe(c.error()).find("rl.minibatches"), std::string::npos);
  auto ok = parse("", {"rl.algorithm=grpo", "rl.samples_per_prompt=8"});
  ASSERT_TRUE(ok) << describe(ok.error());
  EXPECT_EQ(ok->rl.samples_per_prompt, 8);
}

// configs/reference.yaml is the commented default config, as `troupe config
// show` prints it for an empty file. Regenerate it after changing the structs:
//   troupe config show /dev/null > configs/reference.yaml
TEST(RlJobConfig, ReferenceFileMatchesTheStructs) {
  auto text = runtime::read_file((source_dir() / "configs" / "reference.yaml").string());
  ASSERT_TRUE(text) << describe(text.error());
  EXPECT_EQ(*text, runtime::to_yaml(job_config{}, true))
      << "configs/reference.yaml is stale: regenerate it with "
         "`troupe config show /dev/null > configs/reference.yaml`";
}

TEST(RlJobConfig, EveryFileInConfigsIsValid) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() / "configs")) {
    if (entry.path().extension() != ".yaml")
      continue;
    ++files;
    auto c = load_job(entry.path().string(), {});
    EXPECT_TRUE(c) << entry.path().filename() << ": " << describe(c.error());
    // What `troupe config show` prints loads back to the same config.
    if (c) {
      auto doc = runtime::yaml_document::from_text(runtime::to_yaml(*c), "shown.yaml");
      ASSERT_TRUE(doc);
      auto again = runtime::load_config<job_config>(*doc);
      ASSERT_TRUE(again) << describe(again.error());
      EXPECT_EQ(runtime::to_yaml(*again), runtime::to_yaml(*c));
    }
  }
  EXPECT_GE(files, 3);
}
