#include "cluster/remote_reward.hpp"

#include "actors/rl/job_config.hpp"
#include "actors/rl/reward.hpp"
#include "cluster/api_client.hpp"
#include "cluster/grpc_status.hpp"
#include "models/tokenizer.hpp"
#include "runtime/file_io.hpp"

#include "troupe/v1/reward.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

namespace troupe::cluster {

namespace {

using actors::rl::remote_reward_config;
using actors::rl::reward_request;

bool retryable(grpc::StatusCode c) {
  return c == grpc::StatusCode::UNAVAILABLE || c == grpc::StatusCode::DEADLINE_EXCEEDED ||
         c == grpc::StatusCode::RESOURCE_EXHAUSTED || c == grpc::StatusCode::ABORTED;
}

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
    if (auto why = reward_extra_name_why(name); !why.empty())
      return make_error(errc::corrupted, "extra: " + why);
    if (!finite_in_fp32(v))
      return make_error(errc::corrupted, "extra '" + name + "' is not a finite fp32 number");
  }
  return {};
}

class remote_reward final : public actors::rl::reward_backend {
public:
  remote_reward(remote_reward_config c, std::shared_ptr<const models::tokenizer> tok,
                std::string job, std::string token, std::shared_ptr<grpc::Channel> channel)
      : c_(std::move(c)), tok_(std::move(tok)), job_(std::move(job)), token_(std::move(token)),
        stub_(v1::RewardService::NewStub(channel)), channel_(std::move(channel)) {}

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

  remote_reward_config c_;
  std::shared_ptr<const models::tokenizer> tok_;
  std::string job_;
  std::string token_;
  std::unique_ptr<v1::RewardService::Stub> stub_;
  std::shared_ptr<grpc::Channel> channel_;
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
  std::vector<expected<call_result>> results(calls, make_error(errc::internal, "not called"));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    for (size_t k = next++; k < calls && !failed; k = next++) {
      results[k] = call(samples, k * per, std::min(samples.size(), (k + 1) * per), k, calls);
      if (!results[k])
        failed = true;
    }
  };
  std::vector<std::thread> threads;
  auto n = std::min(calls, static_cast<size_t>(c_.max_in_flight));
  for (size_t t = 1; t < n; ++t)
    threads.emplace_back(worker);
  worker();
  for (auto& t : threads)
    t.join();
  std::vector<call_result> out;
  for (auto& r : results) {
    if (!r)
      return r.error();
    out.push_back(std::move(*r));
  }
  return out;
}

// One call with its retries.
expected<call_result> remote_reward::call(const std::vector<v1::ScoreSample>& samples, size_t begin,
                                          size_t end, size_t index, size_t calls) {
  auto what = "reward service " + c_.address + ": call " + std::to_string(index + 1) + " of " +
              std::to_string(calls) + " (" + std::to_string(end - begin) + " samples)";
  grpc::Status status;
  int64_t attempts = 0;
  for (; attempts <= c_.retries; ++attempts) {
    if (attempts > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(
          c_.backoff_s * std::pow(2.0, static_cast<double>(attempts - 1))));
    auto r = call_once(samples, begin, end, status);
    if (r)
      return r;
    if (status.ok()) // answered, but wrongly: no retry
      return with_prefix(r.error(), what);
    if (!retryable(status.error_code()))
      break;
  }
  auto tries = std::min(attempts + 1, c_.retries + 1);
  auto code = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? errc::timeout
              : status.error_code() == grpc::StatusCode::UNAVAILABLE     ? errc::unavailable
                                                                         : detail_of(status).code;
  return make_error(code, what + ": " + grpc_status_name(status.error_code()) + ": " +
                              status.error_message() + " after " + std::to_string(tries) +
                              (tries == 1 ? " attempt" : " attempts"));
}

expected<call_result> remote_reward::call_once(const std::vector<v1::ScoreSample>& samples,
                                               size_t begin, size_t end, grpc::Status& status) {
  v1::ScoreRequest req;
  req.set_job(job_);
  for (size_t i = begin; i < end; ++i)
    *req.add_samples() = samples[i];
  grpc::ClientContext ctx;
  if (!token_.empty())
    ctx.AddMetadata("authorization", "Bearer " + token_);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(c_.timeout_s * 1000)));
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

std::string reward_extra_name_why(std::string_view name) {
  if (name.empty() || name.size() > max_reward_extra_name)
    return "a name of " + std::to_string(name.size()) + " bytes (1 to " +
           std::to_string(max_reward_extra_name) + ")";
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && c != '_' && c != '.' && c != '-' && c != '/')
      return "byte " + std::to_string(i) + " of a name is " + std::to_string(c) +
             " (letters, digits and _ . - / only)";
  }
  return "";
}

expected<std::unique_ptr<actors::rl::reward_backend>>
make_remote_reward(const remote_reward_config& c, std::shared_ptr<const models::tokenizer> tok,
                   std::string job) {
  std::string token;
  if (!c.token_file.empty()) {
    auto t = runtime::read_file(c.token_file);
    if (!t)
      return with_prefix(t.error(), "rl.reward.remote.token_file");
    token = *t;
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' '))
      token.pop_back();
  }
  client_options o;
  o.address = c.address;
  o.ca_file = c.ca_file;
  o.cert_file = c.cert_file;
  o.key_file = c.key_file;
  o.peer = "reward service";
  o.ca_hint = "rl.reward.remote.ca_file";
  auto channel = open_channel(o);
  if (!channel)
    return with_prefix(channel.error(), "rl.reward.remote");
  return std::unique_ptr<actors::rl::reward_backend>{std::make_unique<remote_reward>(
      c, std::move(tok), std::move(job), std::move(token), std::move(*channel))};
}

actors::rl::role_factories process_factories() {
  actors::rl::role_factories f;
  f.remote_reward = [](const actors::rl::job_config& cfg,
                       std::shared_ptr<const models::tokenizer> tok) {
    return make_remote_reward(cfg.rl.reward.remote, std::move(tok), cfg.run.name);
  };
  return f;
}

} // namespace troupe::cluster
