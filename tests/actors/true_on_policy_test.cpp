// The trainer–generator contract's exact mode (NOTE [true on-policy]): a
// batch-invariant engine samples a sequence with the same tokens and
// log-probs alone and among 8 or 32 others, and those log-probs are the
// trainer's bit for bit — its log_probs and the update's first minibatch,
// whose every ratio is then exactly 1.

#include "actors/rl/data.hpp"
#include "actors/train/train_engine.hpp"
#include "tests/actors/tiny_engine.hpp"

#include <gtest/gtest.h>

#include <random>

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::inference;
using namespace troupe::actors::inference::testing;

namespace {

constexpr double kTemperature = 0.8;

std::vector<int64_t> prompt_of(std::mt19937& rng, int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (auto& t : p)
    t = 1 + static_cast<int64_t>(rng() % 49);
  return p;
}

generate_request request(std::string id, std::vector<int64_t> prompt, uint64_t seed) {
  sampling_params sp;
  sp.temperature = kTemperature;
  sp.max_tokens = 12;
  sp.seed = seed;
  return {std::move(id), std::move(prompt), sp};
}

/// The target request's sample when generated among `others` more.
sample_output generated_among(const models::llama_model& m, const generate_request& target,
                              int others) {
  engine_config c;
  c.batch_invariant = true;
  auto e = make_engine(m, c);
  std::mt19937 rng(static_cast<unsigned>(others));
  std::vector<generate_request> reqs;
  for (int i = 0; i < others; ++i)
    reqs.push_back(request("o" + std::to_string(i),
                           prompt_of(rng, 2 + static_cast<int64_t>(rng() % 14)),
                           static_cast<uint64_t>(500 + i)));
  reqs.insert(reqs.begin() + others / 2, target);
  auto outs = e->generate(reqs);
  EXPECT_TRUE(outs) << describe(outs.error());
  for (auto& o : *outs)
    if (o.id == target.id)
      return o.samples[0];
  ADD_FAILURE() << "no output for " << target.id;
  return {};
}

std::unique_ptr<train::train_engine> invariant_trainer(const models::llama_model& m) {
  train::optimizer_options o;
  o.lr = 1e-3;
  auto t = train::train_engine::make(copy_of(m, models::head_kind::lm), o);
  EXPECT_TRUE(t) << describe(t.error());
  auto ok = (*t)->set_batch_invariant(true);
  EXPECT_TRUE(ok) << describe(ok.error());
  return std::move(*t);
}

} // namespace

TEST(TrueOnPolicy, SampledLogProbsAreTheTrainersAloneAndInBatchesOf8And32) {
  auto m = tiny_model(4);
  std::mt19937 rng(9);
  const auto target = request("target", prompt_of(rng, 7), 42);
  const auto alone = generated_among(m, target, 0);
  ASSERT_EQ(alone.tokens.size(), 12u);
  for (int others : {7, 31}) {
    SCOPED_TRACE(std::to_string(others + 1) + " requests");
    const auto among = generated_among(m, target, others);
    EXPECT_EQ(among.tokens, alone.tokens);
    EXPECT_EQ(among.logprobs, alone.logprobs) << "bit for bit (float ==)";
  }
  // The trainer scores the sample alone and inside a padded batch of 8.
  auto trainer = invariant_trainer(m);
  std::vector<std::vector<int64_t>> prompts{target.prompt}, responses{alone.tokens};
  for (int i = 0; i < 7; ++i) {
    prompts.push_back(prompt_of(rng, 1 + static_cast<int64_t>(rng() % 9)));
    responses.push_back(prompt_of(rng, 1 + static_cast<int64_t>(rng() % 12)));
  }
  for (size_t rows : {size_t{1}, size_t{8}}) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    auto batch =
        rl::collate_sequences({prompts.begin(), prompts.begin() + static_cast<long>(rows)},
                              {responses.begin(), responses.begin() + static_cast<long>(rows)}, 0);
    ASSERT_TRUE(batch);
    auto lp = trainer->log_probs(*batch, kTemperature, false);
    ASSERT_TRUE(lp) << describe(lp.error());
    auto row = lp->get("log_probs").value()[0];
    for (size_t i = 0; i < alone.logprobs.size(); ++i)
      EXPECT_EQ(alone.logprobs[i],
                row[static_cast<int64_t>(target.prompt.size() - 1 + i)].item<float>())
          << "token " << i;
  }
}

// The update's first minibatch recomputes the old log-probs exactly: every
// ratio 1, ppo_kl and the clip fractions 0 (one minibatch: the whole update).
TEST(TrueOnPolicy, TheFirstMinibatchRatiosAreExactlyOne) {
  auto m = tiny_model(5);
  std::mt19937 rng(3);
  std::vector<std::vector<int64_t>> prompts, responses;
  std::vector<std::vector<float>> logprobs;
  engine_config c;
  c.batch_invariant = true;
  auto e = make_engine(m, c);
  std::vector<generate_request> reqs;
  for (int i = 0; i < 16; ++i)
    reqs.push_back(request("r" + std::to_string(i),
                           prompt_of(rng, 2 + static_cast<int64_t>(rng() % 8)),
                           static_cast<uint64_t>(i)));
  auto outs = e->generate(reqs);
  ASSERT_TRUE(outs);
  for (size_t i = 0; i < outs->size(); ++i) {
    prompts.push_back(reqs[i].prompt);
    responses.push_back((*outs)[i].samples[0].tokens);
    logprobs.push_back((*outs)[i].samples[0].logprobs);
  }
  auto batch = rl::collate_sequences(prompts, responses, 0);
  ASSERT_TRUE(batch);
  auto mask = batch->get("response_mask").value();
  auto width = batch->get("input_ids").value().size(1);
  ASSERT_TRUE(batch->set("old_log_probs", rl::scatter_response_values(prompts, logprobs, width)));
  torch::manual_seed(1);
  ASSERT_TRUE(batch->set("advantages", torch::randn(mask.sizes()) * mask));
  for (int64_t minibatches : {1, 4}) {
    SCOPED_TRACE(std::to_string(minibatches) + " minibatches");
    auto trainer = invariant_trainer(m);
    train::policy_update_options o;
    o.minibatches = minibatches;
    o.temperature = kTemperature;
    auto metrics = trainer->update_policy(*batch, o);
    ASSERT_TRUE(metrics) << describe(metrics.error());
    EXPECT_EQ(metrics->at("actor/first_minibatch/logprob_abs_diff_max"), 0.0);
    EXPECT_EQ(metrics->at("actor/first_minibatch/logprob_abs_diff_mean"), 0.0);
    EXPECT_EQ(metrics->at("actor/first_minibatch/ppo_kl"), 0.0);
    if (minibatches == 1) {
      EXPECT_EQ(metrics->at("actor/ppo_kl"), 0.0);
      EXPECT_EQ(metrics->at("actor/pg_clipfrac"), 0.0);
    } else {
      EXPECT_NE(metrics->at("actor/ppo_kl"), 0.0) << "later minibatches follow a step";
    }
    EXPECT_GT(metrics->at("actor/grad_norm"), 0.0) << "the gradient flows";
  }
}

TEST(TrueOnPolicy, AnEngineOrTrainerThatCannotRunItIsRefused) {
  auto m = tiny_model(6);
  m->to(torch::kBFloat16);
  engine_config c;
  c.batch_invariant = true;
  c.num_blocks = 16;
  auto e = engine::make(m, c);
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("engine.batch_invariant"), std::string::npos)
      << describe(e.error());
}
