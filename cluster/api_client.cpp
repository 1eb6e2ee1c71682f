#include "cluster/api_client.hpp"

#include "cluster/api_server.hpp"
#include "cluster/grpc_status.hpp"
#include "cluster/job_proto.hpp"
#include "runtime/file_io.hpp"

#include "troupe/v1/job_service.grpc.pb.h"

#include <grpcpp/grpcpp.h>

namespace troupe::cluster {

namespace j = actors::job;

namespace {

caf::error error_of(const grpc::Status& st) {
  auto d = detail_of(st);
  if (d.violations.size() > 1)
    return make_error_list(d.code, d.violations);
  return make_error(d.code, grpc_status_name(st.error_code()) + ": " + d.message);
}

} // namespace

struct api_client::impl {
  client_options opt;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::JobService::Stub> stub;

  void prepare(grpc::ClientContext& ctx, bool bounded) const {
    ctx.AddMetadata("authorization", "Bearer " + opt.token);
    if (!opt.user.empty())
      ctx.AddMetadata("x-troupe-user", opt.user);
    if (bounded)
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_s * 1000)));
  }

  template <class Req, class Method>
  expected<job_view> job_call(Method m, const Req& req) {
    grpc::ClientContext ctx;
    prepare(ctx, true);
    v1::Job resp;
    auto st = (stub.get()->*m)(&ctx, req, &resp);
    if (!st.ok())
      return error_of(st);
    return from_proto(resp);
  }
};

api_client::api_client(api_client&&) noexcept = default;
api_client& api_client::operator=(api_client&&) noexcept = default;
api_client::~api_client() = default;

