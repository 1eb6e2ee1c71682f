#include "actors/rl/data.hpp"
#include "actors/train/train_engine.hpp"
#include "tests/actors/tiny_engine.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <limits>

using namespace troupe;
using namespace troupe::actors;
using troupe::actors::inference::testing::greedy;
using troupe::actors::inference::testing::make_engine;
using troupe::actors::inference::testing::random_sampling;
using troupe::actors::inference::testing::tiny_config;
using troupe::actors::inference::testing::tiny_model;
using troupe::actors::inference::testing::copy_of;
using troupe::actors::inference::testing::fixed_batch;

namespace {

std::unique_ptr<train::train_engine> trainer(models::llama_model m,
                                             std::optional<train::optimizer_options> o = {}) {
  auto e = train::train_engine::make(std::move(m), o);
  EXPECT_TRUE(e) << describe(e.error());
  return std::move(*e);
}

} // namespace

// The engine's sampled-token log-probs (paged KV, continuous batching) and the
// policy's teacher-forced forward over the same sequences agree: this is what
// makes rollout/logprob_diff small and old log-probs interchangeable.
TEST(TrainEngine, LogProbsMatchTheInferenceEngine) {
  auto model = tiny_model(3);
  auto eng = make_engine(copy_of(model, models::head_kind::lm));
  std::vector<inference::generate_request> reqs;
  for (int i = 0; i < 6; ++i) {
    inference::generate_request r;
    r.id = std::to_string(i);
    r.prompt = {1, 2 + i, 3, 4 + i};
    r.sampling = random_sampling(8, 100 + static_cast<uint64_t>(i));
    r.sampling.ignore_eos = true;
    reqs.push_back(r);
  }
  auto outs = eng->generate(reqs);
  ASSERT_TRUE(outs) << describe(outs.error());
  std::vector<std::vector<int64_t>> prompts, responses;
  std::vector<std::vector<float>> lps;
  for (auto& o : *outs) {
    prompts.push_back(o.prompt);
    responses.push_back(o.samples[0].tokens);
    lps.push_back(o.samples[0].logprobs);
  }
  auto batch = actors::rl::collate_sequences(prompts, responses, 0);
  ASSERT_TRUE(batch);
  auto t = trainer(model);
  auto lp = t->log_probs(*batch, 0.9, true);
  ASSERT_TRUE(lp) << describe(lp.error());
  auto mine = *lp->get("log_probs");
  auto theirs = actors::rl::scatter_response_values(prompts, lps, mine.size(1) + 1);
  auto mask = *batch->get("response_mask");
  EXPECT_GT(mask.sum().item<double>(), 40);
  auto diff = ((mine - theirs).abs() * mask).max().item<double>();
  EXPECT_LT(diff, 1e-5);
  EXPECT_TRUE(lp->contains("entropy"));
  EXPECT_GT(((*lp->get("entropy")) * mask).sum().item<double>(), 0);
}

TEST(TrainEngine, SftReducesTheLossOnItsBatch) {
  train::optimizer_options o;
  o.lr = 3e-3;
  auto t = trainer(tiny_model(4), o);
  auto batch = fixed_batch(8, 1);
  auto first = t->sft_step(batch);
  ASSERT_TRUE(first) << describe(first.error());
  double last = 0;
  for (int i = 0; i < 30; ++i) {
    auto m = t->sft_step(batch);
    ASSERT_TRUE(m);
    last = m->at("sft/loss");
  }
  EXPECT_LT(last, first->at("sft/loss") * 0.7);
  EXPECT_EQ(t->steps(), 31);
  EXPECT_GT(first->at("sft/grad_norm"), 0);
}

TEST(TrainEngine, WarmupRampsTheLearningRate) {
  train::optimizer_options o;
  o.lr = 1e-3;
  o.warmup_steps = 4;
  auto t = trainer(tiny_model(4), o);
  auto batch = fixed_batch(4, 2);
  std::vector<double> lrs;
  for (int i = 0; i < 6; ++i)
    lrs.push_back(t->sft_step(batch)->at("sft/lr"));
  EXPECT_DOUBLE_EQ(lrs[0], 0.25e-3);
  EXPECT_DOUBLE_EQ(lrs[1], 0.5e-3);
  EXPECT_DOUBLE_EQ(lrs[3], 1e-3);
  EXPECT_DOUBLE_EQ(lrs[5], 1e-3);
}

