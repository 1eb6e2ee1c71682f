#include "cluster/remote_reward.hpp"

#include "actors/rl/job_config.hpp"
#include "actors/rl/reward.hpp"
#include "cluster/agent_host.hpp"
#include "cluster/remote_environment.hpp"
#include "cluster/service_client.hpp"
#include "models/tokenizer.hpp"
#include "runtime/metric_name.hpp"

#include "troupe/v1/reward.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>

namespace troupe::cluster {

namespace {

using actors::rl::remote_service_config;
using actors::rl::reward_request;

// What one call answered, checked against its samples.
struct call_result {
  std::vector<double> scores;
  std::vector<std::vector<double>> token_scores;
  std::vector<std::map<std::string, double>> extra;
};

// Whether `v` is finite in fp32, what troupe keeps scores in (a finite
// double beyond FLT_MAX would become infinite).
bool finite_in_fp32(double v) {
  return std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max();
}

// One sample's answer, checked (NOTE [remote reward]): `response_tokens`
// token scores or none, every number finite in fp32, the extras' names
// usable as metric names.
expected<void> check_score(const v1::SampleScore& s, int response_tokens) {
  if (!finite_in_fp32(s.score()))
    return make_error(errc::corrupted, "a score that is not a finite fp32 number (" +
                                           std::to_string(s.score()) + ")");
  if (s.token_scores_size() != 0 && s.token_scores_size() != response_tokens)
    return make_error(errc::corrupted, std::to_string(s.token_scores_size()) +
                                           " token scores for " + std::to_string(response_tokens) +
                                           " response tokens");
  for (int k = 0; k < s.token_scores_size(); ++k)
    if (!finite_in_fp32(s.token_scores(k)))
      return make_error(errc::corrupted,
                        "token score " + std::to_string(k) + " is not a finite fp32 number");
  if (s.extra_size() > static_cast<int>(max_reward_extras))
    return make_error(errc::corrupted, std::to_string(s.extra_size()) + " extras (at most " +
                                           std::to_string(max_reward_extras) + ")");
  for (const auto& [name, v] : s.extra()) {
    if (auto why = runtime::peer_metric_name_why(name); !why.empty())
      return make_error(errc::corrupted, "extra: " + why);
    if (!finite_in_fp32(v))
      return make_error(errc::corrupted, "extra '" + name + "' is not a finite fp32 number");
  }
  return {};
}

class remote_reward final : public actors::rl::reward_backend {
public:
  remote_reward(remote_service_config c, std::shared_ptr<const models::tokenizer> tok,
                std::string job, service_link link)
      : c_(std::move(c)), tok_(std::move(tok)), job_(std::move(job)), link_(std::move(link)),
        stub_(v1::RewardService::NewStub(link_.channel)) {}

  std::string_view key() const override { return "remote_scores"; }

  expected<at::Tensor> score(const reward_request& req) override {
    extras_ = {};
    auto samples = samples_of(req);
    if (!samples)
      return samples.error();
    auto results = run_calls(*samples);
    if (!results)
      return results.error();
    return collect(*samples, *results);
  }

  runtime::tensor_batch extras() override { return extras_; }

private:
  expected<std::vector<v1::ScoreSample>> samples_of(const reward_request& req) const;
  expected<std::vector<call_result>> run_calls(const std::vector<v1::ScoreSample>& samples);
  expected<call_result> call(const std::vector<v1::ScoreSample>& samples, size_t begin, size_t end,
                             size_t index, size_t calls);
  expected<call_result> call_once(const std::vector<v1::ScoreSample>& samples, size_t begin,
                                  size_t end, grpc::Status& status);
  expected<at::Tensor> collect(const std::vector<v1::ScoreSample>& samples,
                               const std::vector<call_result>& results);

