#include "cluster/api_server.hpp"

#include "cluster/credentials.hpp"

#include "cluster/grpc_status.hpp"
#include "cluster/job_proto.hpp"
#include "cluster/job_store.hpp"
#include "cluster/node_service.hpp"
#include "runtime/file_io.hpp"

#include "troupe/v1/job_service.grpc.pb.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>

namespace troupe::cluster {

namespace j = actors::job;

// ---- calls ---------------------------------------------------------------

namespace {


// Converts and filters a job's events into one stream's messages.
template <class Msg>
struct stream_policy {
  /// Fills `out` from `e`; false = not part of this stream.
  std::function<bool(const j::event& e, Msg* out)> convert;
  /// Fills the last message from the final job; false = none.
  std::function<bool(const job_view& v, Msg* out)> final_message;
  /// Only the last `keep_last` messages of what exists when the stream
  /// opens (0 = all).
  size_t keep_last = 0;
  /// Go on with live events (else the stream ends after what exists).
  bool follow = true;
};

// One server stream of a job's events (WatchJob, TailLogs). The cursor's
// wake callback and gRPC's reactions meet under the link's mutex; the link
// outlives the reactor so that a late wake finds it gone.
template <class Msg>
class event_stream final : public grpc::ServerWriteReactor<Msg> {
public:
  struct link {
    std::recursive_mutex mu;
    event_stream* stream = nullptr;
  };

  explicit event_stream(stream_policy<Msg> p) : policy_(std::move(p)), link_(std::make_shared<link>()) {
    link_->stream = this;
  }

  std::function<void()> waker() {
    return [l = std::weak_ptr<link>(link_)] {
      if (auto lk = l.lock()) {
        std::lock_guard lock{lk->mu};
        if (lk->stream)
          lk->stream->pump();
      }
    };
  }

  void start(std::unique_ptr<event_cursor> c) {
    std::lock_guard lock{link_->mu};
    cursor_ = std::move(c);
    pump();
  }

  void fail(const grpc::Status& st) { this->Finish(st); }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock{link_->mu};
    writing_ = false;
    if (!ok)
      return end(grpc::Status{grpc::StatusCode::CANCELLED, "the stream was closed"});
    pending_.pop_front();
    pump();
  }

  void OnCancel() override {
    std::lock_guard lock{link_->mu};
    cancelled_ = true;
    if (!writing_)
      end(grpc::Status{grpc::StatusCode::CANCELLED, "cancelled by the client"});
  }

  void OnDone() override {
    {
      std::lock_guard lock{link_->mu};
      link_->stream = nullptr;
    }
    delete this;
  }

private:
  // Writes the next message, fetching events when none is pending. Called
  // with the link's mutex held.
  void pump() {
    if (writing_ || finished_ || !cursor_)
      return;
    if (cancelled_)
      return end(grpc::Status{grpc::StatusCode::CANCELLED, "cancelled by the client"});
    if (first_) {
      first_ = false;
      if (policy_.keep_last > 0 || !policy_.follow)
        backlog();
    }
    while (pending_.empty() && !ending_) {
      auto b = cursor_->next(256);
      add(b.events);
      if (b.final)
        add_final(*b.final);
      else if (b.events.empty())
        return; // caught up: the waker calls again
    }
    if (!pending_.empty()) {
      writing_ = true;
      this->StartWrite(&pending_.front());
    } else if (ending_) {
      end(grpc::Status::OK);
    }
  }

  // What exists when the stream opens, trimmed to its last keep_last.
  void backlog() {
    std::optional<job_view> final;
    for (;;) {
      auto b = cursor_->next(4096);
      add(b.events);
      if (b.final) {
        final = std::move(b.final);
        break;
      }
      if (b.events.empty())
        break;
    }
    while (policy_.keep_last > 0 && pending_.size() > policy_.keep_last)
      pending_.pop_front();
    if (final)
      add_final(*final);
    if (!policy_.follow)
      ending_ = true;
  }

  void add(const std::vector<j::event>& events) {
    for (const auto& e : events) {
      Msg m;
      if (policy_.convert(e, &m))
        pending_.push_back(std::move(m));
    }
  }

