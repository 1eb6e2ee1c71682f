// The reward role over backends (NOTE [reward backends]): the weighted sum
// and each backend's scores under its key, offload reaching every backend,
// a backend's failure naming it, bad backend lists refused; the built-in
// rule backend; and a job whose reward comes from a factory handed in
// through run_options (a fake here, a remote service later).
#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"
#include "actors/rl/reward.hpp"
#include "models/tokenizer.hpp"
#include "tests/actors/job_yaml.hpp"
#include "tests/support/fake_reward.hpp"
#include "tests/support/temp_dir.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

using namespace troupe;
using namespace troupe::actors::rl;

namespace {

using troupe::test::fake_reward;
using troupe::test::fake_reward_state;

constexpr auto timeout = std::chrono::seconds(30);

reward_request request_of(std::vector<std::vector<int64_t>> responses) {
  reward_request r;
  r.answers.assign(responses.size(), "12");
  r.responses = std::move(responses);
  return r;
}

struct fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  fixture() {
    troupe::actors::configure(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
  }
  expected<troupe::actors::train::served_batch> score(const reward_actor& a,
                                                      const reward_request& req) {
    caf::scoped_actor self{*sys};
    expected<troupe::actors::train::served_batch> out = make_error(errc::internal, "no reply");
    self->request(a, timeout, reward_atom::value, req)
        .receive([&](troupe::actors::train::served_batch& b) { out = std::move(b); },
                 [&](caf::error& e) { out = std::move(e); });
    return out;
  }
};

std::vector<float> values(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

} // namespace

TEST(RewardBackends, TheRoleSumsWeightedScoresAndKeepsEachBackendsOwn) {
  fixture f;
  auto a_state = std::make_shared<fake_reward_state>();
  auto b_state = std::make_shared<fake_reward_state>();
  std::vector<weighted_backend> backends;
  backends.push_back({std::make_unique<fake_reward>(
                          "length_scores", [](const auto& r) { return float(r.size()); }, a_state),
                      0.5});
  backends.push_back(
      {std::make_unique<fake_reward>(
           "remote_scores", [](const auto& r) { return r.empty() ? 0.f : float(r[0]); }, b_state),
       2.0});
  auto role = spawn_reward(*f.sys, std::move(backends));
  ASSERT_TRUE(role) << describe(role.error());
  auto got = f.score(*role, request_of({{7, 1, 1}, {3}, {}}));
  ASSERT_TRUE(got) << describe(got.error());
  EXPECT_EQ(values(*got->value.get("length_scores")), (std::vector<float>{3, 1, 0}));
  EXPECT_EQ(values(*got->value.get("remote_scores")), (std::vector<float>{7, 3, 0}));
  EXPECT_EQ(values(*got->value.get("scores")), (std::vector<float>{0.5f * 3 + 14, 0.5f + 6, 0}));
  EXPECT_GE(got->busy_s, 0.0);
  EXPECT_EQ(a_state->scored, 1);

  // Offload reaches every backend and adds up what they freed.
  caf::scoped_actor self{*f.sys};
  int64_t freed = -1;
  self->request(*role, timeout, troupe::actors::release_atom::value, std::string{"offload"})
      .receive([&](troupe::actors::train::served_bytes& b) { freed = b.value; },
               [&](caf::error&) {});
  EXPECT_EQ(freed, 2 * 4096);
  EXPECT_EQ(a_state->released, 1);
  EXPECT_EQ(b_state->released, 1);

  // A backend's failure fails the request, naming the backend.
  b_state->fail_next = true;
  auto bad = f.score(*role, request_of({{1}}));
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("reward: remote_scores: the service went away"),
            std::string::npos)
      << describe(bad.error());
  EXPECT_TRUE(f.score(*role, request_of({{1}}))) << "the role goes on";
  caf::anon_send_exit(*role, caf::exit_reason::user_shutdown);
}

