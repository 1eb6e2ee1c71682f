// Fuzz target (NOTE [fuzz targets]): what a hostile environment service can
// answer (NOTE [remote environment], [episodes]). A real EnvironmentService
// on an ephemeral loopback port answers every call with this input, and
// troupe's client (make_remote_environment, as `rl.environment.kind:
// remote` makes it) resets three sessions or steps one through it over
// gRPC; what it answers then goes through the episode runner's checks and,
// where they pass, its rendering of observations into tokens.
//
// Input: byte 0 picks the call and the answer (0-2: Reset, 3-5: Step, OK
// with the response; 6, 7: Step failing with UNAVAILABLE or
// INVALID_ARGUMENT), byte 1 the client's batch_size (1 + byte % 3), the
// rest is a ResetResponse or StepResponse in protobuf's wire form (an
// unparsable one is answered as an empty response).
// Invariants: a call either fails with a named error (never `internal`) or
// answers one result per session asked, in order; each result either fails
// the runner's checks with `corrupted` or passes them, and then renders
// (first prompt or observation) to tokens of the vocabulary, or fails with
// a named error.
#include "actors/rl/episodes.hpp"
#include "actors/rl/job_config.hpp"
#include "cluster/remote_environment.hpp"
#include "models/tokenizer.hpp"
#include "tests/fuzz/fuzz_input.hpp"
#include "tests/fuzz/loopback_service.hpp"

#include "troupe/v1/environment.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

namespace {

using namespace troupe;

// The service: answers each call with the current input.
class scripted_service final : public v1::EnvironmentService::Service {
public:
  void answer_with(grpc::StatusCode code, std::string bytes) {
    std::lock_guard lock(mu_);
    code_ = code;
    bytes_ = std::move(bytes);
  }

  grpc::Status Reset(grpc::ServerContext*, const v1::ResetRequest*,
                     v1::ResetResponse* out) override {
    return answer(out);
  }
  grpc::Status Step(grpc::ServerContext*, const v1::StepRequest*, v1::StepResponse* out) override {
    return answer(out);
  }
  grpc::Status Close(grpc::ServerContext*, const v1::CloseRequest*, v1::CloseResponse*) override {
    return grpc::Status::OK;
  }

private:
  template <class M>
  grpc::Status answer(M* out) {
    std::lock_guard lock(mu_);
    if (code_ != grpc::StatusCode::OK)
      return {code_, "scripted failure"};
    if (!out->ParseFromString(bytes_))
      out->Clear();
    return grpc::Status::OK;
  }

  std::mutex mu_;
  grpc::StatusCode code_ = grpc::StatusCode::OK;
  std::string bytes_;
};

using environment_peer = fuzz::loopback_peer<scripted_service>;

// The client for calls of `batch_size` sessions (made once for each).
actors::rl::environment& client_for(const std::string& address, int64_t batch_size) {
  static std::unique_ptr<actors::rl::environment> made[3];
  auto& e = made[batch_size - 1];
  if (!e) {
    actors::rl::remote_service_config c;
    c.address = address;
    c.timeout_s = 5;
    c.retries = 1;
    c.backoff_s = 0.001;
    c.batch_size = batch_size;
    c.max_in_flight = 2;
    auto r = cluster::make_remote_environment(c, "fuzz");
    if (!r) {
      std::fprintf(stderr, "make_remote_environment: %s\n", describe(r.error()).c_str());
      fuzz::broken("the client could not be made");
    }
    e = std::move(*r);
  }
  return *e;
}

const actors::rl::prompt_encoder& encoder() {
  static const actors::rl::prompt_encoder enc{std::make_shared<models::byte_tokenizer>(), false};
  return enc;
}

void named(const caf::error& err, const char* what) {
  if (code_of(err) == errc::internal) {
    std::fprintf(stderr, "%s: %s\n", what, describe(err).c_str());
    fuzz::broken("an internal error");
  }
}

void in_vocabulary(const std::vector<int64_t>& ids) {
  for (auto id : ids)
    if (id < 0 || id >= models::byte_tokenizer::size)
      fuzz::broken("a rendered token outside the vocabulary");
}

void reset(actors::rl::environment& env) {
  std::vector<actors::rl::reset_task> tasks;
  for (const char* s : {"0/0/0", "0/0/1", "0/1/0"})
    tasks.push_back({s, {"add:1+2=", "3", "", "{}"}});
  auto got = env.reset(tasks);
  if (!got)
    return named(got.error(), "reset");
  if (got->size() != tasks.size())
    fuzz::broken("another number of results than sessions");
  for (size_t i = 0; i < tasks.size(); ++i) {
    const auto& r = (*got)[i];
    auto ok = actors::rl::check_reset_answer(r, tasks[i].session);
    if (!ok) {
      if (code_of(ok.error()) != errc::corrupted)
        fuzz::broken("a refused answer that is not `corrupted`");
      continue;
    }
    auto prompt = actors::rl::render_first_prompt(encoder(), r.first, r.tools);
    if (!prompt)
      named(prompt.error(), "first prompt");
    else
      in_vocabulary(*prompt);
  }
}

void step(actors::rl::environment& env) {
  actors::rl::env_turn t{"0/0/0", 1, "<tool_call>{}</tool_call>", "", {}, "stop", 3};
  t.calls.push_back({"call_1_1", "calculator", R"({"expression": "1+2"})"});
  auto got = env.step({t});
  if (!got)
    return named(got.error(), "step");
  if (got->size() != 1)
    fuzz::broken("another number of results than turns");
  const auto& r = got->front();
  auto ok = actors::rl::check_step_answer(r, t.session);
  if (!ok) {
    if (code_of(ok.error()) != errc::corrupted)
      fuzz::broken("a refused answer that is not `corrupted`");
    return;
  }
  if (r.done)
    return;
  auto obs = actors::rl::render_observation(encoder(), r.next, nlohmann::ordered_json::array());
  if (!obs)
    named(obs.error(), "observation");
  else
    in_vocabulary(*obs);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2)
    return 0;
  auto& peer = environment_peer::get();
  const int mode = data[0] % 8;
  static const grpc::StatusCode failures[] = {grpc::StatusCode::UNAVAILABLE,
                                              grpc::StatusCode::INVALID_ARGUMENT};
  peer.service.answer_with(mode < 6 ? grpc::StatusCode::OK : failures[mode - 6],
                           std::string(reinterpret_cast<const char*>(data + 2), size - 2));
  auto& env = client_for(peer.address, 1 + data[1] % 3);
  if (mode < 3)
    reset(env);
  else
    step(env);
  return 0;
}
