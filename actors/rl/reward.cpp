#include "actors/rl/reward.hpp"

#include "actors/exceptions.hpp"

#include "models/tokenizer.hpp"
#include "runtime/torch_guard.hpp"

#include <caf/all.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <set>

namespace troupe::actors::rl {

namespace {

// The tokens before the first EOS.
std::vector<int64_t> cut_at_eos(const models::tokenizer& tok, const std::vector<int64_t>& tokens) {
  auto eos = tok.eos_id();
  auto end = eos ? std::find(tokens.begin(), tokens.end(), *eos) : tokens.end();
  return {tokens.begin(), end};
}

expected<std::string> decode_text(const models::tokenizer& tok, const std::vector<int64_t>& cut) {
  models::decode_options opts;
  opts.skip_special_tokens = true;
  return tok.decode(cut, opts);
}

} // namespace

expected<std::string> response_text(const models::tokenizer& tok,
                                    const std::vector<int64_t>& tokens) {
  return decode_text(tok, cut_at_eos(tok, tokens));
}

expected<rule_outcome> apply_rules(const models::tokenizer& tok, const rule_set& rules,
                                   const std::vector<std::vector<int64_t>>& responses,
                                   const std::vector<std::string>& answers) {
  if (responses.size() != answers.size())
    return make_error(errc::invalid_argument, "apply_rules: " + std::to_string(responses.size()) +
                                                  " responses for " +
                                                  std::to_string(answers.size()) + " answers");
  rule_outcome out;
  out.scores.reserve(responses.size());
  out.correct.reserve(responses.size());
  for (size_t i = 0; i < responses.size(); ++i) {
    auto cut = cut_at_eos(tok, responses[i]);
    auto text = decode_text(tok, cut);
    if (!text)
      return with_prefix(text.error(), "response " + std::to_string(i));
    scored_response r{*text, static_cast<int64_t>(cut.size()), answers[i]};
    auto score = rules.score(r);
    auto correct = score ? rules.correct(r) : expected<bool>{score.error()};
    if (!correct)
      return with_prefix(correct.error(), "response " + std::to_string(i));
    out.scores.push_back(*score);
    out.correct.push_back(*correct ? 1.0 : 0.0);
    if (auto f = rules.formatted(r))
      out.formatted.push_back(*f ? 1.0 : 0.0);
  }
  return out;
}

namespace {

struct reward_state {
  std::vector<weighted_backend> backends;
  bool fail_next = false;
  actors::kill_switch kill; // NOTE [kill injection]
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
    auto extras = backend->extras();
    for (const auto& [name, x] : extras.tensors()) {
      auto scaled = name == "token_scores" ? x * weight : x;
      if (auto ok = out.set(name, scaled); !ok)
        return with_prefix(ok.error(), key);
    }
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
        if (st.kill.fire(self))
          return caf::delegated<train::served_batch>{};
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
      [=](actors::inject_kill_atom, bool whole) { self->state.kill.arm(whole); },
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