TEST(RewardBackends, BadBackendListsAndWrongSizesAreRefused) {
  fixture f;
  EXPECT_FALSE(spawn_reward(*f.sys, {}));
  auto st = std::make_shared<fake_reward_state>();
  std::vector<weighted_backend> twice;
  twice.push_back({std::make_unique<fake_reward>(
                       "x_scores", [](const auto&) { return 1.f; }, st),
                   1});
  twice.push_back({std::make_unique<fake_reward>(
                       "x_scores", [](const auto&) { return 1.f; }, st),
                   1});
  auto dup = spawn_reward(*f.sys, std::move(twice));
  ASSERT_FALSE(dup);
  EXPECT_NE(describe(dup.error()).find("backend key 'x_scores' is taken"), std::string::npos);
  std::vector<weighted_backend> taken;
  taken.push_back({std::make_unique<fake_reward>(
                       "scores", [](const auto&) { return 1.f; }, st),
                   1});
  EXPECT_FALSE(spawn_reward(*f.sys, std::move(taken)));
}

TEST(RewardBackends, TheRuleBackendScoresDecodedResponses) {
  auto tok = std::make_shared<models::byte_tokenizer>();
  rule_config exact;
  exact.kind = rule_kind::exact;
  auto rule = make_rule_backend(tok, *rule_set::make({exact}, 16));
  EXPECT_EQ(rule->key(), "rule_scores");
  reward_request req;
  req.answers = {"12", "12"};
  req.responses = {tok->encode("12"), tok->encode("21")};
  auto s = rule->score(req);
  ASSERT_TRUE(s) << describe(s.error());
  EXPECT_EQ(values(*s), (std::vector<float>{1, 0}));
  EXPECT_EQ(*rule->release("offload"), 0) << "a rule holds nothing";
}

TEST(RewardBackends, VerifiableRulesSumWithTheirWeightsOnTheTextBeforeEos) {
  auto tok = std::make_shared<models::byte_tokenizer>();
  rule_config math, format, overlong;
  math.kind = rule_kind::math;
  math.extract = answer_extract::strict;
  format.kind = rule_kind::format;
  format.pattern = R"(.*#### -?\d+)";
  format.weight = 0.5;
  overlong.kind = rule_kind::overlong;
  overlong.buffer = 4; // max_tokens 12: soft from 8 tokens, -1 at 12
  auto rule = make_rule_backend(tok, *rule_set::make({math, format, overlong}, 12));
  reward_request req;
  req.answers = {"Tom has 7. #### 7", "7", "7"};
  auto eos = *tok->eos_id();
  auto with_eos = [&](const std::string& text) {
    auto ids = tok->encode(text);
    ids.push_back(eos);
    ids.push_back(tok->encode("9").front()); // after EOS: never read
    return ids;
  };
  req.responses = {with_eos("#### 7"), with_eos("so #### 7.0"), tok->encode("so... #### 8")};
  auto s = rule->score(req);
  ASSERT_TRUE(s) << describe(s.error());
  // 6 tokens: right and formatted; 11 tokens: right, formatted? no ("7.0"
  // is not -?\d+), 3/4 into the soft zone; 12 tokens, no EOS: wrong,
  // formatted, the whole penalty.
  auto v = values(*s);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_FLOAT_EQ(v[0], 1.5f);
  EXPECT_FLOAT_EQ(v[1], 1.0f - 0.75f);
  EXPECT_FLOAT_EQ(v[2], 0.5f - 1.0f);
}