// With positive advantages on every response token, a PPO step makes those
// tokens more likely (and the clip fraction starts at 0: ratio 1).
TEST(TrainEngine, PolicyUpdateFollowsTheAdvantages) {
  train::optimizer_options o;
  o.lr = 1e-3;
  auto t = trainer(tiny_model(5), o);
  auto batch = fixed_batch(8, 3);
  auto before = t->log_probs(batch, 1.0, false);
  ASSERT_TRUE(before);
  auto old = *before->get("log_probs");
  auto mask = *batch.get("response_mask");
  ASSERT_TRUE(batch.set("old_log_probs", old));
  ASSERT_TRUE(batch.set("advantages", mask.clone()));
  train::policy_update_options po;
  po.minibatches = 2;
  po.epochs = 2;
  auto m = t->update_policy(batch, po);
  ASSERT_TRUE(m) << describe(m.error());
  EXPECT_EQ(t->steps(), 4);
  for (const char* key : {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy",
                          "actor/grad_norm", "actor/lr"})
    EXPECT_TRUE(m->count(key)) << key;
  auto after = *t->log_probs(batch, 1.0, false)->get("log_probs");
  auto gain = ((after - old) * mask).sum() / mask.sum();
  EXPECT_GT(gain.item<double>(), 0.0);
  // A KL loss needs the reference's log-probs.
  po.loss.kl_coef = 0.1;
  auto no_ref = t->update_policy(batch, po);
  ASSERT_FALSE(no_ref);
  EXPECT_NE(describe(no_ref.error()).find("ref_log_probs"), std::string::npos)
      << describe(no_ref.error());
}

TEST(TrainEngine, CriticMovesValuesTowardsReturns) {
  train::optimizer_options o;
  o.lr = 3e-3;
  auto t = trainer(copy_of(tiny_model(6), models::head_kind::value), o);
  auto batch = fixed_batch(8, 4);
  auto mask = *batch.get("response_mask");
  auto v0 = *t->values(batch)->get("values");
  ASSERT_TRUE(batch.set("values", v0));
  ASSERT_TRUE(batch.set("returns", mask * 0.5));
  auto err = [&](const at::Tensor& v) {
    return (((v - 0.5) * mask).pow(2).sum() / mask.sum()).item<double>();
  };
  train::critic_update_options co;
  co.value_clip = 0; // unclipped: free to move
  co.minibatches = 2;
  for (int i = 0; i < 10; ++i)
    ASSERT_TRUE(t->update_critic(batch, co));
  auto v1 = *t->values(batch)->get("values");
  EXPECT_LT(err(v1), err(v0) * 0.5);
}

TEST(TrainEngine, RewardModelLearnsPreferences) {
  train::optimizer_options o;
  o.lr = 3e-3;
  auto t = trainer(copy_of(tiny_model(7), models::head_kind::reward), o);
  // chosen rows end in token 5, rejected rows in token 9.
  std::vector<std::vector<int64_t>> chosen, rejected;
  for (int i = 0; i < 8; ++i) {
    chosen.push_back({1, 2 + i, 3, 5});
    rejected.push_back({1, 2 + i, 3, 9, 9});
  }
  auto b = actors::rl::collate_pairs(chosen, rejected, 0);
  ASSERT_TRUE(b);
  auto before = t->rm_eval(*b);
  ASSERT_TRUE(before);
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(t->rm_step(*b));
  auto after = t->rm_eval(*b);
  ASSERT_TRUE(after);
  EXPECT_DOUBLE_EQ(after->at("rm/eval_accuracy"), 1.0);
  EXPECT_LT(after->at("rm/eval_loss"), before->at("rm/eval_loss"));
}

