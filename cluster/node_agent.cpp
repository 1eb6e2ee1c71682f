#include "cluster/node_agent.hpp"

#include "cluster/job_proto.hpp"
#include "runtime/host.hpp"

#include "troupe/v1/node_service.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

namespace troupe::cluster {

namespace fs = std::filesystem;

// ---- resources -------------------------------------------------------------

namespace {

int64_t memory_bytes() {
  int64_t total = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (meminfo >> key >> kb) {
    if (key == "MemTotal:") {
      total = kb * 1024;
      break;
    }
    meminfo.ignore(1 << 10, '\n');
  }
  // cgroup v2: the limit of this process's group, when it is lower.
  std::ifstream limit("/sys/fs/cgroup/memory.max");
  std::string text;
  if (limit >> text && text != "max") {
    try {
      auto v = std::stoll(text);
      if (v > 0 && (total == 0 || v < total))
        total = v;
    } catch (const std::exception&) {
    }
  }
  return total;
}

int32_t gpu_count() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::istringstream list{visible};
    int32_t n = 0;
    for (std::string item; std::getline(list, item, ',');)
      n += item.empty() || item == "-1" ? 0 : 1;
    return n;
  }
  int32_t n = 0;
  static const std::regex device{"nvidia[0-9]+"};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev", ec))
    n += std::regex_match(e.path().filename().string(), device) ? 1 : 0;
  return n;
}

} // namespace

node_resources detect_resources() {
  node_resources r;
  cpu_set_t set;
  CPU_ZERO(&set);
  r.cores = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                          : static_cast<int32_t>(std::thread::hardware_concurrency());
  r.memory_bytes = memory_bytes();
  r.gpus = gpu_count();
  return r;
}

// ---- the agent -------------------------------------------------------------

namespace {

using clock_type = std::chrono::steady_clock;

// What the agent's threads share: the stop request (from the signal
// thread) and the state of the current session.
struct agent_state {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  int signal = 0;
  bool welcomed = false;
  bool ended = false;
  int64_t heartbeat_ms = 1000;
};

enum class outcome { left, refused, broken };

struct session_result {
  outcome how = outcome::broken;
  std::string why;
  bool joined = false;
};

bool is_refusal(grpc::StatusCode c) {
  return c == grpc::StatusCode::UNAUTHENTICATED || c == grpc::StatusCode::PERMISSION_DENIED ||
         c == grpc::StatusCode::INVALID_ARGUMENT || c == grpc::StatusCode::FAILED_PRECONDITION;
}

v1::AgentMessage hello_of(const node_agent_options& o) {
  v1::AgentMessage m;
  to_proto(node_hello{o.name, o.advertise, o.resources, o.version, ::getpid()}, m.mutable_hello());
  return m;
}

using agent_stream = grpc::ClientReaderWriter<v1::AgentMessage, v1::ControllerMessage>;

// The session's writer: waits for the welcome, heartbeats, and leaves when
// a stop is asked for.
void write_loop(agent_stream& stream, grpc::ClientContext& ctx, agent_state& s, double join_timeout_s) {
  std::unique_lock lock{s.mu};
  auto join_deadline = clock_type::now() + std::chrono::milliseconds(static_cast<int64_t>(join_timeout_s * 1000));
  if (!s.cv.wait_until(lock, join_deadline, [&] { return s.welcomed || s.ended || s.stop; })) {
    ctx.TryCancel();
    return;
  }
  int64_t seq = 0;
  while (!s.ended) {
    if (s.stop) {
      v1::AgentMessage leave;
      leave.mutable_leave()->set_reason("the agent was stopped (signal " + std::to_string(s.signal) + ")");
      lock.unlock();
      stream.Write(leave);
      stream.WritesDone();
      lock.lock();
      if (!s.cv.wait_for(lock, std::chrono::seconds(5), [&] { return s.ended; }))
        ctx.TryCancel();
      return;
    }
    v1::AgentMessage beat;
    beat.mutable_heartbeat()->set_seq(++seq);
    lock.unlock();
    bool ok = stream.Write(beat);
    lock.lock();
    if (!ok)
      return; // the reader sees the end
    s.cv.wait_for(lock, std::chrono::milliseconds(s.heartbeat_ms), [&] { return s.ended || s.stop; });
  }
}

session_result attach(v1::NodeService::Stub& stub, const node_agent_options& o, agent_state& s) {
  {
    std::lock_guard lock{s.mu};
    s.welcomed = false;
    s.ended = false;
  }
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + o.secret);
  auto stream = stub.Attach(&ctx);
  session_result r;
  std::thread writer;
  if (stream->Write(hello_of(o)))
    writer = std::thread([&] { write_loop(*stream, ctx, s, std::min(30.0, o.reconnect_s)); });
  v1::ControllerMessage m;
  while (stream->Read(&m)) {
    if (!m.has_welcome())
      continue;
    std::lock_guard lock{s.mu};
    s.welcomed = true;
    r.joined = true;
    s.heartbeat_ms = std::max(10, m.welcome().heartbeat_ms());
    std::fprintf(stderr, "troupe node: joined %s as %s (address %s; %d cores, %.1f GiB, %d GPUs)\n",
                 o.controller.address.c_str(), m.welcome().name().c_str(), m.welcome().address().c_str(),
                 o.resources.cores, static_cast<double>(o.resources.memory_bytes) / (1 << 30), o.resources.gpus);
    s.cv.notify_all();
  }
  {
    std::lock_guard lock{s.mu};
    s.ended = true;
  }
  s.cv.notify_all();
  if (writer.joinable())
    writer.join();
  auto st = stream->Finish();
  std::lock_guard lock{s.mu};
  if (s.stop)
    r.how = outcome::left;
  else if (is_refusal(st.error_code()))
    r.how = outcome::refused;
  r.why = st.ok() ? "the controller ended the stream" : st.error_message();
  return r;
}

