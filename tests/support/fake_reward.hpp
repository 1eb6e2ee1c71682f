#pragma once
// A reward backend for tests (NOTE [reward backends]): scores each response
// by a function of its tokens, counts its calls and releases, and fails on
// demand. Shared state, so a test keeps a view after handing it over.

#include "actors/rl/reward_backend.hpp"

#include <ATen/ATen.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

namespace troupe::test {

struct fake_reward_state {
  std::atomic<int> scored{0};
  std::atomic<int> released{0};
  std::atomic<bool> fail_next{false};
};

class fake_reward final : public actors::rl::reward_backend {
public:
  using score_fn = std::function<float(const std::vector<int64_t>& response)>;
  fake_reward(std::string key, score_fn fn, std::shared_ptr<fake_reward_state> state)
      : key_(std::move(key)), fn_(std::move(fn)), state_(std::move(state)) {}

  std::string_view key() const override { return key_; }
  expected<at::Tensor> score(const actors::rl::reward_request& req) override {
    if (state_->fail_next.exchange(false))
      return make_error(errc::unavailable, "the service went away");
    ++state_->scored;
    std::vector<float> out;
    for (const auto& r : req.responses)
      out.push_back(fn_(r));
    return at::tensor(out, at::kFloat);
  }
  expected<int64_t> release(const std::string&) override {
    ++state_->released;
    return int64_t{4096};
  }

private:
  std::string key_;
  score_fn fn_;
  std::shared_ptr<fake_reward_state> state_;
};

} // namespace troupe::test