  remote_service_config c_;
  std::shared_ptr<const models::tokenizer> tok_;
  std::string job_;
  service_link link_;
  std::unique_ptr<v1::RewardService::Stub> stub_;
  runtime::tensor_batch extras_;
};

expected<std::vector<v1::ScoreSample>> remote_reward::samples_of(const reward_request& req) const {
  std::vector<v1::ScoreSample> out(req.responses.size());
  for (size_t i = 0; i < out.size(); ++i) {
    auto& s = out[i];
    if (i < req.prompts.size()) {
      auto prompt = tok_->decode(req.prompts[i]);
      if (!prompt)
        return with_prefix(prompt.error(), "decoding prompt " + std::to_string(i));
      s.set_prompt(*prompt);
      s.mutable_prompt_ids()->Add(req.prompts[i].begin(), req.prompts[i].end());
    }
    auto response = actors::rl::response_text(*tok_, req.responses[i]);
    if (!response)
      return with_prefix(response.error(), "decoding response " + std::to_string(i));
    s.set_response(*response);
    s.mutable_response_ids()->Add(req.responses[i].begin(), req.responses[i].end());
    if (i < req.answers.size())
      s.set_answer(req.answers[i]);
    if (i < req.metadata.size())
      s.set_metadata_json(req.metadata[i]);
  }
  return out;
}

// The calls, up to max_in_flight at once (each a thread doing blocking
// calls); the first error stops the rest from starting.
expected<std::vector<call_result>>
remote_reward::run_calls(const std::vector<v1::ScoreSample>& samples) {
  auto per = static_cast<size_t>(c_.batch_size);
  size_t calls = (samples.size() + per - 1) / per;
  std::vector<call_result> results(calls);
  auto ok = in_flight(calls, c_.max_in_flight, [&](size_t k) -> expected<void> {
    auto r = call(samples, k * per, std::min(samples.size(), (k + 1) * per), k, calls);
    if (!r)
      return r.error();
    results[k] = std::move(*r);
    return {};
  });
  if (!ok)
    return ok.error();
  return results;
}

// One call with its retries.
expected<call_result> remote_reward::call(const std::vector<v1::ScoreSample>& samples, size_t begin,
                                          size_t end, size_t index, size_t calls) {
  auto what = "reward service " + c_.address + ": call " + std::to_string(index + 1) + " of " +
              std::to_string(calls) + " (" + std::to_string(end - begin) + " samples)";
  return call_with_retries<call_result>(
      c_, what, [&](grpc::Status& status) { return call_once(samples, begin, end, status); });
}

expected<call_result> remote_reward::call_once(const std::vector<v1::ScoreSample>& samples,
                                               size_t begin, size_t end, grpc::Status& status) {
  v1::ScoreRequest req;
  req.set_job(job_);
  for (size_t i = begin; i < end; ++i)
    *req.add_samples() = samples[i];
  grpc::ClientContext ctx;
  prepare_call(ctx, link_, c_.timeout_s);
  v1::ScoreResponse resp;
  status = stub_->Score(&ctx, req, &resp);
  if (!status.ok())
    return make_error(errc::unavailable, status.error_message());
  if (resp.scores_size() != static_cast<int>(end - begin))
    return make_error(errc::corrupted, "answered " + std::to_string(resp.scores_size()) +
                                           " scores for " + std::to_string(end - begin) +
                                           " samples");
  call_result out;
  for (int i = 0; i < resp.scores_size(); ++i) {
    const auto& s = resp.scores(i);
    const auto index = begin + static_cast<size_t>(i);
    if (auto ok = check_score(s, samples[index].response_ids_size()); !ok)
      return with_prefix(ok.error(), "sample " + std::to_string(index));
    out.scores.push_back(s.score());
    out.token_scores.emplace_back(s.token_scores().begin(), s.token_scores().end());
    out.extra.emplace_back(s.extra().begin(), s.extra().end());
  }
  return out;
}

// The scores [B]; the extras: "token_scores" [B, Lr] when any sample has
// them, "extra/<name>" [B] (0 where a sample lacks the name).
expected<at::Tensor> remote_reward::collect(const std::vector<v1::ScoreSample>& samples,
                                            const std::vector<call_result>& results) {
  auto n = static_cast<int64_t>(samples.size());
  std::vector<float> scores;
  std::vector<const std::vector<double>*> dense;
  std::map<std::string, std::vector<float>> extra;
  int64_t row = 0;
  for (const auto& r : results)
    for (size_t i = 0; i < r.scores.size(); ++i, ++row) {
      scores.push_back(static_cast<float>(r.scores[i]));
      dense.push_back(&r.token_scores[i]);
      for (const auto& [name, v] : r.extra[i]) {
        if (!extra.count(name) && extra.size() == max_reward_extras)
          return make_error(errc::corrupted, "reward service " + c_.address + ": more than " +
                                                 std::to_string(max_reward_extras) +
                                                 " extras' names in one batch");
        auto& column = extra[name];
        column.resize(static_cast<size_t>(n), 0.f);
        column[static_cast<size_t>(row)] = static_cast<float>(v);
      }
    }
  for (auto& [name, column] : extra)
    if (auto ok = extras_.set("extra/" + name, torch::tensor(column, torch::kFloat)); !ok)
      return ok.error();
  size_t width = 0;
  for (const auto* d : dense)
    width = std::max(width, d->size());
  if (width > 0) {
    auto t = torch::zeros({n, static_cast<int64_t>(width)}, torch::kFloat);
    auto a = t.accessor<float, 2>();
    for (int64_t i = 0; i < n; ++i)
      for (size_t k = 0; k < dense[static_cast<size_t>(i)]->size(); ++k)
        a[i][static_cast<int64_t>(k)] = static_cast<float>((*dense[static_cast<size_t>(i)])[k]);
    if (auto ok = extras_.set("token_scores", t); !ok)
      return ok.error();
  }
  return torch::tensor(scores, torch::kFloat);
}

} // namespace

expected<std::unique_ptr<actors::rl::reward_backend>>
make_remote_reward(const remote_service_config& c, std::shared_ptr<const models::tokenizer> tok,
                   std::string job) {
  auto link = open_service(c, "rl.reward.remote", "reward service");
  if (!link)
    return link.error();
  return std::unique_ptr<actors::rl::reward_backend>{
      std::make_unique<remote_reward>(c, std::move(tok), std::move(job), std::move(*link))};
}

actors::rl::role_factories process_factories() {
  actors::rl::role_factories f;
  f.remote_reward = [](const actors::rl::job_config& cfg,
                       std::shared_ptr<const models::tokenizer> tok) {
    return make_remote_reward(cfg.rl.reward.remote, std::move(tok), cfg.run.name);
  };
  f.remote_environment = [](const actors::rl::job_config& cfg) {
    return make_remote_environment(cfg.rl.environment.remote, cfg.run.name);
  };
  f.agent_endpoint = [](caf::actor_system& sys, caf::actor rollout,
                        std::shared_ptr<actors::rl::agent_book> book,
                        const actors::rl::agent_endpoint_spec& spec) {
    return make_agent_host(sys, std::move(rollout), std::move(book), spec);
  };
  return f;
}

} // namespace troupe::cluster