  void add_final(const job_view& v) {
    Msg m;
    if (policy_.final_message(v, &m))
      pending_.push_back(std::move(m));
    ending_ = true;
  }

  void end(const grpc::Status& st) {
    if (finished_)
      return;
    finished_ = true;
    this->Finish(st);
  }

  stream_policy<Msg> policy_;
  std::shared_ptr<link> link_;
  std::unique_ptr<event_cursor> cursor_;
  std::deque<Msg> pending_;
  bool writing_ = false;
  bool ending_ = false;
  bool finished_ = false;
  bool cancelled_ = false;
  bool first_ = true;
};

} // namespace

// ---- the service ---------------------------------------------------------

struct api_server::impl final : v1::JobService::CallbackService {
  impl(controller& c, api_options o) : ctl(c), opt(std::move(o)) {}

  controller& ctl;
  api_options opt;
  std::unique_ptr<node_service> nodes;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

  grpc::Status authorize(const grpc::ServerContextBase* ctx) const {
    return check_bearer(ctx, opt.token, "token", "the token is in the controller's state dir");
  }

  // A mutating call's end: audited, then answered.
  void finish(grpc::ServerUnaryReactor* r, const grpc::ServerContextBase* ctx, const std::string& what,
              const std::string& target, const grpc::Status& st) {
    (void)ctl.store().audit({j::now_us(), caller_of(ctx), what, target.substr(0, 128), result_of(st)});
    r->Finish(st);
  }

  // Mutating calls answered with the job: authorize, run, audit, reply.
  template <class Run>
  grpc::ServerUnaryReactor* mutate(grpc::CallbackServerContext* ctx, std::string what,
                                   const std::string& target, v1::Job* resp, Run run) {
    auto* r = ctx->DefaultReactor();
    if (auto st = authorize(ctx); !st.ok()) {
      finish(r, ctx, what, target, st);
      return r;
    }
    run([this, r, ctx, what, target, resp](expected<job_view> v) {
      if (v)
        to_proto(*v, resp);
      finish(r, ctx, what, target, v ? grpc::Status::OK : to_grpc_status(v.error()));
    });
    return r;
  }

