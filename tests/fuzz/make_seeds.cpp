// Writes the seed corpora that only troupe's own C++ can make
// (NOTE [fuzz targets]): role_messages — one message of each registered
// type, in CAF's binary form, as a worker link carries it; job_service and
// node_service — requests and agent messages in protobuf's wire form, in
// the targets' input layout; reward_service — a reward service's answers;
// environment_service — an environment service's.
//   troupe_fuzz_make_seeds <tests/fuzz/corpus>
#include "actors/actor_system.hpp"
#include "actors/inference/rollout.hpp"
#include "actors/job/events.hpp"
#include "actors/rl/reward.hpp"
#include "actors/train/engine_actor.hpp"
#include "actors/weight_channel.hpp"
#include "cluster/job_nodes.hpp"
#include "cluster/workers.hpp"
#include "runtime/file_io.hpp"
#include "runtime/tensor_batch.hpp"

#include "troupe/v1/environment.pb.h"
#include "troupe/v1/job_service.pb.h"
#include "troupe/v1/node_service.pb.h"
#include "troupe/v1/reward.pb.h"

#include <caf/all.hpp>
#include <caf/binary_serializer.hpp>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

using namespace troupe;

namespace {

caf::actor_system_config& config() {
  static caf::actor_system_config cfg = [] {
    caf::actor_system_config c;
    actors::configure(c);
    cluster::configure_network(c);
    return c;
  }();
  return cfg;
}

runtime::tensor_batch sample_batch() {
  runtime::tensor_batch b;
  (void)b.set("input_ids", torch::arange(12, torch::kLong).reshape({3, 4}));
  (void)b.set("mask", torch::ones({3, 4}, torch::kBool));
  (void)b.set("advantages", torch::linspace(-1, 1, 3, torch::kFloat));
  (void)b.set("logprobs", torch::zeros({3, 3}, torch::kBFloat16));
  return b;
}

// A message's bytes with its maps' entries in key order (the default order
// varies from run to run, and the seeds are generated again).
std::string bytes_of(const google::protobuf::Message& m) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream{&out};
    google::protobuf::io::CodedOutputStream coded{&stream};
    coded.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&coded);
  }
  return out;
}

void write_bytes(const std::filesystem::path& file, const std::string& bytes) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream{file, std::ios::binary}.write(bytes.data(), static_cast<long>(bytes.size()));
}

// JobService: the first byte is the method (its index in the target) plus
// 12 × the credentials (0 the token, 1 a wrong one, 2 none).
void job_service_seeds(const std::filesystem::path& dir, const std::string& quickstart) {
  auto put = [&](const std::string& name, int method, int creds,
                 const google::protobuf::Message& m) {
    write_bytes(dir / name, std::string(1, static_cast<char>(method + 12 * creds)) + bytes_of(m));
  };
  troupe::v1::ListJobsRequest list;
  list.add_states(troupe::v1::JOB_STATE_RUNNING);
  list.set_limit(5);
  put("list", 0, 0, list);
  put("list-wrong-token", 0, 1, list);
  troupe::v1::JobRef ref;
  ref.set_id("job-000001");
  put("get", 1, 0, ref);
  put("get-no-token", 1, 2, ref);
  troupe::v1::WatchJobRequest watch;
  watch.set_id("job-000001");
  watch.set_from_seq(3);
  put("watch", 2, 0, watch);
  troupe::v1::GetMetricsRequest metrics;
  metrics.set_id("job-000001");
  metrics.add_keys("rl/reward_mean");
  metrics.set_stage("rl");
  put("metrics", 3, 0, metrics);
  troupe::v1::TailLogsRequest logs;
  logs.set_id("job-000001");
  logs.set_lines(20);
  put("logs", 4, 0, logs);
  put("nodes", 5, 0, troupe::v1::ListNodesRequest{});
  troupe::v1::SubmitJobRequest submit;
  submit.mutable_spec()->set_name("quickstart.yaml");
  submit.mutable_spec()->set_text(quickstart);
  submit.add_overrides("rl.iterations=1");
  submit.set_name("fuzz");
  put("submit", 6, 0, submit);
  put("submit-wrong-token", 6, 1, submit);
  troupe::v1::SubmitJobRequest based;
  based.mutable_spec()->set_name("job.yaml");
  based.mutable_spec()->set_text("base: base.yaml\nrl:\n  iterations: 2\n");
  auto* b = based.add_bases();
  b->set_name("base.yaml");
  b->set_text(quickstart);
  put("submit-with-base", 6, 0, based);
  troupe::v1::CancelJobRequest cancel;
  cancel.set_id("job-000001");
  cancel.set_now(true);
  put("cancel", 7, 0, cancel);
  put("pause", 8, 0, ref);
  put("resume", 9, 0, ref);
  put("checkpoint", 10, 0, ref);
  troupe::v1::UpdateJobRequest update;
  update.set_id("job-000001");
  auto* set = update.add_settings();
  set->set_key("rl.kl.coef");
  set->set_value("0.05");
  put("update", 11, 0, update);
  put("update-no-token", 11, 2, update);
}

