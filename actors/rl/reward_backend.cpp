#include "actors/rl/reward_backend.hpp"

#include "actors/rl/reward.hpp"
#include "actors/train/engine_actor.hpp"
#include "actors/train/train_engine.hpp"
#include "models/tokenizer.hpp"

#include <torch/torch.h>

namespace troupe::actors::rl {

namespace {

class rule_backend final : public reward_backend {
public:
  rule_backend(std::shared_ptr<const models::tokenizer> tok, rule_set rules)
      : tok_(std::move(tok)), rules_(std::move(rules)) {}

  std::string_view key() const override { return "rule_scores"; }

  expected<at::Tensor> score(const reward_request& req) override {
    auto rs = apply_rules(*tok_, rules_, req.responses, req.answers);
    if (!rs)
      return rs.error();
    return torch::tensor(std::vector<float>(rs->scores.begin(), rs->scores.end()), torch::kFloat);
  }

private:
  std::shared_ptr<const models::tokenizer> tok_;
  rule_set rules_;
};

class model_backend final : public reward_backend {
public:
  explicit model_backend(std::unique_ptr<train::train_engine> model) : model_(std::move(model)) {}

  std::string_view key() const override { return "model_scores"; }

  expected<at::Tensor> score(const reward_request& req) override {
    auto ms = model_->scores(req.batch);
    if (!ms)
      return ms.error();
    auto t = ms->get("scores");
    if (!t)
      return t.error();
    return *t;
  }

  expected<int64_t> release(const std::string& dir) override {
    return train::release_engine(*model_, dir, "reward");
  }

private:
  std::unique_ptr<train::train_engine> model_;
};

} // namespace

std::unique_ptr<reward_backend> make_rule_backend(std::shared_ptr<const models::tokenizer> tok,
                                                  rule_set rules) {
  return std::make_unique<rule_backend>(std::move(tok), std::move(rules));
}

std::unique_ptr<reward_backend> make_model_backend(std::unique_ptr<train::train_engine> model) {
  return std::make_unique<model_backend>(std::move(model));
}

} // namespace troupe::actors::rl