// NOTE [token micro-batches]: preference pairs of different lengths under a
// token budget (a pair's two sequences both count) train as the whole
// batch at once does.
TEST(TrainEngine, RewardModelTokenMicroBatchesLearnAsTheWholeBatch) {
  std::vector<std::vector<int64_t>> chosen, rejected;
  for (int i = 0; i < 6; ++i) {
    chosen.push_back(std::vector<int64_t>(static_cast<size_t>(2 + i), 3 + i));
    rejected.push_back(std::vector<int64_t>(static_cast<size_t>(7 - i), 9));
  }
  auto b = actors::rl::collate_pairs(chosen, rejected, 0);
  ASSERT_TRUE(b);
  train::optimizer_options o;
  o.lr = 3e-3;
  auto whole = trainer(copy_of(tiny_model(7), models::head_kind::reward), o);
  auto micro = trainer(copy_of(tiny_model(7), models::head_kind::reward), o);
  ASSERT_TRUE(micro->set_micro_batch_tokens(20));
  for (int i = 0; i < 3; ++i) {
    auto a = whole->rm_step(*b);
    auto m = micro->rm_step(*b);
    ASSERT_TRUE(a && m);
    for (const auto& [k, v] : *a)
      EXPECT_NEAR(m->at(k), v, 1e-5) << k;
  }
  auto ea = whole->rm_eval(*b), em = micro->rm_eval(*b);
  ASSERT_TRUE(ea && em);
  for (const auto& [k, v] : *ea)
    EXPECT_NEAR(em->at(k), v, 1e-5) << k;
  EXPECT_FALSE(micro->set_micro_batch_tokens(-1));
}

// NOTE [flat AdamW]: the engine's AdamW over the flat parameters steps as
// torch::optim::AdamW does per parameter (decoupled weight decay, bias
// corrections): three SFT steps from the same weights agree to float
// rounding with a reference written with LibTorch's optimizer.
TEST(TrainEngine, FlatAdamWStepsAsTorchAdamW) {
  auto base = tiny_model(5);
  train::optimizer_options o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  o.grad_clip = 0; // the clip has its own tests
  auto engine = train::train_engine::make(copy_of(base, models::head_kind::lm), o);
  ASSERT_TRUE(engine) << describe(engine.error());
  auto ref = copy_of(base, models::head_kind::lm);
  ref->train();
  torch::optim::AdamWOptions ao(o.lr);
  ao.betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay);
  torch::optim::AdamW adam(ref->parameters(), ao);
  for (int step = 0; step < 3; ++step) {
    auto batch = fixed_batch(4, 40 + static_cast<uint64_t>(step));
    ASSERT_TRUE((*engine)->sft_step(batch));
    // The engine's SFT loss: the mean NLL of the response tokens.
    adam.zero_grad();
    auto ids = batch.get("input_ids").value();
    auto logits = ref->forward(ids, batch.get("attention_mask").value());
    auto lp = torch::log_softmax(logits.narrow(1, 0, logits.size(1) - 1), -1)
                  .gather(-1, ids.narrow(1, 1, ids.size(1) - 1).unsqueeze(-1))
                  .squeeze(-1);
    auto mask = batch.get("response_mask").value().to(torch::kFloat);
    auto loss = -(lp * mask).sum() / mask.sum();
    loss.backward();
    adam.step();
  }
  auto got = (*engine)->export_weights();
  auto want = models::export_hf_weights(ref);
  // Within 1e-5 of torch's weights after 3 steps of lr 3e-3 (an update's
  // size): the engine's gradients and torch's differ in the last bits
  // (their forwards sum in other orders, and OpenBLAS picks its kernels by
  // CPU: 2.3e-6 on an AMD Zen 5, under 1e-6 on Zen 4), and AdamW scales a
  // near-zero gradient's moments up to a whole step. A wrong AdamW (a bias
  // correction or eps misplaced) is off by a fraction of lr.
  for (const auto& [name, t] : want)
    EXPECT_LT((got.at(name) - t).abs().max().item<double>(), 1e-5) << name;
}

TEST(TrainEngine, StateRoundTripsExactly) {
  train::optimizer_options o;
  auto a = trainer(tiny_model(8), o);
  auto batch = fixed_batch(4, 5);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(a->sft_step(batch));
  auto state = a->save_state();
  ASSERT_TRUE(state) << describe(state.error());
  auto b = trainer(tiny_model(9), o); // other weights, fresh optimizer
  ASSERT_TRUE(b->load_state(*state));
  EXPECT_EQ(b->steps(), 3);
  // The next steps (Adam moments included) are bit-identical.
  auto ma = a->sft_step(batch), mb = b->sft_step(batch);
  ASSERT_TRUE(ma && mb);
  EXPECT_EQ(ma->at("sft/loss"), mb->at("sft/loss"));
  auto wa = a->export_weights(), wb = b->export_weights();
  for (const auto& [name, w] : wa)
    EXPECT_TRUE(torch::equal(w, wb.at(name))) << name;
  // A state of another shape is refused.
  auto cfg = tiny_config();
  cfg.hidden_size = 64;
  auto other = models::make_llama(cfg, models::head_kind::lm);
  ASSERT_TRUE(other);
  auto c = trainer(*other, o);
  EXPECT_FALSE(c->load_state(*state));
  EXPECT_FALSE(c->load_state("not a state"));
}

