#include "cluster/node_agent.hpp"

#include "cluster/job_proto.hpp"
#include "cluster/worker_table.hpp"
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
#include <csignal>
#include <cstdio>
#include <deque>
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
  /// Workers a StopJob ended, for the writer to report.
  std::vector<worker_exit> stopped;
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

// One session's writes: the writer thread (heartbeats, exits, leaving) and
// the reader (a worker that could not start) take turns.
class session_writer {
public:
  explicit session_writer(agent_stream& stream) : stream_(stream) {}

  bool send(const v1::AgentMessage& m) {
    std::lock_guard lock{mu_};
    return stream_.Write(m);
  }

  // Reports exits; those the stream did not take wait in `unsent` for the
  // next session.
  bool report(std::vector<worker_exit> exits, std::deque<worker_exit>& unsent) {
    for (size_t i = 0; i < exits.size(); ++i) {
      v1::AgentMessage m;
      to_proto(exits[i], m.mutable_worker_exited());
      if (!send(m)) {
        unsent.insert(unsent.end(), exits.begin() + static_cast<std::ptrdiff_t>(i), exits.end());
        return false;
      }
    }
    return true;
  }

  void done() {
    std::lock_guard lock{mu_};
    stream_.WritesDone();
  }

private:
  std::mutex mu_;
  agent_stream& stream_;
};

// What a session works with besides the stream.
struct session_context {
  agent_state& state;
  worker_table& workers;
  /// Exits not yet reported (only the session's threads touch it, in turn:
  /// the writer while it runs).
  std::deque<worker_exit>& unsent;
};

// The session's writer: waits for the welcome, then heartbeats and reports
// worker exits; when a stop is asked for, ends the workers and leaves.
void write_loop(session_writer& out, grpc::ClientContext& ctx, session_context& c, double join_timeout_s) {
  auto& s = c.state;
  std::unique_lock lock{s.mu};
  auto join_deadline = clock_type::now() + std::chrono::milliseconds(static_cast<int64_t>(join_timeout_s * 1000));
  if (!s.cv.wait_until(lock, join_deadline, [&] { return s.welcomed || s.ended || s.stop; })) {
    ctx.TryCancel();
    return;
  }
  int64_t seq = 0;
  auto next_beat = clock_type::now();
  while (!s.ended) {
    if (s.stop) {
      v1::AgentMessage leave;
      leave.mutable_leave()->set_reason("the agent was stopped (signal " + std::to_string(s.signal) + ")");
      lock.unlock();
      out.report(c.workers.stop_all("the agent was stopped"), c.unsent);
      out.send(leave);
      out.done();
      lock.lock();
      if (!s.cv.wait_for(lock, std::chrono::seconds(5), [&] { return s.ended; }))
        ctx.TryCancel();
      return;
    }
    std::vector<worker_exit> exits(c.unsent.begin(), c.unsent.end());
    c.unsent.clear();
    exits.insert(exits.end(), s.stopped.begin(), s.stopped.end());
    s.stopped.clear();
    lock.unlock();
    auto reaped = c.workers.reap();
    exits.insert(exits.end(), reaped.begin(), reaped.end());
    bool ok = out.report(std::move(exits), c.unsent);
    if (ok && clock_type::now() >= next_beat) {
      v1::AgentMessage beat;
      beat.mutable_heartbeat()->set_seq(++seq);
      ok = out.send(beat);
      next_beat += std::chrono::milliseconds(s.heartbeat_ms);
    }
    lock.lock();
    if (!ok)
      return; // the reader sees the end
    // Exits are looked for a few times per heartbeat.
    s.cv.wait_for(lock, std::chrono::milliseconds(std::min<int64_t>(s.heartbeat_ms, 100)),
                  [&] { return s.ended || s.stop; });
  }
}

// A command from the controller, on the reader's (the main) thread.
void obey(const v1::ControllerMessage& m, session_writer& out, session_context& c) {
  if (m.has_start_worker()) {
    if (auto failed = c.workers.start(from_proto(m.start_worker()))) {
      std::fprintf(stderr, "troupe node: worker %d of job %s: %s\n", failed->rank, failed->job_id.c_str(),
                   failed->description.c_str());
      v1::AgentMessage r;
      to_proto(*failed, r.mutable_worker_exited());
      out.send(r);
    }
  } else if (m.has_stop_job()) {
    // Their exits are reported by the writer, with the others'.
    auto ended = c.workers.stop(m.stop_job().job_id(), "the job ended: " + m.stop_job().reason());
    std::lock_guard lock{c.state.mu};
    c.state.stopped.insert(c.state.stopped.end(), ended.begin(), ended.end());
  }
}

session_result attach(v1::NodeService::Stub& stub, const node_agent_options& o, session_context& c) {
  auto& s = c.state;
  {
    std::lock_guard lock{s.mu};
    s.welcomed = false;
    s.ended = false;
  }
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + o.secret);
  auto stream = stub.Attach(&ctx);
  session_writer out{*stream};
  session_result r;
  std::thread writer;
  if (out.send(hello_of(o)))
    writer = std::thread([&] { write_loop(out, ctx, c, std::min(30.0, o.reconnect_s)); });
  v1::ControllerMessage m;
  while (stream->Read(&m)) {
    if (!m.has_welcome()) {
      obey(m, out, c);
      continue;
    }
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
  if (o.executable.empty()) {
    auto exe = self_executable();
    if (!exe)
      return std::fprintf(stderr, "troupe node: %s\n", describe(exe.error()).c_str()), agent_exit_refused;
    o.executable = *exe;
  }
  if (o.work_dir.empty())
    o.work_dir = (fs::temp_directory_path() / ("troupe-node-" + o.name)).string();

  agent_state s;
  worker_table workers{o.executable, o.work_dir};
  std::deque<worker_exit> unsent;
  session_context c{s, workers, unsent};
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
    auto r = attach(*stub, o, c);
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
