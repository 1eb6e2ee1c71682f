#include "cluster/remote_environment.hpp"

#include "actors/rl/job_config.hpp"
#include "cluster/service_client.hpp"

#include "troupe/v1/environment.grpc.pb.h"

#include <grpcpp/grpcpp.h>

namespace troupe::cluster {

namespace {

using actors::rl::env_turn;
using actors::rl::observation;
using actors::rl::remote_service_config;
using actors::rl::reset_result;
using actors::rl::reset_task;
using actors::rl::step_result;

observation from_proto(const v1::Observation& o) {
  observation out;
  out.text = o.text();
  for (const auto& m : o.messages())
    out.messages.push_back({m.role(), m.content(), m.name(), m.tool_call_id()});
  return out;
}

class remote_environment final : public actors::rl::environment {
public:
  remote_environment(remote_service_config c, std::string job, service_link link)
      : c_(std::move(c)), job_(std::move(job)), link_(std::move(link)),
        stub_(v1::EnvironmentService::NewStub(link_.channel)) {}

  std::string name() const override { return "remote " + c_.address; }

  expected<std::vector<reset_result>> reset(const std::vector<reset_task>& tasks) override;
  expected<std::vector<step_result>> step(const std::vector<env_turn>& turns) override;
  void close(const std::vector<std::string>& sessions, std::string_view reason) override;

private:
  std::string what(const std::string& call) const {
    return "environment service " + c_.address + ": " + call;
  }
  expected<std::vector<reset_result>> reset_once(const std::vector<reset_task>& tasks, size_t begin,
                                                 size_t end, grpc::Status& status);
  expected<std::vector<step_result>> step_once(const std::vector<env_turn>& turns,
                                               grpc::Status& status);