// NodeService: the credentials (0 the secret, 1 a wrong one, 2 none), then
// each agent message as a 2-byte little-endian length and its bytes.
void node_service_seeds(const std::filesystem::path& dir) {
  auto put = [&](const std::string& name, int creds,
                 const std::vector<troupe::v1::AgentMessage>& msgs) {
    std::string out(1, static_cast<char>(creds));
    for (const auto& m : msgs) {
      auto b = bytes_of(m);
      out += static_cast<char>(b.size() & 0xff);
      out += static_cast<char>(b.size() >> 8);
      out += b;
    }
    write_bytes(dir / name, out);
  };
  troupe::v1::AgentMessage hello;
  auto* h = hello.mutable_hello();
  h->set_name("node-a");
  h->set_advertise_host("127.0.0.1");
  h->mutable_resources()->set_cores(2);
  h->mutable_resources()->set_memory_bytes(int64_t{8} << 30);
  h->set_version("troupe");
  h->set_pid(4242);
  troupe::v1::AgentMessage beat;
  beat.mutable_heartbeat()->set_seq(1);
  troupe::v1::AgentMessage exited;
  auto* e = exited.mutable_worker_exited();
  e->set_job_id("job-000001");
  e->set_rank(1);
  e->set_pid(5151);
  e->set_signal(9);
  e->set_description("killed by signal 9");
  troupe::v1::AgentMessage leave;
  leave.mutable_leave()->set_reason("shutting down");
  put("join-beat-leave", 0, {hello, beat, beat, leave});
  put("worker-exited", 0, {hello, exited});
  put("wrong-secret", 1, {hello, beat});
  put("no-secret", 2, {hello});
}

// RewardService answers: the answer's mode, the client's batch size, then
// a ScoreResponse (the target scores "a", "bb", "ccc": responses of 2, 3
// and 4 tokens with EOS).
void reward_service_seeds(const std::filesystem::path& dir) {
  auto put = [&](const std::string& name, char mode, char batch,
                 const troupe::v1::ScoreResponse& r) {
    write_bytes(dir / name, std::string{mode, batch} + bytes_of(r));
  };
  troupe::v1::ScoreResponse plain;
  for (double v : {1.0, 0.0, 0.5})
    plain.add_scores()->set_score(v);
  put("scores", 0, 3, plain);
  put("scores-one-per-call", 0, 0, plain);
  troupe::v1::ScoreResponse rich = plain;
  int tokens = 2;
  for (auto& s : *rich.mutable_scores()) {
    for (int k = 0; k < tokens; ++k)
      s.add_token_scores(0.1 * k);
    (*s.mutable_extra())["format_ok"] = 1;
    (*s.mutable_extra())["length/tokens"] = tokens++;
  }
  put("token-scores-and-extras", 0, 3, rich);
  troupe::v1::ScoreResponse one;
  one.add_scores()->set_score(1);
  put("one-score-per-call", 0, 0, one);
  put("unavailable", 5, 3, plain);
  put("invalid-argument", 6, 3, plain);
}