// Waits up to `d` unless a stop comes first; true when it did.
bool stopped_within(agent_state& s, std::chrono::milliseconds d) {
  std::unique_lock lock{s.mu};
  return s.cv.wait_for(lock, d, [&] { return s.stop; });
}

} // namespace

int run_node_agent(const node_agent_options& opts, const sigset_t& stop_signals) {
  auto o = opts;
  if (o.name.empty())
    o.name = runtime::host_name();
  if (!valid_node_name(o.name))
    return std::fprintf(stderr, "troupe node: --name '%s' is not a node name ([A-Za-z0-9._-], 1 to 63)\n",
                        o.name.c_str()),
           agent_exit_refused;
  if (o.secret.empty())
    return std::fprintf(stderr, "troupe node: no cluster secret (--secret FILE)\n"), agent_exit_refused;
  auto channel = open_channel(o.controller);
  if (!channel)
    return std::fprintf(stderr, "troupe node: %s\n", describe(channel.error()).c_str()), agent_exit_refused;
  auto stub = v1::NodeService::NewStub(*channel);

  agent_state s;
  std::atomic<bool> done{false};
  std::thread signals([&] {
    timespec tick{0, 200 * 1000 * 1000};
    while (!done) {
      int sig = ::sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig > 0) {
        std::lock_guard lock{s.mu};
        s.stop = true;
        s.signal = sig;
        s.cv.notify_all();
      }
    }
  });
  auto give_up_at = clock_type::now() + std::chrono::milliseconds(static_cast<int64_t>(o.reconnect_s * 1000));
  auto backoff = std::chrono::milliseconds(200);
  int code = agent_exit_left;
  for (;;) {
    auto r = attach(*stub, o, s);
    if (r.how == outcome::left) {
      std::fprintf(stderr, "troupe node: left %s\n", o.controller.address.c_str());
      break;
    }
    if (r.how == outcome::refused) {
      std::fprintf(stderr, "troupe node: refused by %s: %s\n", o.controller.address.c_str(), r.why.c_str());
      code = agent_exit_refused;
      break;
    }
    if (r.joined) {
      std::fprintf(stderr, "troupe node: lost %s (%s); joining again\n", o.controller.address.c_str(),
                   r.why.c_str());
      give_up_at = clock_type::now() + std::chrono::milliseconds(static_cast<int64_t>(o.reconnect_s * 1000));
      backoff = std::chrono::milliseconds(200);
    }
    if (clock_type::now() >= give_up_at) {
      std::fprintf(stderr, "troupe node: cannot reach %s for %.0f s: %s\n", o.controller.address.c_str(),
                   o.reconnect_s, r.why.c_str());
      code = agent_exit_unreachable;
      break;
    }
    if (stopped_within(s, backoff))
      break;
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
  done = true;
  signals.join();
  return code;
}

} // namespace troupe::cluster
