#include "actors/rl/reward.hpp"

#include "actors/exceptions.hpp"

#include "models/tokenizer.hpp"
#include "runtime/torch_guard.hpp"

#include <caf/all.hpp>

#include <torch/torch.h>

#include <chrono>
#include <set>

namespace troupe::actors::rl {

expected<std::string> response_text(const models::tokenizer& tok,
                                    const std::vector<int64_t>& tokens) {
  std::vector<int64_t> cut;
  cut.reserve(tokens.size());
  auto eos = tok.eos_id();
  for (auto t : tokens) {
    if (eos && t == *eos)
      break;
    cut.push_back(t);
  }
  models::decode_options opts;
  opts.skip_special_tokens = true;
  return tok.decode(cut, opts);
}

expected<std::vector<double>> rule_scores(const models::tokenizer& tok, rule_kind rule,
                                          const std::vector<std::vector<int64_t>>& responses,
                                          const std::vector<std::string>& answers) {
  if (responses.size() != answers.size())
    return make_error(errc::invalid_argument, "rule_scores: " + std::to_string(responses.size()) +
                                                  " responses for " +
                                                  std::to_string(answers.size()) + " answers");
  std::vector<double> out;
  out.reserve(responses.size());
  for (size_t i = 0; i < responses.size(); ++i) {
    auto text = response_text(tok, responses[i]);
    if (!text)
      return with_prefix(text.error(), "response " + std::to_string(i));
    out.push_back(rule_score(rule, answers[i], *text));
  }
  return out;
}

namespace {

struct reward_state {
  std::vector<weighted_backend> backends;
  bool fail_next = false;
  static inline const char* name = "reward";
};

using self_ptr = reward_actor::stateful_pointer<reward_state>;

// Σ weight · scores over the backends, in order; each backend's own too.
expected<runtime::tensor_batch> score(reward_state& st, const reward_request& req) {
  runtime::tensor_batch out;
  auto n = static_cast<int64_t>(req.responses.size());
  auto total = torch::zeros({n}, torch::kFloat);
  for (auto& [backend, weight] : st.backends) {
    auto key = std::string{backend->key()};
    auto t = backend->score(req);
    if (!t)
      return with_prefix(t.error(), key);
    if (t->dim() != 1 || t->size(0) != n)
      return make_error(errc::shape_mismatch, key + ": " + std::to_string(t->numel()) + " scores for " +
                                                std::to_string(n) + " responses");
    auto scores = t->to(torch::kFloat);
    total = total + weight * scores;
    if (auto ok = out.set(key, scores); !ok)
      return ok.error();
  }
  if (auto ok = out.set("scores", total); !ok)
    return ok.error();
  return out;
}

reward_actor::behavior_type behavior(self_ptr self, reward_state init) {
  self->state = std::move(init);
  self->set_exception_handler([](std::exception_ptr& ep) { return error_of_exception(ep, ""); });
  return {
      [=](reward_atom, const reward_request& req) -> caf::result<train::served_batch> {
        auto& st = self->state;
        if (st.fail_next) {
          st.fail_next = false;
          throw std::runtime_error("reward: score: injected failure");
        }
        auto t0 = std::chrono::steady_clock::now();
        auto r = guarded("score", [&] { return score(st, req); });
        auto busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!r)
          return with_prefix(r.error(), "reward");
        return train::served_batch{std::move(*r), busy};
      },
      [=](actors::release_atom, const std::string& dir) -> caf::result<train::served_bytes> {
        auto t0 = std::chrono::steady_clock::now();
        int64_t freed = 0;
        for (auto& [backend, weight] : self->state.backends) {
          auto b = backend->release(dir);
          if (!b)
            return with_prefix(b.error(), "reward: release: " + std::string{backend->key()});
          freed += *b;
        }
        return train::served_bytes{freed, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
      },
      [=](train::inject_failure_atom) { self->state.fail_next = true; },
  };
}

} // namespace

expected<reward_actor> spawn_reward(caf::actor_system& sys, std::vector<weighted_backend> backends) {
  if (backends.empty())
    return make_error(errc::invalid_argument, "reward: no backend");
  std::set<std::string_view> keys;
  for (const auto& b : backends) {
    if (!b.backend)
      return make_error(errc::invalid_argument, "reward: an empty backend");
    if (b.backend->key() == "scores" || !keys.insert(b.backend->key()).second)
      return make_error(errc::invalid_argument,
                        "reward: backend key '" + std::string{b.backend->key()} + "' is taken");
  }
  reward_state st;
  st.backends = std::move(backends);
  return sys.spawn<caf::detached>(behavior, std::move(st));
}

} // namespace troupe::actors::rl