namespace {

// Runs `cfg` with its reward role built by `factory`: the rl stage's
// metrics lines that hold `key`.
std::vector<nlohmann::json> rl_lines_with_reward(const job_config& cfg, const std::string& key,
                                                 decltype(role_factories::reward) factory) {
  run_options opts;
  opts.factories.reward = std::move(factory);
  {
    caf::actor_system_config sc;
    troupe::actors::configure(sc);
    caf::actor_system sys{sc};
    auto summary = run_job(sys, cfg, opts);
    EXPECT_TRUE(summary) << describe(summary.error());
  }
  std::vector<nlohmann::json> out;
  std::ifstream in(std::filesystem::path{cfg.run.dir} / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (auto j = nlohmann::json::parse(line); j.value("stage", "") == "rl" && j.contains(key))
      out.push_back(std::move(j));
  return out;
}

} // namespace

// A job whose reward role is built by a factory from run_options: every
// response scores 0.25, so the rl stage's mean score is exactly that.
TEST(RewardBackends, AJobTakesItsRewardFromTheFactoryItIsGiven) {
  test::temp_dir tmp;
  auto cfg = troupe::actors::rl::testing::parse_job(
      troupe::actors::rl::testing::tiny_job(tmp.file("run")),
      {"stages=[rl]", "rl.critic.init=base", "rl.iterations=2", "rl.eval_every=0",
       "rl.checkpoint_every=0"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto state = std::make_shared<fake_reward_state>();
  auto lines = rl_lines_with_reward(
      *cfg, "critic/score/mean",
      [state](const job_config&, const role_spec& spec) -> expected<std::vector<weighted_backend>> {
        EXPECT_EQ(spec.role, "reward");
        std::vector<weighted_backend> out;
        out.push_back({std::make_unique<fake_reward>(
                           "fake_scores", [](const auto&) { return 0.25f; }, state),
                       1.0});
        return out;
      });
  EXPECT_EQ(state->scored, 2);
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& j : lines) {
    EXPECT_DOUBLE_EQ(j["critic/score/mean"].get<double>(), 0.25) << j.dump();
    EXPECT_DOUBLE_EQ(j["critic/fake_score/mean"].get<double>(), 0.25) << j.dump();
    EXPECT_FALSE(j.contains("critic/rule_score/mean")) << "no built-in rule ran";
  }
}

namespace {

// Scores 0 a response, and 1 each of its odd tokens as per-token scores.
class dense_only final : public reward_backend {
public:
  std::string_view key() const override { return "dense_scores"; }
  expected<at::Tensor> score(const reward_request& req) override {
    int64_t longest = 1;
    for (const auto& r : req.responses)
      longest = std::max<int64_t>(longest, static_cast<int64_t>(r.size()));
    dense_ = at::zeros({static_cast<int64_t>(req.responses.size()), longest});
    for (size_t i = 0; i < req.responses.size(); ++i)
      for (size_t t = 0; t < req.responses[i].size(); ++t)
        dense_[static_cast<int64_t>(i)][static_cast<int64_t>(t)] =
            static_cast<float>(req.responses[i][t] % 2);
    return at::zeros({static_cast<int64_t>(req.responses.size())});
  }
  runtime::tensor_batch extras() override {
    runtime::tensor_batch out;
    EXPECT_TRUE(out.set("token_scores", dense_));
    return out;
  }

private:
  at::Tensor dense_;
};

} // namespace

// GRPO compares a group's sequences by their totals: per-token scores count
// by their sum (here the only signal: every sequence score is 0).
TEST(RewardBackends, GrpoCountsDenseTokenScoresByTheirSum) {
  test::temp_dir tmp;
  auto cfg = troupe::actors::rl::testing::parse_job(
      troupe::actors::rl::testing::tiny_job(tmp.file("run")),
      {"stages=[rl]", "rl.algorithm=grpo", "rl.samples_per_prompt=4", "rl.kl.coef=0",
       "rl.iterations=2", "rl.eval_every=0", "rl.checkpoint_every=0"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto lines = rl_lines_with_reward(
      *cfg, "critic/advantages/max",
      [](const job_config&, const role_spec&) -> expected<std::vector<weighted_backend>> {
        std::vector<weighted_backend> out;
        out.push_back({std::make_unique<dense_only>(), 1.0});
        return out;
      });
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& j : lines) {
    EXPECT_EQ(j["critic/score/mean"].get<double>(), 0.0) << j.dump();
    EXPECT_GT(j["critic/rewards/mean"].get<double>(), 0.0) << j.dump();
    EXPECT_GT(j["critic/advantages/max"].get<double>(), 0.0)
        << "groups differ by their sums: " << j.dump();
  }
}