expected<std::shared_ptr<grpc::Channel>> open_channel(const client_options& o) {
  auto addr = parse_listen_address(o.address);
  if (!addr)
    return with_prefix(addr.error(), o.peer + " address");
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!o.ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    auto ca = runtime::read_file(o.ca_file);
    if (!ca)
      return with_prefix(ca.error(), "TLS CA");
    ssl.pem_root_certs = *ca;
    if (!o.cert_file.empty()) {
      auto cert = runtime::read_file(o.cert_file);
      auto key = runtime::read_file(o.key_file);
      if (!cert || !key)
        return make_error(errc::io_error, "TLS client certificate or key: cannot read " + o.cert_file +
                                              " / " + o.key_file);
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    creds = grpc::SslCredentials(ssl);
  } else {
    if (!is_loopback_host(addr->first))
      return make_error(errc::invalid_argument,
                        o.peer + " address " + o.address +
                            " is not loopback: give the CA of its TLS certificate (" + o.ca_hint +
                            ") so that no secret crosses the network in clear text");
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return grpc::CreateCustomChannel(o.address, creds, args);
}

expected<api_client> api_client::connect(const client_options& o) {
  auto channel = open_channel(o);
  if (!channel)
    return channel.error();
  if (o.token.empty())
    return make_error(errc::invalid_argument,
                      "no API token: pass --token-file, set TROUPE_TOKEN_FILE, or run on the "
                      "controller's machine (its state dir holds the token)");
  api_client c;
  c.impl_ = std::make_unique<impl>();
  c.impl_->opt = o;
  c.impl_->channel = *channel;
  c.impl_->stub = v1::JobService::NewStub(c.impl_->channel);
  return c;
}

expected<std::vector<node_view>> api_client::nodes() {
  grpc::ClientContext ctx;
  impl_->prepare(ctx, true);
  v1::ListNodesResponse resp;
  auto st = impl_->stub->ListNodes(&ctx, v1::ListNodesRequest{}, &resp);
  if (!st.ok())
    return error_of(st);
  std::vector<node_view> out;
  for (const auto& n : resp.nodes()) {
    auto v = from_proto(n);
    if (!v)
      return v.error();
    out.push_back(std::move(*v));
  }
  return out;
}

expected<job_view> api_client::submit(const submit_request& r) {
  v1::SubmitJobRequest req;
  req.mutable_spec()->set_name(r.spec_name);
  req.mutable_spec()->set_text(r.spec_text);
  for (const auto& [name, text] : r.bases) {
    auto* b = req.add_bases();
    b->set_name(name), b->set_text(text);
  }
  for (const auto& o : r.overrides)
    req.add_overrides(o);
  req.set_name(r.name);
  return impl_->job_call(&v1::JobService::Stub::SubmitJob, req);
}

expected<std::vector<job_view>> api_client::list(const std::vector<ctl_state>& states, int32_t limit) {
  v1::ListJobsRequest req;
  for (auto s : states)
    req.add_states(to_proto(s));
  req.set_limit(limit);
  grpc::ClientContext ctx;
  impl_->prepare(ctx, true);
  v1::ListJobsResponse resp;
  auto st = impl_->stub->ListJobs(&ctx, req, &resp);
  if (!st.ok())
    return error_of(st);
  std::vector<job_view> out;
  for (const auto& jb : resp.jobs()) {
    auto v = from_proto(jb);
    if (!v)
      return v.error();
    out.push_back(std::move(*v));
  }
  return out;
}

expected<job_view> api_client::get(const std::string& id) {
  v1::JobRef req;
  req.set_id(id);
  return impl_->job_call(&v1::JobService::Stub::GetJob, req);
}

expected<job_view> api_client::cancel(const std::string& id, bool now) {
  v1::CancelJobRequest req;
  req.set_id(id);
  req.set_now(now);
  return impl_->job_call(&v1::JobService::Stub::CancelJob, req);
}

expected<job_view> api_client::pause(const std::string& id) {
  v1::JobRef req;
  req.set_id(id);
  return impl_->job_call(&v1::JobService::Stub::PauseJob, req);
}

expected<job_view> api_client::resume(const std::string& id) {
  v1::JobRef req;
  req.set_id(id);
  return impl_->job_call(&v1::JobService::Stub::ResumeJob, req);
}

expected<job_view> api_client::checkpoint(const std::string& id) {
  v1::JobRef req;
  req.set_id(id);
  return impl_->job_call(&v1::JobService::Stub::CheckpointJob, req);
}

expected<job_view> api_client::update(const std::string& id,
                                      const std::vector<std::pair<std::string, std::string>>& settings) {
  v1::UpdateJobRequest req;
  req.set_id(id);
  for (const auto& [k, v] : settings) {
    auto* s = req.add_settings();
    s->set_key(k), s->set_value(v);
  }
  return impl_->job_call(&v1::JobService::Stub::UpdateJob, req);
}

expected<std::vector<metric_point>> api_client::metrics(const std::string& id,
                                                        const std::vector<std::string>& keys,
                                                        const std::string& stage, int64_t from_step,
                                                        int64_t to_step) {
  v1::GetMetricsRequest req;
  req.set_id(id);
  for (const auto& k : keys)
    req.add_keys(k);
  req.set_stage(stage);
  req.set_from_step(from_step);
  req.set_to_step(to_step);
  grpc::ClientContext ctx;
  impl_->prepare(ctx, true);
  v1::GetMetricsResponse resp;
  auto st = impl_->stub->GetMetrics(&ctx, req, &resp);
  if (!st.ok())
    return error_of(st);
  std::vector<metric_point> out;
  for (const auto& p : resp.points())
    out.push_back({p.stage(), p.step(), p.time_us(), {p.values().begin(), p.values().end()}});
  return out;
}

expected<job_view> api_client::watch(const std::string& id, int64_t from_seq,
                                     const std::function<void(const j::event&)>& on_event) {
  v1::WatchJobRequest req;
  req.set_id(id);
  req.set_from_seq(from_seq);
  grpc::ClientContext ctx;
  impl_->prepare(ctx, false);
  auto reader = impl_->stub->WatchJob(&ctx, req);
  v1::WatchJobResponse msg;
  std::optional<job_view> final;
  caf::error bad;
  while (reader->Read(&msg)) {
    if (msg.has_event()) {
      auto e = from_proto(msg.event());
      if (!e) {
        bad = e.error();
        ctx.TryCancel();
        break;
      }
      on_event(*e);
    } else if (msg.has_final()) {
      auto v = from_proto(msg.final());
      if (!v)
        bad = v.error();
      else
        final = std::move(*v);
    }
  }
  auto st = reader->Finish();
  if (bad)
    return bad;
  if (!st.ok())
    return error_of(st);
  if (!final)
    return make_error(errc::process_failed, "the watch of " + id + " ended without the job's final state");
  return *final;
}

expected<void> api_client::logs(const std::string& id, int32_t lines, bool follow,
                                const std::function<void(const log_entry&)>& on_line) {
  v1::TailLogsRequest req;
  req.set_id(id);
  req.set_lines(lines);
  req.set_follow(follow);
  grpc::ClientContext ctx;
  impl_->prepare(ctx, false);
  auto reader = impl_->stub->TailLogs(&ctx, req);
  v1::LogLine msg;
  while (reader->Read(&msg))
    on_line({msg.seq(), msg.time_us(), msg.level(), msg.text()});
  auto st = reader->Finish();
  if (!st.ok())
    return error_of(st);
  return {};
}

} // namespace troupe::cluster