  remote_service_config c_;
  std::string job_;
  service_link link_;
  std::unique_ptr<v1::EnvironmentService::Stub> stub_;
};

// Every result answers the session asked, in order.
template <class Results>
expected<void> check_sessions(const Results& got, size_t expected_count,
                              const std::function<const std::string&(size_t)>& asked) {
  if (static_cast<size_t>(got.size()) != expected_count)
    return make_error(errc::corrupted, "answered " + std::to_string(got.size()) + " results for " +
                                           std::to_string(expected_count) + " sessions");
  for (size_t i = 0; i < expected_count; ++i)
    if (got[static_cast<int>(i)].session_id() != asked(i))
      return make_error(errc::corrupted, "result " + std::to_string(i) + " is for session '" +
                                             got[static_cast<int>(i)].session_id() + "', not '" +
                                             asked(i) + "'");
  return {};
}

expected<std::vector<reset_result>>
remote_environment::reset_once(const std::vector<reset_task>& tasks, size_t begin, size_t end,
                               grpc::Status& status) {
  v1::ResetRequest req;
  req.set_job(job_);
  for (size_t i = begin; i < end; ++i) {
    auto* t = req.add_tasks();
    t->set_session_id(tasks[i].session);
    t->set_prompt(tasks[i].row.prompt);
    t->set_messages_json(tasks[i].row.messages);
    t->set_answer(tasks[i].row.answer);
    t->set_metadata_json(tasks[i].row.metadata);
  }
  grpc::ClientContext ctx;
  prepare_call(ctx, link_, c_.timeout_s);
  v1::ResetResponse resp;
  status = stub_->Reset(&ctx, req, &resp);
  if (!status.ok())
    return make_error(errc::unavailable, status.error_message());
  if (auto ok =
          check_sessions(resp.results(), end - begin,
                         [&](size_t i) -> const std::string& { return tasks[begin + i].session; });
      !ok)
    return ok.error();
  std::vector<reset_result> out;
  for (const auto& r : resp.results()) {
    reset_result x{r.session_id(), from_proto(r.observation()), nlohmann::ordered_json::array()};
    for (int k = 0; k < r.tools_json_size(); ++k) {
      auto tool = nlohmann::ordered_json::parse(r.tools_json(k), nullptr, false);
      if (tool.is_discarded() || !tool.is_object())
        return make_error(errc::corrupted, "session '" + r.session_id() + "': tools_json[" +
                                               std::to_string(k) + "] is not a JSON object");
      x.tools.push_back(std::move(tool));
    }
    out.push_back(std::move(x));
  }
  return out;
}

expected<std::vector<reset_result>>
remote_environment::reset(const std::vector<reset_task>& tasks) {
  const auto per = static_cast<size_t>(c_.batch_size);
  const size_t calls = (tasks.size() + per - 1) / per;
  std::vector<std::vector<reset_result>> parts(calls);
  auto ok = in_flight(calls, c_.max_in_flight, [&](size_t k) -> expected<void> {
    const auto begin = k * per, end = std::min(tasks.size(), (k + 1) * per);
    auto r = call_with_retries<std::vector<reset_result>>(
        c_,
        what("reset: call " + std::to_string(k + 1) + " of " + std::to_string(calls) + " (" +
             std::to_string(end - begin) + " sessions)"),
        [&](grpc::Status& status) { return reset_once(tasks, begin, end, status); });
    if (!r)
      return r.error();
    parts[k] = std::move(*r);
    return {};
  });
  if (!ok)
    return ok.error();
  std::vector<reset_result> out;
  for (auto& p : parts)
    for (auto& r : p)
      out.push_back(std::move(r));
  return out;
}

expected<std::vector<step_result>> remote_environment::step_once(const std::vector<env_turn>& turns,
                                                                 grpc::Status& status) {
  v1::StepRequest req;
  req.set_job(job_);
  for (const auto& t : turns) {
    auto* p = req.add_turns();
    p->set_session_id(t.session);
    p->set_turn(t.turn);
    p->set_text(t.text);
    p->set_content(t.content);
    p->set_finish_reason(t.finish_reason);
    for (const auto& c : t.calls) {
      auto* call = p->add_tool_calls();
      call->set_id(c.id);
      call->set_name(c.name);
      call->set_arguments_json(c.arguments_json);
    }
  }
  grpc::ClientContext ctx;
  prepare_call(ctx, link_, c_.timeout_s);
  v1::StepResponse resp;
  status = stub_->Step(&ctx, req, &resp);
  if (!status.ok())
    return make_error(errc::unavailable, status.error_message());
  if (auto ok = check_sessions(resp.results(), turns.size(),
                               [&](size_t i) -> const std::string& { return turns[i].session; });
      !ok)
    return ok.error();
  std::vector<step_result> out;
  for (const auto& r : resp.results()) {
    step_result x;
    x.session = r.session_id();
    x.next = from_proto(r.observation());
    x.reward = r.reward();
    x.done = r.done();
    x.info.insert(r.info().begin(), r.info().end());
    out.push_back(std::move(x));
  }
  return out;
}

expected<std::vector<step_result>> remote_environment::step(const std::vector<env_turn>& turns) {
  return call_with_retries<std::vector<step_result>>(
      c_, what("step"), [&](grpc::Status& status) { return step_once(turns, status); });
}

void remote_environment::close(const std::vector<std::string>& sessions, std::string_view reason) {
  v1::CloseRequest req;
  for (const auto& s : sessions)
    req.add_session_ids(s);
  req.set_reason(std::string{reason});
  grpc::ClientContext ctx;
  prepare_call(ctx, link_, c_.timeout_s);
  v1::CloseResponse resp;
  (void)stub_->Close(&ctx, req, &resp);
}

} // namespace

expected<std::unique_ptr<actors::rl::environment>>
make_remote_environment(const remote_service_config& c, std::string job) {
  auto link = open_service(c, "rl.environment.remote", "environment service");
  if (!link)
    return link.error();
  return std::unique_ptr<actors::rl::environment>{
      std::make_unique<remote_environment>(c, std::move(job), std::move(*link))};
}

} // namespace troupe::cluster