// EnvironmentService answers: the call and answer, the client's batch
// size, then a ResetResponse (for sessions 0/0/0, 0/0/1, 0/1/0) or a
// StepResponse (for session 0/0/0's turn 1).
void environment_service_seeds(const std::filesystem::path& dir) {
  auto put = [&](const std::string& name, char mode, char batch, const std::string& bytes) {
    write_bytes(dir / name, std::string{mode, batch} + bytes);
  };
  troupe::v1::ResetResponse reset;
  for (const char* s : {"0/0/0", "0/0/1", "0/1/0"}) {
    auto* r = reset.add_results();
    r->set_session_id(s);
    r->mutable_observation()->set_text("add:1+2=");
    r->add_tools_json(R"({"type": "function", "function": {"name": "calculator", "parameters": )"
                      R"({"type": "object", "properties": {"expression": {"type": "string"}}}}})");
  }
  put("reset", 0, 2, bytes_of(reset));
  put("reset-one-per-call", 1, 0, bytes_of(reset));
  troupe::v1::ResetResponse chat = reset;
  for (auto& r : *chat.mutable_results()) {
    r.mutable_observation()->clear_text();
    auto* m = r.mutable_observation()->add_messages();
    m->set_role("user");
    m->set_content("What is 1 + 2?");
  }
  put("reset-messages", 2, 2, bytes_of(chat));
  troupe::v1::StepResponse tool;
  auto* r = tool.add_results();
  r->set_session_id("0/0/0");
  auto* m = r->mutable_observation()->add_messages();
  m->set_role("tool");
  m->set_name("calculator");
  m->set_tool_call_id("call_1_1");
  m->set_content("3");
  r->set_reward(0.1);
  (*r->mutable_info())["tool_calls"] = 1;
  put("step-tool-result", 3, 0, bytes_of(tool));
  troupe::v1::StepResponse done;
  auto* d = done.add_results();
  d->set_session_id("0/0/0");
  d->set_done(true);
  d->set_reward(1);
  put("step-done", 4, 0, bytes_of(done));
  troupe::v1::StepResponse text;
  auto* t = text.add_results();
  t->set_session_id("0/0/0");
  t->mutable_observation()->set_text("[1:3]");
  put("step-text", 5, 0, bytes_of(text));
  put("step-unavailable", 6, 0, bytes_of(text));
  put("step-invalid-argument", 7, 0, bytes_of(text));
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus folder>\n", argv[0]);
    return 2;
  }
  caf::actor_system sys{config()};
  const auto dir = std::filesystem::path{argv[1]} / "role_messages";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, caf::message m) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    if (auto err = sink(m)) {
      std::fprintf(stderr, "cannot serialise %s\n", name.c_str());
      std::exit(1);
    }
    std::ofstream{dir / name, std::ios::binary}.write(buf.data(), static_cast<long>(buf.size()));
  };
  actors::inference::generate_request req;
  req.id = "p0-s1";
  req.prompt = {1, 17, 42, 9};
  req.sampling.temperature = 0.7;
  req.sampling.max_tokens = 8;
  write("tensor_batch", caf::make_message(sample_batch()));
  write("empty_batch", caf::make_message(runtime::tensor_batch{}));
  write("generate_requests",
        caf::make_message(std::vector<actors::inference::generate_request>{req, req}));
  write("request_outputs", caf::make_message(std::vector<actors::inference::request_output>(1)));
  write("engine_metrics", caf::make_message(actors::inference::engine_metrics{}));
  write("metric_map", caf::make_message(runtime::metric_map{{"loss", 0.25}}));
  write("policy_update_options", caf::make_message(actors::train::policy_update_options{}));
  write("critic_update_options", caf::make_message(actors::train::critic_update_options{}));
  write("dpo_step_options", caf::make_message(actors::train::dpo_step_options{}));
  write("reward_request", caf::make_message(actors::rl::reward_request{}));
  write("weight_channel", caf::make_message(actors::weight_channel{}));
  write("job_event", caf::make_message(actors::job::event{}));
  write("worker_entry", caf::make_message(cluster::worker_entry{}));
  write("batch_and_int", caf::make_message(sample_batch(), int64_t{3}, std::string{"rollout"}));
  auto quickstart = runtime::read_file(TROUPE_SOURCE_DIR "/configs/quickstart.yaml");
  if (!quickstart) {
    std::fprintf(stderr, "cannot read configs/quickstart.yaml\n");
    return 1;
  }
  job_service_seeds(std::filesystem::path{argv[1]} / "job_service", *quickstart);
  node_service_seeds(std::filesystem::path{argv[1]} / "node_service");
  reward_service_seeds(std::filesystem::path{argv[1]} / "reward_service");
  environment_service_seeds(std::filesystem::path{argv[1]} / "environment_service");
  return 0;
}
