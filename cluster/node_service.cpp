#include "cluster/node_service.hpp"

#include "actors/job/events.hpp"
#include "cluster/grpc_status.hpp"
#include "cluster/job_proto.hpp"
#include "cluster/job_store.hpp"

#include "troupe/v1/node_service.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace troupe::cluster {

using actors::job::now_us;

struct node_service::impl final : v1::NodeService::CallbackService {
  impl(node_registry& n, job_store& s, std::string sec) : nodes(n), store(s), secret(std::move(sec)) {}

  node_registry& nodes;
  job_store& store;
  std::string secret;

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::thread sweeper;

  void audit(const std::string& who, const std::string& what, const std::string& node, const std::string& result) {
    (void)store.audit({now_us(), who, what, node.substr(0, 128), result});
  }

  // Finds silent nodes a few times per lost_after_ms.
  void sweep_loop() {
    auto period = std::chrono::milliseconds(std::clamp<int64_t>(nodes.options().lost_after_ms / 10, 20, 250));
    std::unique_lock lock{mu};
    while (!cv.wait_for(lock, period, [&] { return stopping; })) {
      lock.unlock();
      nodes.sweep(now_us());
      lock.lock();
    }
  }

  grpc::ServerBidiReactor<v1::AgentMessage, v1::ControllerMessage>* Attach(
      grpc::CallbackServerContext* ctx) override;
};

namespace {

v1::ControllerMessage command_message(const node_command& c) {
  v1::ControllerMessage m;
  if (const auto* start = std::get_if<worker_start>(&c)) {
    to_proto(*start, m.mutable_start_worker());
  } else {
    const auto& stop = std::get<job_stop>(c);
    m.mutable_stop_job()->set_job_id(stop.job_id);
    m.mutable_stop_job()->set_reason(stop.reason);
  }
  return m;
}

// One agent's stream. gRPC's reactions and the registry's closer (from the
// sweep thread) meet under the link's mutex; the link outlives the session
// so that a late closer finds it gone.
class agent_session final : public grpc::ServerBidiReactor<v1::AgentMessage, v1::ControllerMessage> {
public:
  struct link {
    std::mutex mu;
    agent_session* session = nullptr;
  };

  agent_session(node_service::impl& svc, grpc::CallbackServerContext* ctx)
      : svc_(svc), who_(caller_of(ctx)), peer_(ctx->peer()), link_(std::make_shared<link>()) {
    link_->session = this;
    std::lock_guard lock{link_->mu};
    auto st = check_bearer(ctx, svc_.secret, "cluster secret",
                           "the cluster secret is <state dir>/cluster_secret on the controller's machine");
    if (!st.ok()) {
      svc_.audit(who_, "NodeJoin", "", result_of(st));
      end(st);
      return;
    }
    this->StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    std::lock_guard lock{link_->mu};
    if (!ok) {
      if (session_ && !left_)
        svc_.nodes.disconnected(session_, "its agent's connection closed", now_us());
      return end(grpc::Status::OK);
    }
    handle();
    if (!finished_)
      this->StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock{link_->mu};
    writing_ = false;
    if (!ok)
      return end(grpc::Status{grpc::StatusCode::CANCELLED, "the agent's stream closed"});
    out_.pop_front();
    flush();
  }

  void OnDone() override {
    {
      std::lock_guard lock{link_->mu};
      link_->session = nullptr;
    }
    delete this;
  }

private:
  // The message in in_; called with the link's mutex held.
  void handle() {
    if (in_.has_hello())
      return hello();
    if (!session_)
      return refuse(grpc::Status{grpc::StatusCode::INVALID_ARGUMENT, "the first message must be a NodeHello"});
    if (in_.has_heartbeat())
      return svc_.nodes.heartbeat(session_, now_us());
    if (in_.has_worker_exited())
      return svc_.nodes.worker_exited(session_, from_proto(in_.worker_exited()));
    if (in_.has_leave()) {
      left_ = true;
      svc_.nodes.leave(session_, in_.leave().reason(), now_us());
      svc_.audit(who_, "NodeLeave", name_, "ok");
    }
  }

  void hello() {
    if (session_)
      return refuse(grpc::Status{grpc::StatusCode::INVALID_ARGUMENT, "a second NodeHello on one stream"});
    auto h = from_proto(in_.hello());
    auto closer = [l = std::weak_ptr<link>(link_)](const std::string& reason) {
      if (auto lk = l.lock()) {
        std::lock_guard lock{lk->mu};
        if (lk->session)
          lk->session->end(grpc::Status{grpc::StatusCode::UNAVAILABLE, "marked lost: " + reason});
      }
    };
    auto sender = [l = std::weak_ptr<link>(link_)](const node_command& c) {
      auto lk = l.lock();
      if (!lk)
        return false;
      std::lock_guard lock{lk->mu};
      if (!lk->session || lk->session->finished_)
        return false;
      lk->session->write(command_message(c));
      return true;
    };
    auto id = svc_.nodes.join(h, peer_, closer, now_us(), sender);
    if (!id)
      return refuse(to_grpc_status(with_prefix(id.error(), "NodeHello")), h.name);
    session_ = *id;
    name_ = h.name;
    auto view = svc_.nodes.find(h.name);
    svc_.audit(who_, "NodeJoin", name_, "ok");
    v1::ControllerMessage m;
    auto* w = m.mutable_welcome();
    w->set_name(name_);
    w->set_address(view ? view->address : "");
    w->set_heartbeat_ms(static_cast<int32_t>(svc_.nodes.options().heartbeat_ms));
    w->set_lost_after_ms(static_cast<int32_t>(svc_.nodes.options().lost_after_ms));
    write(std::move(m));
  }

  void refuse(const grpc::Status& st, const std::string& node = {}) {
    svc_.audit(who_, "NodeJoin", node.empty() ? name_ : node, result_of(st));
    end(st);
  }

  void write(v1::ControllerMessage m) {
    out_.push_back(std::move(m));
    flush();
  }

  void flush() {
    if (writing_ || finished_ || out_.empty())
      return;
    writing_ = true;
    this->StartWrite(&out_.front());
  }

  void end(const grpc::Status& st) {
    if (finished_)
      return;
    finished_ = true;
    this->Finish(st);
  }

  node_service::impl& svc_;
  std::string who_;
  std::string peer_;
  std::shared_ptr<link> link_;
  v1::AgentMessage in_;
  std::deque<v1::ControllerMessage> out_;
  uint64_t session_ = 0;
  std::string name_;
  bool left_ = false;
  bool writing_ = false;
  bool finished_ = false;
};

} // namespace

grpc::ServerBidiReactor<v1::AgentMessage, v1::ControllerMessage>* node_service::impl::Attach(
    grpc::CallbackServerContext* ctx) {
  return new agent_session(*this, ctx);
}

node_service::node_service(node_registry& nodes, job_store& store, std::string secret)
    : impl_(std::make_unique<impl>(nodes, store, std::move(secret))) {
  nodes.on_lost([&store](const node_view& v) {
    (void)store.audit({now_us(), v.peer, "NodeLost", v.name, v.reason});
  });
  impl_->sweeper = std::thread([this] { impl_->sweep_loop(); });
}

node_service::~node_service() {
  {
    std::lock_guard lock{impl_->mu};
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->sweeper.joinable())
    impl_->sweeper.join();
}

grpc::Service* node_service::service() {
  return impl_.get();
}

} // namespace troupe::cluster
