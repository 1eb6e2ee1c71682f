// Fuzz target (NOTE [fuzz targets]): what a hostile reward service can
// answer (NOTE [remote reward]). A real RewardService on an ephemeral
// loopback port answers every call with this input, and troupe's client
// (make_remote_reward, as `rl.reward.kind: remote` makes it) scores three
// samples through it over gRPC.
//
// Input: byte 0 picks the answer (0-4: OK with the response; 5, 6, 7:
// UNAVAILABLE, INVALID_ARGUMENT, RESOURCE_EXHAUSTED), byte 1 the client's
// batch_size (1 + byte % 4), the rest is a ScoreResponse in protobuf's wire
// form (an unparsable one is answered as an empty response).
// Invariants: score() either fails with a named error (never `internal`)
// or gives one finite score per sample, finite token scores no wider than
// the longest response, and extras whose names pass
// runtime::peer_metric_name_why, no more than max_reward_extras of them.
#include "actors/rl/job_config.hpp"
#include "actors/rl/reward_backend.hpp"
#include "cluster/remote_reward.hpp"
#include "models/tokenizer.hpp"
#include "runtime/metric_name.hpp"
#include "tests/fuzz/fuzz_input.hpp"
#include "tests/fuzz/loopback_service.hpp"

#include "troupe/v1/reward.grpc.pb.h"

#include <grpcpp/grpcpp.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

namespace {

using namespace troupe;

// The service: answers each call with the current input.
class scripted_service final : public v1::RewardService::Service {
public:
  void answer_with(grpc::StatusCode code, v1::ScoreResponse resp) {
    std::lock_guard lock(mu_);
    code_ = code;
    resp_ = std::move(resp);
  }

  grpc::Status Score(grpc::ServerContext*, const v1::ScoreRequest*,
                     v1::ScoreResponse* out) override {
    std::lock_guard lock(mu_);
    if (code_ != grpc::StatusCode::OK)
      return {code_, "scripted failure"};
    *out = resp_;
    return grpc::Status::OK;
  }

private:
  std::mutex mu_;
  grpc::StatusCode code_ = grpc::StatusCode::OK;
  v1::ScoreResponse resp_;
};

using reward_peer = fuzz::loopback_peer<scripted_service>;

constexpr int64_t samples = 3;
constexpr int64_t longest_response = 4; // "ccc" and EOS

actors::rl::reward_request request_of(const models::tokenizer& tok) {
  actors::rl::reward_request r;
  const char* texts[samples] = {"a", "bb", "ccc"};
  for (const char* t : texts) {
    r.prompts.push_back(tok.encode(std::string{"q: "} + t));
    auto ids = tok.encode(t);
    ids.push_back(models::byte_tokenizer::eos_token);
    r.responses.push_back(ids);
    r.answers.push_back(t);
    r.metadata.push_back("{}");
  }
  return r;
}

bool all_finite(const at::Tensor& t) {
  return t.numel() == 0 || torch::isfinite(t).all().item<bool>();
}

void check_extras(const runtime::tensor_batch& extras) {
  size_t named = 0;
  for (const auto& [key, t] : extras.tensors()) {
    if (!all_finite(t) || t.size(0) != samples)
      fuzz::broken("an extra that is not finite, or not one per sample");
    if (key == "token_scores") {
      if (t.dim() != 2 || t.size(1) > longest_response)
        fuzz::broken("token scores wider than the responses");
      continue;
    }
    if (key.rfind("extra/", 0) != 0 ||
        !runtime::peer_metric_name_why(std::string_view{key}.substr(6)).empty())
      fuzz::broken("an extra's name that is not a metric name");
    ++named;
  }
  if (named > cluster::max_reward_extras)
    fuzz::broken("more extras than the bound");
}

// The client for calls of `batch_size` samples (made once for each: a
// channel's connection is not what is fuzzed).
actors::rl::reward_backend& backend_for(const std::string& address, int64_t batch_size,
                                        const std::shared_ptr<models::byte_tokenizer>& tok) {
  static std::unique_ptr<actors::rl::reward_backend> made[4];
  auto& b = made[batch_size - 1];
  if (!b) {
    actors::rl::remote_service_config c;
    c.address = address;
    c.timeout_s = 5;
    c.retries = 1;
    c.backoff_s = 0.001;
    c.batch_size = batch_size;
    c.max_in_flight = 2;
    auto r = cluster::make_remote_reward(c, tok, "fuzz");
    if (!r) { // (a loopback address without TLS is valid)
      std::fprintf(stderr, "make_remote_reward: %s\n", describe(r.error()).c_str());
      fuzz::broken("the client could not be made");
    }
    b = std::move(*r);
  }
  return *b;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2)
    return 0;
  static const auto tok = std::make_shared<models::byte_tokenizer>();
  auto& peer = reward_peer::get();
  static const grpc::StatusCode failures[] = {grpc::StatusCode::UNAVAILABLE,
                                              grpc::StatusCode::INVALID_ARGUMENT,
                                              grpc::StatusCode::RESOURCE_EXHAUSTED};
  const int mode = data[0] % 8;
  v1::ScoreResponse resp;
  if (!resp.ParseFromArray(data + 2, static_cast<int>(size - 2)))
    resp.Clear();
  peer.service.answer_with(mode < 5 ? grpc::StatusCode::OK : failures[mode - 5], std::move(resp));

  auto& backend = backend_for(peer.address, 1 + data[1] % 4, tok);
  auto scores = backend.score(request_of(*tok));
  if (!scores) {
    if (code_of(scores.error()) == errc::internal) {
      std::fprintf(stderr, "score: %s\n", describe(scores.error()).c_str());
      fuzz::broken("an internal error");
    }
    return 0;
  }
  if (scores->numel() != samples || !all_finite(*scores))
    fuzz::broken("scores that are not finite, or not one per sample");
  check_extras(backend.extras());
  return 0;
}