  // Read-only unary calls.
  template <class Run>
  grpc::ServerUnaryReactor* read(grpc::CallbackServerContext* ctx, Run run) {
    auto* r = ctx->DefaultReactor();
    auto st = authorize(ctx);
    r->Finish(st.ok() ? run() : st);
    return r;
  }

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx, const v1::SubmitJobRequest* req,
                                      v1::Job* resp) override {
    return mutate(ctx, "SubmitJob", req->spec().name(), resp, [&](controller::reply done) {
      submit_request s;
      s.spec_name = req->spec().name();
      s.spec_text = req->spec().text();
      for (const auto& b : req->bases())
        s.bases.emplace_back(b.name(), b.text());
      s.overrides.assign(req->overrides().begin(), req->overrides().end());
      s.name = req->name();
      s.submitter = caller_of(ctx);
      done(ctl.submit(s));
    });
  }

  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx, const v1::CancelJobRequest* req,
                                      v1::Job* resp) override {
    return mutate(ctx, req->now() ? "CancelJob --now" : "CancelJob", req->id(), resp,
                  [&](controller::reply done) { ctl.cancel(req->id(), req->now(), std::move(done)); });
  }

  grpc::ServerUnaryReactor* PauseJob(grpc::CallbackServerContext* ctx, const v1::JobRef* req,
                                     v1::Job* resp) override {
    return mutate(ctx, "PauseJob", req->id(), resp,
                  [&](controller::reply done) { ctl.pause(req->id(), std::move(done)); });
  }

  grpc::ServerUnaryReactor* ResumeJob(grpc::CallbackServerContext* ctx, const v1::JobRef* req,
                                      v1::Job* resp) override {
    return mutate(ctx, "ResumeJob", req->id(), resp,
                  [&](controller::reply done) { ctl.resume(req->id(), std::move(done)); });
  }

  grpc::ServerUnaryReactor* CheckpointJob(grpc::CallbackServerContext* ctx, const v1::JobRef* req,
                                          v1::Job* resp) override {
    return mutate(ctx, "CheckpointJob", req->id(), resp,
                  [&](controller::reply done) { ctl.checkpoint(req->id(), std::move(done)); });
  }

  grpc::ServerUnaryReactor* UpdateJob(grpc::CallbackServerContext* ctx, const v1::UpdateJobRequest* req,
                                      v1::Job* resp) override {
    std::string what = "UpdateJob";
    for (const auto& s : req->settings())
      what += " " + s.key().substr(0, 64) + "=" + s.value().substr(0, 64);
    return mutate(ctx, std::move(what), req->id(), resp, [&](controller::reply done) {
      std::vector<std::pair<std::string, std::string>> settings;
      for (const auto& s : req->settings())
        settings.emplace_back(s.key(), s.value());
      ctl.update(req->id(), std::move(settings), std::move(done));
    });
  }

  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::JobRef* req,
                                   v1::Job* resp) override {
    return read(ctx, [&] {
      auto v = ctl.get(req->id());
      if (!v)
        return to_grpc_status(v.error());
      to_proto(*v, resp);
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx, const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override {
    return read(ctx, [&] {
      std::vector<ctl_state> states;
      for (auto s : req->states()) {
        auto st = from_proto(static_cast<v1::JobState>(s));
        if (!st)
          return to_grpc_status(with_prefix(st.error(), "states"));
        states.push_back(*st);
      }
      for (const auto& v : ctl.list(states, req->limit()))
        to_proto(v, resp->add_jobs());
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* ctx, const v1::ListNodesRequest*,
                                      v1::ListNodesResponse* resp) override {
    return read(ctx, [&] {
      for (const auto& n : ctl.nodes().list())
        to_proto(n, resp->add_nodes());
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* ctx, const v1::GetMetricsRequest* req,
                                       v1::GetMetricsResponse* resp) override {
    return read(ctx, [&] { return metrics(*req, resp); });
  }

  grpc::Status metrics(const v1::GetMetricsRequest& req, v1::GetMetricsResponse* resp) {
    auto wanted = [&](const std::string& key) {
      if (req.keys().empty())
        return true;
      for (const auto& k : req.keys()) {
        bool prefix = !k.empty() && (k.back() == '/' || k.back() == '*');
        auto stem = k.back() == '*' ? k.substr(0, k.size() - 1) : k;
        if (prefix ? key.compare(0, stem.size(), stem) == 0 : key == k)
          return true;
      }
      return false;
    };
    auto done = each_event_so_far(ctl, req.id(), 1, [&](const j::event& e) {
      auto* m = std::get_if<j::metrics_reported>(&e.body);
      if (!m || (!req.stage().empty() && m->stage != req.stage()) ||
          (req.from_step() > 0 && m->step < req.from_step()) ||
          (req.to_step() > 0 && m->step > req.to_step()))
        return;
      v1::MetricPoint p;
      p.set_stage(m->stage), p.set_step(m->step), p.set_time_us(e.time_us);
      for (const auto& [k, v] : m->metrics)
        if (wanted(k))
          (*p.mutable_values())[k] = v;
      if (!p.values().empty())
        *resp->add_points() = std::move(p);
    });
    return done ? grpc::Status::OK : to_grpc_status(done.error());
  }

  grpc::ServerWriteReactor<v1::WatchJobResponse>* WatchJob(grpc::CallbackServerContext* ctx,
                                                           const v1::WatchJobRequest* req) override {
    stream_policy<v1::WatchJobResponse> p;
    p.convert = [](const j::event& e, v1::WatchJobResponse* out) {
      to_proto(e, out->mutable_event());
      return true;
    };
    p.final_message = [](const job_view& v, v1::WatchJobResponse* out) {
      to_proto(v, out->mutable_final());
      return true;
    };
    return open_stream<v1::WatchJobResponse>(ctx, req->id(), req->from_seq(), std::move(p));
  }

  grpc::ServerWriteReactor<v1::LogLine>* TailLogs(grpc::CallbackServerContext* ctx,
                                                  const v1::TailLogsRequest* req) override {
    stream_policy<v1::LogLine> p;
    p.convert = [](const j::event& e, v1::LogLine* m) {
      auto* l = std::get_if<j::log_line>(&e.body);
      if (!l)
        return false;
      m->set_seq(e.seq), m->set_time_us(e.time_us), m->set_level(l->level), m->set_text(l->text);
      return true;
    };
    p.final_message = [](const job_view&, v1::LogLine*) { return false; };
    p.keep_last = req->lines() > 0 ? static_cast<size_t>(req->lines()) : 0;
    p.follow = req->follow();
    return open_stream<v1::LogLine>(ctx, req->id(), 1, std::move(p));
  }

  template <class Msg>
  grpc::ServerWriteReactor<Msg>* open_stream(grpc::CallbackServerContext* ctx, const std::string& id,
                                             int64_t from, stream_policy<Msg> p) {
    auto* s = new event_stream<Msg>(std::move(p));
    if (auto st = authorize(ctx); !st.ok()) {
      s->fail(st);
      return s;
    }
    auto cur = ctl.watch(id, from, s->waker());
    if (!cur) {
      s->fail(to_grpc_status(cur.error()));
      return s;
    }
    s->start(std::move(*cur));
    return s;
  }
};

expected<std::unique_ptr<api_server>> api_server::start(controller& ctl, const api_options& o) {
  auto addr = parse_listen_address(o.listen);
  if (!addr)
    return addr.error();
  if (!is_loopback_host(addr->first) && !o.tls.enabled())
    return make_error(errc::invalid_argument,
                      "listen address '" + o.listen +
                          "' is not loopback: give a TLS certificate and key (--tls-cert, "
                          "--tls-key) to listen there; tokens never cross a network in clear text");
  if (o.tls.enabled() && (o.tls.cert_file.empty() || o.tls.key_file.empty()))
    return make_error(errc::invalid_argument, "TLS needs both a certificate and a key");
  if (o.token.size() < 16)
    return make_error(errc::invalid_argument, "the API token is shorter than 16 characters");
  if (!o.cluster_secret.empty() && o.cluster_secret.size() < 16)
    return make_error(errc::invalid_argument, "the cluster secret is shorter than 16 characters");
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (o.tls.enabled()) {
    grpc::SslServerCredentialsOptions ssl;
    auto cert = runtime::read_file(o.tls.cert_file);
    auto key = runtime::read_file(o.tls.key_file);
    if (!cert)
      return with_prefix(cert.error(), "TLS certificate");
    if (!key)
      return with_prefix(key.error(), "TLS key");
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!o.tls.client_ca_file.empty()) {
      auto ca = runtime::read_file(o.tls.client_ca_file);
      if (!ca)
        return with_prefix(ca.error(), "TLS client CA");
      ssl.pem_root_certs = *ca;
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  std::unique_ptr<api_server> s{new api_server};
  s->impl_ = std::make_unique<impl>(ctl, o);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder b;
  b.AddListeningPort(o.listen, creds, &s->impl_->port);
  b.RegisterService(s->impl_.get());
  if (!o.cluster_secret.empty()) {
    s->impl_->nodes = std::make_unique<node_service>(ctl.nodes(), ctl.store(), o.cluster_secret);
    b.RegisterService(s->impl_->nodes->service());
  }
  b.SetMaxReceiveMessageSize(static_cast<int>(o.max_message_bytes));
  b.SetMaxSendMessageSize(static_cast<int>(std::max<int64_t>(o.max_message_bytes, 64 << 20)));
  s->impl_->server = b.BuildAndStart();
  if (!s->impl_->server || s->impl_->port == 0)
    return make_error(errc::unavailable, "cannot listen on " + o.listen + " (in use, or not an address of "
                                             "this machine)");
  s->impl_->server->GetHealthCheckService()->SetServingStatus(true);
  return s;
}

api_server::~api_server() {
  shutdown(1);
}

int api_server::port() const {
  return impl_->port;
}

void api_server::set_not_serving() {
  if (impl_ && impl_->server)
    impl_->server->GetHealthCheckService()->SetServingStatus(false);
}

void api_server::shutdown(double deadline_s) {
  if (!impl_ || !impl_->server)
    return;
  impl_->server->Shutdown(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000)));
  impl_->server->Wait();
  impl_->server.reset();
}

} // namespace troupe::cluster
