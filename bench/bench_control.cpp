// Control plane benchmarks (issue 14), loopback only, each part against its
// baseline or its "before" in the same run:
//  1. unary latency: GetJob on a real `troupe controller` process (token
//     check, job lookup, Job message) next to a bare gRPC unary call that
//     answers the same bytes — a generic callback service in a process of
//     its own (this program re-run with --serve-echo) that does nothing but
//     reply. Both are called through the same GenericStub, sequentially,
//     in interleaved rounds; p50 / p99 and their ratio.
//  2. load: N submits of a one-iteration job (the controller runs two at a
//     time) while W WatchJob streams are open: every job is watched from
//     seq 1 to its end by one of the streams, which checks the sequence
//     numbers are contiguous and the last message is the final job. Reports
//     submit latency, throughput, how many streams were open at once, and
//     the controller's RSS after the run against before it.
//
//   bench_control [--submits N] [--watchers W] [--calls C] [--submit-threads T]
#include "cluster/api_client.hpp"
#include "cluster/api_server.hpp"
#include "cluster/local_launcher.hpp"
#include "runtime/file_io.hpp"

#include "troupe/v1/job_service.pb.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/utsname.h>
#include <unistd.h>

using namespace troupe;
using clock_type = std::chrono::steady_clock;

namespace {

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_control: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T must(expected<T> x, const std::string& what) {
  if (!x)
    die(what + ": " + describe(x.error()));
  return std::move(*x);
}

bool wait_until(const std::function<bool()>& pred, double timeout_s) {
  auto deadline = clock_type::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3));
  while (clock_type::now() < deadline) {
    if (pred())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

// ---- the baseline server: reads one message, answers fixed bytes ----

class reply_reactor : public grpc::ServerGenericBidiReactor {
public:
  explicit reply_reactor(const grpc::ByteBuffer* reply) : reply_(reply) { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (!ok)
      return Finish(grpc::Status{grpc::StatusCode::INVALID_ARGUMENT, "no request"});
    StartWriteAndFinish(reply_, grpc::WriteOptions{}, grpc::Status::OK);
  }
  void OnDone() override { delete this; }

private:
  const grpc::ByteBuffer* reply_;
  grpc::ByteBuffer request_;
};

class reply_service : public grpc::CallbackGenericService {
public:
  explicit reply_service(size_t bytes) {
    std::string payload(bytes, 'x');
    grpc::Slice s{payload};
    reply_ = grpc::ByteBuffer{&s, 1};
  }
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new reply_reactor(&reply_);
  }

private:
  grpc::ByteBuffer reply_;
};

int serve_echo(const std::string& port_file, size_t reply_bytes) {
  reply_service svc{reply_bytes};
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterCallbackGenericService(&svc);
  auto server = b.BuildAndStart();
  if (!server || port == 0)
    return 1;
  auto tmp = port_file + ".tmp";
  std::ofstream(tmp) << port;
  std::filesystem::rename(tmp, port_file);
  server->Wait(); // until SIGTERM
  return 0;
}

// ---- one process started and stopped by the benchmark ----

struct child {
  cluster::local_process proc;
  std::string address;
};

child start_echo(const std::string& dir, size_t reply_bytes) {
  cluster::process_spec spec;
  spec.name = "echo";
  auto port_file = dir + "/echo.port";
  spec.argv = {"/proc/self/exe", "--serve-echo", port_file, std::to_string(reply_bytes)};
  child c{must(cluster::local_process::spawn(spec), "start the echo server"), ""};
  if (!wait_until([&] { return std::filesystem::exists(port_file); }, 30))
    die("the echo server did not start");
  c.address = "127.0.0.1:" + *runtime::read_file(port_file);
  return c;
}

child start_controller(const std::string& state_dir) {
  cluster::process_spec spec;
  spec.name = "controller";
  spec.argv = {TROUPE_BINARY_PATH, "controller", "--listen",           "127.0.0.1:0", "--dashboard",
               "127.0.0.1:0",      "--state-dir", state_dir, "--max-running-jobs", "2"};
  spec.output_path = state_dir + ".log";
  auto info = state_dir + "/controller.json";
  child c{must(cluster::local_process::spawn(spec), "start the controller"), ""};
  if (!wait_until([&] { return std::filesystem::exists(info) || !c.proc.running(); }, 60) ||
      !c.proc.running())
    die("the controller did not start; see " + spec.output_path);
  c.address = nlohmann::json::parse(*runtime::read_file(info)).at("address").get<std::string>();
  return c;
}

