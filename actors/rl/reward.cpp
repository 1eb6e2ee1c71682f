#include "actors/rl/reward.hpp"

#include "models/tokenizer.hpp"
#include "runtime/torch_guard.hpp"

#include <caf/all.hpp>

#include <torch/torch.h>

#include <chrono>

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
  reward_spec spec;
  std::shared_ptr<const models::tokenizer> tok;
  std::shared_ptr<train::train_engine> model;
  bool fail_next = false;
  static inline const char* name = "reward";
};

using self_ptr = reward_actor::stateful_pointer<reward_state>;

expected<runtime::tensor_batch> score(reward_state& st, const reward_request& req) {
  runtime::tensor_batch out;
  auto n = static_cast<int64_t>(req.responses.size());
  auto total = torch::zeros({n}, torch::kFloat);
  if (st.spec.kind != reward_kind::model) {
    auto rs = rule_scores(*st.tok, st.spec.rule, req.responses, req.answers);
    if (!rs)
      return rs.error();
    auto t = torch::tensor(std::vector<float>(rs->begin(), rs->end()), torch::kFloat);
    total = total + st.spec.rule_weight * t;
    if (auto ok = out.set("rule_scores", t); !ok)
      return ok.error();
  }
  if (st.spec.kind != reward_kind::rule) {
    auto ms = st.model->scores(req.batch);
    if (!ms)
      return ms.error();
    auto t = ms->get("scores");
    if (!t)
      return t.error();
    if (t->size(0) != n)
      return make_error(errc::shape_mismatch, "reward model scored " + std::to_string(t->size(0)) +
                                                  " rows for " + std::to_string(n) + " responses");
    total = total + st.spec.model_weight * *t;
    if (auto ok = out.set("model_scores", *t); !ok)
      return ok.error();
  }
  if (auto ok = out.set("scores", total); !ok)
    return ok.error();
  return out;
}

reward_actor::behavior_type behavior(self_ptr self, reward_state init) {
  self->state = std::move(init);
  self->set_exception_handler([](std::exception_ptr& ep) -> caf::error {
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      return make_error(errc::internal, e.what());
    } catch (...) {
      return make_error(errc::internal, "reward: unknown exception");
    }
  });
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
        auto& st = self->state;
        if (!st.model)
          return train::served_bytes{};
        auto t0 = std::chrono::steady_clock::now();
        auto freed = train::release_engine(*st.model, dir, "reward");
        if (!freed)
          return with_prefix(freed.error(), "reward: release");
        return train::served_bytes{*freed, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
      },
      [=](train::inject_failure_atom) { self->state.fail_next = true; },
  };
}

} // namespace

expected<reward_actor> spawn_reward(caf::actor_system& sys, const reward_spec& spec,
                                    std::shared_ptr<const models::tokenizer> tok,
                                    std::unique_ptr<train::train_engine> model) {
  if (static_cast<size_t>(spec.kind) >= enum_count<reward_kind>())
    return make_error(errc::invalid_argument, "reward: unknown kind");
  if (spec.kind != reward_kind::rule && !model)
    return make_error(errc::invalid_argument,
                      "reward: kind '" + std::string{to_string(spec.kind)} + "' needs a reward model");
  if (spec.kind != reward_kind::model && !tok)
    return make_error(errc::invalid_argument, "reward: the rule needs a tokenizer");
  reward_state st;
  st.spec = spec;
  st.tok = std::move(tok);
  st.model = std::move(model);
  return sys.spawn<caf::detached>(behavior, std::move(st));
}

} // namespace troupe::actors::rl