TEST(TrainEngine, FrozenEnginesRefuseUpdatesAndHeadsAreChecked) {
  auto t = trainer(tiny_model(10));
  auto batch = fixed_batch(4, 6);
  auto r = t->sft_step(batch);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("no optimizer"), std::string::npos);
  EXPECT_FALSE(t->values(batch));
  EXPECT_FALSE(t->scores(batch));
  runtime::tensor_batch missing;
  ASSERT_TRUE(missing.set("input_ids", *batch.get("input_ids")));
  auto m = t->log_probs(missing, 1.0, false);
  ASSERT_FALSE(m);
  EXPECT_NE(describe(m.error()).find("attention_mask"), std::string::npos) << describe(m.error());
  // The temperature arrives as a bare double (NOTE [wire floats]).
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    auto lp = t->log_probs(batch, bad, false);
    ASSERT_FALSE(lp) << bad;
    EXPECT_NE(describe(lp.error()).find("temperature"), std::string::npos) << describe(lp.error());
  }
}

TEST(TrainEngine, FrozenWeightsOffloadAndComeBackExactly) {
  // Co-located offload of a reference / reward model: the weights go to a
  // file once and are freed; the next read of the model loads them back.
  test::temp_dir tmp;
  auto path = (tmp.path() / "reference.weights").string();
  auto t = trainer(tiny_model(11));
  auto batch = fixed_batch(4, 6);
  auto before = t->log_probs(batch, 1.0, false);
  ASSERT_TRUE(before) << describe(before.error());
  int64_t param_bytes = 0;
  for (const auto& p : t->model()->parameters())
    param_bytes += p.numel() * static_cast<int64_t>(p.element_size());

  auto freed = t->offload_weights(path);
  ASSERT_TRUE(freed) << describe(freed.error());
  EXPECT_EQ(*freed, param_bytes);
  EXPECT_TRUE(t->weights_offloaded());
  for (const auto& p : t->model()->parameters())
    EXPECT_EQ(p.numel(), 0);
  ASSERT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(*t->offload_weights(path), 0) << "already offloaded";

  for (int round = 0; round < 2; ++round) {
    auto after = t->log_probs(batch, 1.0, false);
    ASSERT_TRUE(after) << describe(after.error());
    EXPECT_FALSE(t->weights_offloaded());
    EXPECT_TRUE(torch::equal(*before->get("log_probs"), *after->get("log_probs")));
    // The weights never change: the second offload frees without rewriting.
    auto written = std::filesystem::last_write_time(path);
    ASSERT_TRUE(t->offload_weights(path));
    EXPECT_EQ(std::filesystem::last_write_time(path), written);
  }
  // Other entry points load them back too.
  auto exported = t->export_weights();
  EXPECT_FALSE(exported.empty());
  EXPECT_FALSE(t->weights_offloaded());
  // A trainer keeps its weights (its optimizer state is what it offloads).
  auto trained = trainer(tiny_model(12), train::optimizer_options{});
  EXPECT_EQ(*trained->offload_weights((tmp.path() / "policy.weights").string()), 0);
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "policy.weights"));
  // The file goes with the engine.
  t.reset();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TrainEngine, ADamagedWeightsFileIsAClearErrorNamingIt) {
  test::temp_dir tmp;
  auto path = (tmp.path() / "reward.weights").string();
  auto t = trainer(tiny_model(13));
  ASSERT_TRUE(t->offload_weights(path));
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  auto r = t->log_probs(fixed_batch(2, 4), 1.0, false);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find(path), std::string::npos) << describe(r.error());
  EXPECT_NE(describe(r.error()).find("reloading the offloaded weights"), std::string::npos)
    << describe(r.error());
}