int64_t rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stoll(line.substr(6));
  return -1;
}

// ---- calls ----

// One unary call by method name through the generic stub: the same client
// path for the baseline and for GetJob.
grpc::Status raw_call(grpc::GenericStub& stub, const std::string& method, const std::string& token,
                      const grpc::ByteBuffer& request, grpc::ByteBuffer* response) {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions{}, &request, response,
                 [&](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

std::string bytes_of(grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  (void)b.Dump(&slices);
  std::string out;
  for (const auto& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer buffer_of(const std::string& bytes) {
  grpc::Slice s{bytes};
  return grpc::ByteBuffer{&s, 1};
}

std::string one_iteration_job() {
  return "run: {name: bench, dir: run, seed: 5, threads: 1}\n"
         "stages: [rl]\n"
         "data: {task: sort, min_digits: 2, max_digits: 3, train_size: 64, eval_size: 8}\n"
         "model: {hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 2,\n"
         "        num_kv_heads: 1, max_position_embeddings: 24}\n"
         "rl: {iterations: 1, prompts_per_iteration: 8, minibatches: 2, eval_every: 0,\n"
         "     checkpoint_every: 0, generation: {max_tokens: 5}, critic: {init: base},\n"
         "     rollout: {num_blocks: 64, block_size: 4}}\n";
}

cluster::api_client connect(const std::string& address, const std::string& token) {
  cluster::client_options o;
  o.address = address;
  o.token = token;
  o.timeout_s = 120;
  o.user = "bench";
  return must(cluster::api_client::connect(o), "connect to " + address);
}

cluster::submit_request job_request(int i) {
  cluster::submit_request r;
  r.spec_name = "bench.yaml";
  r.spec_text = one_iteration_job();
  r.name = i < 0 ? std::string{"bench-warmup"} : "bench-" + std::to_string(i);
  return r;
}

// ---- part 1: unary latency ----

struct latency_result {
  std::vector<double> baseline_us, getjob_us;
  size_t reply_bytes = 0;
};

void timed_calls(grpc::GenericStub& stub, const std::string& method, const std::string& token,
                 const grpc::ByteBuffer& req, int n, std::vector<double>& out) {
  for (int i = 0; i < n; ++i) {
    grpc::ByteBuffer resp;
    auto t0 = clock_type::now();
    auto st = raw_call(stub, method, token, req, &resp);
    out.push_back(ms_since(t0) * 1e3);
    if (!st.ok())
      die(method + ": " + st.error_message());
  }
}

latency_result unary_latency(const child& ctl, const std::string& token, const std::string& job_id,
                             const std::string& tmp, int calls) {
  v1::JobRef ref;
  ref.set_id(job_id);
  auto req = buffer_of(ref.SerializeAsString());
  auto ctl_ch = grpc::CreateChannel(ctl.address, grpc::InsecureChannelCredentials());
  grpc::GenericStub ctl_stub{ctl_ch};
  const std::string get_job = "/troupe.v1.JobService/GetJob";
  // The reply GetJob gives, checked once; the baseline answers as many bytes.
  grpc::ByteBuffer first;
  if (auto st = raw_call(ctl_stub, get_job, token, req, &first); !st.ok())
    die("GetJob: " + st.error_message());
  v1::Job job;
  if (!job.ParseFromString(bytes_of(first)) || job.id() != job_id)
    die("GetJob answered something else than the job");
  latency_result r;
  r.reply_bytes = job.ByteSizeLong();
  auto echo = start_echo(tmp, r.reply_bytes);
  auto echo_ch = grpc::CreateChannel(echo.address, grpc::InsecureChannelCredentials());
  grpc::GenericStub echo_stub{echo_ch};
  const std::string echo_method = "/bench.Echo/Reply";
  // Warm both connections, then interleaved rounds so drift hits both.
  std::vector<double> sink;
  timed_calls(echo_stub, echo_method, token, req, 200, sink);
  timed_calls(ctl_stub, get_job, token, req, 200, sink);
  const int rounds = 10;
  for (int k = 0; k < rounds; ++k) {
    bool echo_first = k % 2 == 0;
    timed_calls(echo_first ? echo_stub : ctl_stub, echo_first ? echo_method : get_job, token, req,
                calls / rounds, echo_first ? r.baseline_us : r.getjob_us);
    timed_calls(echo_first ? ctl_stub : echo_stub, echo_first ? get_job : echo_method, token, req,
                calls / rounds, echo_first ? r.getjob_us : r.baseline_us);
  }
  echo.proc.kill(SIGTERM);
  (void)echo.proc.wait_for(10000);
  return r;
}

// ---- part 2: submits under watch ----

struct load_result {
  std::vector<double> submit_ms;
  std::vector<double> end_to_end_s; // submit to final, per job
  int submitted = 0, watched = 0, final_ok = 0, succeeded = 0;
  int gaps = 0, watch_errors = 0, submit_errors = 0;
  int64_t events = 0;
  int max_open = 0;
  double wall_s = 0;
  std::vector<std::string> problems;
};

class work_queue {
public:
  void push(std::string id, clock_type::time_point t) {
    std::lock_guard l{mu_};
    q_.emplace_back(std::move(id), t);
    cv_.notify_one();
  }
  void close() {
    std::lock_guard l{mu_};
    closed_ = true;
    cv_.notify_all();
  }
  std::optional<std::pair<std::string, clock_type::time_point>> pop() {
    std::unique_lock l{mu_};
    cv_.wait(l, [&] { return closed_ || !q_.empty(); });
    if (q_.empty())
      return std::nullopt;
    auto x = std::move(q_.front());
    q_.pop_front();
    return x;
  }

private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, clock_type::time_point>> q_;
  bool closed_ = false;
};

// Watches jobs from the queue, one stream at a time, until it is closed.
void watcher(const child& ctl, const std::string& token, work_queue& q, load_result& r,
             std::mutex& mu, std::atomic<int>& open) {
  auto client = connect(ctl.address, token);
  while (auto item = q.pop()) {
    const auto& [id, submitted_at] = *item;
    int64_t next = 1, count = 0;
    bool gap = false;
    int now_open = ++open;
    auto end = client.watch(id, 1, [&](const actors::job::event& e) {
      gap = gap || e.seq != next;
      next = e.seq + 1;
      ++count;
    });
    --open;
    std::lock_guard l{mu};
    r.max_open = std::max(r.max_open, now_open);
    ++r.watched;
    r.events += count;
    if (!end) {
      ++r.watch_errors;
      r.problems.push_back(id + ": " + describe(end.error()));
      continue;
    }
    r.end_to_end_s.push_back(ms_since(submitted_at) / 1e3);
    if (gap || end->status.last_seq != next - 1) {
      ++r.gaps;
      r.problems.push_back(id + ": events not contiguous or short of last_seq " +
                           std::to_string(end->status.last_seq));
    }
    r.final_ok += cluster::is_final(end->state) ? 1 : 0;
    r.succeeded += end->state == cluster::ctl_state::succeeded ? 1 : 0;
  }
}

load_result submits_under_watch(const child& ctl, const std::string& token, int submits, int watchers,
                                int submit_threads) {
  load_result r;
  work_queue q;
  std::mutex mu;
  std::atomic<int> open{0}, next_job{0};
  auto t0 = clock_type::now();
  std::vector<std::thread> pool;
  for (int w = 0; w < watchers; ++w)
    pool.emplace_back([&] { watcher(ctl, token, q, r, mu, open); });
  std::vector<std::thread> submitters;
  for (int s = 0; s < submit_threads; ++s)
    submitters.emplace_back([&] {
      auto client = connect(ctl.address, token);
      for (int i; (i = next_job++) < submits;) {
        auto t = clock_type::now();
        auto v = client.submit(job_request(i));
        double ms = ms_since(t);
        std::lock_guard l{mu};
        if (!v) {
          ++r.submit_errors;
          r.problems.push_back("submit " + std::to_string(i) + ": " + describe(v.error()));
          continue;
        }
        ++r.submitted;
        r.submit_ms.push_back(ms);
        q.push(v->status.id, t);
      }
    });
  for (auto& t : submitters)
    t.join();
  q.close();
  for (auto& t : pool)
    t.join();
  r.wall_s = ms_since(t0) / 1e3;
  return r;
}

// ---- the report ----

std::string machine() {
  utsname u{};
  ::uname(&u);
  std::string cpu = "?";
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  return cpu + ", " + std::to_string(std::thread::hardware_concurrency()) + " cores, " + u.sysname +
         " " + u.release;
}

bool report_latency(const latency_result& r) {
  double b50 = percentile(r.baseline_us, 0.5), b99 = percentile(r.baseline_us, 0.99);
  double g50 = percentile(r.getjob_us, 0.5), g99 = percentile(r.getjob_us, 0.99);
  std::printf("\n1. unary latency, %zu calls each, reply %zu bytes\n", r.getjob_us.size(),
              r.reply_bytes);
  std::printf("   %-34s p50 %8.1f us   p99 %8.1f us\n", "bare gRPC unary (same bytes)", b50, b99);
  std::printf("   %-34s p50 %8.1f us   p99 %8.1f us\n", "GetJob (troupe controller)", g50, g99);
  std::printf("   ratio GetJob / bare: p50 %.2fx, p99 %.2fx (floor <= 1.5x, both)\n", g50 / b50, g99 / b99);
  return g50 / b50 <= 1.5 && g99 / b99 <= 1.5;
}

bool report_load(const load_result& r, int submits, int watchers, int64_t rss_before, int64_t rss_after) {
  std::printf("\n2. %d submits of a one-iteration job (2 running at a time), %d watch streams\n",
              submits, watchers);
  std::printf("   submitted %d (errors %d), watched %d (errors %d), final %d, succeeded %d\n",
              r.submitted, r.submit_errors, r.watched, r.watch_errors, r.final_ok, r.succeeded);
  std::printf("   events streamed %lld, streams with a gap or duplicate %d, most streams open at once %d\n",
              static_cast<long long>(r.events), r.gaps, r.max_open);
  std::printf("   submit latency p50 %.1f ms, p99 %.1f ms; submit to final p50 %.1f s, p99 %.1f s\n",
              percentile(r.submit_ms, 0.5), percentile(r.submit_ms, 0.99),
              percentile(r.end_to_end_s, 0.5), percentile(r.end_to_end_s, 0.99));
  std::printf("   wall %.1f s: %.2f jobs/s, %.0f events/s to the watchers\n", r.wall_s,
              r.submitted / r.wall_s, static_cast<double>(r.events) / r.wall_s);
  double rss_ratio = static_cast<double>(rss_after) / static_cast<double>(rss_before);
  std::printf("   controller RSS before %.1f MiB, after %.1f MiB: %.3fx (floor <= 1.10x)\n",
              rss_before / 1024.0, rss_after / 1024.0, rss_ratio);
  for (size_t i = 0; i < r.problems.size() && i < 10; ++i)
    std::printf("   problem: %s\n", r.problems[i].c_str());
  return r.submitted == submits && r.watched == submits && r.final_ok == submits && r.gaps == 0 &&
         r.watch_errors == 0 && r.max_open >= std::min(watchers, submits) && rss_ratio <= 1.10;
}

int arg_or(int argc, char** argv, const std::string& flag, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == flag)
      return std::stoi(argv[i + 1]);
  return fallback;
}

} // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--serve-echo")
    return serve_echo(argv[2], std::stoul(argv[3]));
  int submits = arg_or(argc, argv, "--submits", 1000);
  int watchers = arg_or(argc, argv, "--watchers", 100);
  int calls = arg_or(argc, argv, "--calls", 5000);
  int submit_threads = arg_or(argc, argv, "--submit-threads", 4);
  std::printf("bench_control: %s\n", machine().c_str());

  char tmpl[] = "/tmp/bench_control.XXXXXX";
  if (!::mkdtemp(tmpl))
    die("mkdtemp failed");
  std::string tmp = tmpl;
  auto state = tmp + "/state";
  auto ctl = start_controller(state);
  auto token = must(cluster::read_token_file(state + "/token"), "read the token");

  // One job to ask about (and the controller's warm-up).
  auto client = connect(ctl.address, token);
  auto first = must(client.submit(job_request(-1)), "submit");
  auto first_end = must(client.watch(first.status.id, 1, [](const actors::job::event&) {}), "watch");
  if (first_end.state != cluster::ctl_state::succeeded)
    die("the warm-up job did not succeed: " + first_end.status.error);

  auto lat = unary_latency(ctl, token, first.status.id, tmp, calls);
  bool ok = report_latency(lat);

  int64_t rss_before = rss_kib(ctl.proc.pid());
  auto load = submits_under_watch(ctl, token, submits, watchers, submit_threads);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  int64_t rss_after = rss_kib(ctl.proc.pid());
  ok = report_load(load, submits, watchers, rss_before, rss_after) && ok;

  ctl.proc.kill(SIGTERM);
  (void)ctl.proc.wait_for(120000);
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  std::printf("\n%s\n", ok ? "all floors met" : "A FLOOR WAS MISSED");
  return ok ? 0 : 1;
}
