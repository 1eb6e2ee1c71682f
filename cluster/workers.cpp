#include "cluster/workers.hpp"

#include "actors/actor_system.hpp"
#include "actors/rl/roles.hpp"
#include "cluster/heartbeats.hpp"
#include "cluster/local_launcher.hpp"
#include "cluster/remote_reward.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <unistd.h>

namespace troupe::cluster {

namespace {

/// Inside a worker: a role built on its own thread, back to the worker actor.
using role_built_atom = caf::atom_constant<caf::atom("rolebuilt")>;

using clock_type = std::chrono::steady_clock;

// What the registrar learns, shared with the launcher's thread.
struct registry {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::optional<worker_info>> slots;
  /// (rank, "worker r (...) lost its connection: reason")
  std::vector<std::pair<size_t, std::string>> lost;
  bool shutting_down = false;
  /// Workers whose connection closed after the shutdown began.
  size_t gone = 0;
  /// (rank, why) of workers the watchdog found hung (NOTE [heartbeats]).
  std::vector<std::pair<size_t, std::string>> hung;
  /// Per worker: its role label, its node's name ("" = this machine) and
  /// address; a replaced worker's node changes (NOTE [replacing a worker]).
  std::vector<std::string> roles, nodes, hosts;
  /// NOTE [heartbeats]: where the workers send theirs, and how often
  /// (unset: heartbeats off).
  std::optional<heartbeat_receiver> beats;
  int64_t tick_ms = 0;
};

// Eight heartbeats each interval.
std::chrono::milliseconds heartbeat_tick(std::chrono::milliseconds interval) {
  return std::max(std::chrono::milliseconds(1), interval / 8);
}

std::string describe_worker(const worker_info& w) {
  return "worker " + std::to_string(w.rank) + " (role " + w.role +
         (w.node.empty() ? "" : ", node " + w.node) + ", pid " + std::to_string(w.pid) + ")";
}

caf::behavior registrar(caf::event_based_actor* self, std::shared_ptr<registry> reg) {
  self->set_down_handler([=](caf::down_msg& dm) {
    std::lock_guard lock{reg->mu};
    if (reg->shutting_down) {
      ++reg->gone;
      reg->cv.notify_all();
      return;
    }
    for (const auto& s : reg->slots)
      if (s && s->handle.address() == dm.source) {
        reg->lost.emplace_back(static_cast<size_t>(s->rank),
                               describe_worker(*s) + " lost its connection: " +
                                   self->system().render(dm.reason));
        reg->cv.notify_all();
      }
  });
  return {
      // Answers where to send heartbeats and how often (port 0: not at all).
      [=](register_atom, int32_t rank, int64_t pid,
          const caf::actor& who) -> caf::result<uint16_t, int64_t> {
        std::lock_guard lock{reg->mu};
        if (rank < 0 || static_cast<size_t>(rank) >= reg->slots.size())
          return make_error(errc::invalid_argument,
                            "register: rank " + std::to_string(rank) + " outside a world of " +
                                std::to_string(reg->slots.size()));
        if (reg->slots[static_cast<size_t>(rank)])
          return make_error(errc::invalid_argument,
                            "register: rank " + std::to_string(rank) + " is already registered");
        self->monitor(who);
        auto r = static_cast<size_t>(rank);
        reg->slots[r] = worker_info{rank, reg->roles[r], pid, who, reg->nodes[r], reg->hosts[r]};
        reg->cv.notify_all();
        return caf::result<uint16_t, int64_t>{reg->beats ? reg->beats->port() : uint16_t{0},
                                              reg->tick_ms};
      },
  };
}

using heartbeat_tick_atom = caf::atom_constant<caf::atom("hbtick")>;

// NOTE [heartbeats] (heartbeats.hpp): every tick the watchdog drains the
// workers' datagrams; a worker none came from for 2 intervals is hung, and
// so are the workers of a group deadlocked in a collective (NOTE
// [deadlocked collectives]). A hung worker is killed, once: SIGKILL here;
// a worker on a node is told to end itself (a stopped one cannot hear it:
// its connection's timeout ends it). Its roles' proxies see that as their
// loss (NOTE [supervision] in actors/rl/supervision.hpp).
struct watchdog_state {
  struct seen {
    caf::actor_addr who;
    clock_type::time_point answered;
    /// The calls in flight its last heartbeat reported.
    std::vector<runtime::call_in_flight> calls;
    /// Killed: not watched again until its slot holds another worker.
    bool killed = false;
  };
  std::vector<seen> workers;
  static inline const char* name = "worker_watchdog";
};

// Marks worker `r` hung for `why` and ends it (once).
void kill_hung(std::shared_ptr<registry> reg, watchdog_state::seen& w, const worker_info& info,
               size_t r, const std::string& why) {
  {
    std::lock_guard lock{reg->mu};
    reg->hung.emplace_back(r, describe_worker(info) + " " + why);
  }
  if (info.node.empty())
    ::kill(static_cast<pid_t>(info.pid), SIGKILL);
  else // (a stopped one hears it only if it runs again)
    caf::anon_send(info.handle, worker_hung_atom::value);
  w.killed = true;
  w.calls.clear();
}

// The heartbeats of this tick, into each worker's record; a new worker's
// silence counts from now.
void note_beats(watchdog_state& st, const std::vector<std::optional<worker_info>>& slots,
                const std::vector<heartbeat>& beats, clock_type::time_point now,
                std::chrono::milliseconds tick) {
  auto& ws = st.workers;
  ws.resize(slots.size());
  for (size_t r = 0; r < slots.size(); ++r) {
    if (!slots[r])
      continue;
    auto& w = ws[r];
    const auto& info = *slots[r];
    if (w.who != info.handle.address())
      w = {info.handle.address(), now, {}, false};
    if (!w.who || w.killed)
      continue;
    for (const auto& b : beats)
      if (b.rank == static_cast<int32_t>(r) && b.pid == info.pid) {
        w.answered = now;
        w.calls = b.calls;
      }
    // NOTE [deadlocked collectives]: calls from a report of the last two
    // ticks only, so a call that has ended is not taken for a current one.
    if (now - w.answered > 2 * tick)
      w.calls.clear();
  }
}

caf::behavior watchdog(caf::stateful_actor<watchdog_state>* self, std::shared_ptr<registry> reg,
                       std::chrono::milliseconds interval) {
  const auto tick = heartbeat_tick(interval);
  const auto silence = interval * 2;
  self->send(self, heartbeat_tick_atom::value);
  return {
      [=](heartbeat_tick_atom) {
        std::vector<std::optional<worker_info>> slots;
        {
          std::lock_guard lock{reg->mu};
          if (reg->shutting_down)
            return;
          slots = reg->slots;
        }
        // (The receiver is this actor's alone.)
        const auto now = clock_type::now();
        note_beats(self->state, slots, reg->beats ? reg->beats->drain() : std::vector<heartbeat>{},
                   now, tick);
        auto& ws = self->state.workers;
        std::vector<worker_calls> calls;
        for (size_t r = 0; r < ws.size(); ++r) {
          auto& w = ws[r];
          if (!w.who || w.killed)
            continue;
          const auto quiet =
              std::chrono::duration_cast<std::chrono::milliseconds>(now - w.answered);
          if (quiet > silence)
            kill_hung(reg, w, *slots[r], r,
                      "answered no heartbeat for " + std::to_string(quiet.count()) + " ms");
          else if (!w.calls.empty())
            calls.push_back({static_cast<int>(r), w.calls});
        }
        for (const auto& d : find_deadlocks(calls, silence.count()))
          for (const auto& m : d.ranks)
            if (auto& w = ws[static_cast<size_t>(m.worker)]; w.who && !w.killed)
              kill_hung(reg, w, *slots[static_cast<size_t>(m.worker)],
                        static_cast<size_t>(m.worker), "is deadlocked: " + d.describe());
        self->delayed_send(self, tick, heartbeat_tick_atom::value);
      },
  };
}

} // namespace

void configure_network(caf::actor_system_config& cfg) {
  cfg.load<caf::io::middleman>();
  // A peer that stops answering is dropped after the connection timeout:
  // its actors go down, and monitors fire.
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(500)});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(5)});
  cfg.add_message_type<worker_request_file>("troupe.worker_request");
  cfg.add_message_type<worker_entry>("troupe.worker_entry");
  cfg.add_message_type<worker_replaced>("troupe.worker_replaced");
}

// ---- the worker process ------------------------------------------------------------

int run_worker(const worker_options& o) {
  caf::actor_system_config cfg;
  actors::configure(cfg);
  configure_network(cfg);
  caf::actor_system sys{cfg};
  auto where = "worker " + std::to_string(o.rank) + " (role " + o.role + ")";
  auto driver = sys.middleman().remote_actor(o.driver_host, o.driver_port);
  if (!driver) {
    std::fprintf(stderr, "%s: cannot reach the driver at %s:%u: %s\n", where.c_str(),
                 o.driver_host.c_str(), static_cast<unsigned>(o.driver_port),
                 sys.render(driver.error()).c_str());
    return 1;
  }
  auto exit_code = std::make_shared<std::atomic<int>>(0);
  auto rank = static_cast<int32_t>(o.rank);
  auto d = *driver;
  // Detached: building a role loads a model and may wait in a DP
  // rendezvous. The roles it built end with it.
  // NOTE [heartbeats]: the worker actor answers the driver's pings at
  // once, so each role is built on a thread of its own (building loads a
  // model and may wait in a DP rendezvous) and handed back to it.
  struct built {
    std::mutex mu;
    std::vector<caf::actor> roles;
    std::map<uint64_t, caf::response_promise> open;
    uint64_t next = 0;
  };
  auto self_actor = sys.spawn<caf::detached>([=](caf::event_based_actor* self) -> caf::behavior {
    auto st = std::make_shared<built>();
    self->attach_functor([st](const caf::error&) {
      std::lock_guard lock{st->mu};
      for (const auto& r : st->roles)
        caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
    });
    self->monitor(d);
    self->set_down_handler([=](caf::down_msg& dm) {
      if (dm.source != d.address())
        return;
      *exit_code = worker_exit_driver_lost;
      self->quit();
    });
    return {
        [=](worker_ping_atom, int64_t x) { return std::make_tuple(x, rank); },
        [=](spawn_role_atom, const actors::rl::role_spec& spec) -> caf::result<caf::actor> {
          auto id = st->next++;
          st->open.emplace(id, self->make_response_promise());
          auto me = caf::actor_cast<caf::actor>(self);
          std::thread([=, &sys = self->system()] {
            auto a = actors::rl::spawn_role(sys, spec, process_factories());
            if (!a) {
              caf::anon_send(me, role_built_atom::value, id, caf::actor{},
                             with_prefix(a.error(), where));
              return;
            }
            {
              std::lock_guard lock{st->mu};
              st->roles.push_back(*a);
            }
            caf::anon_send(me, role_built_atom::value, id, *a, caf::error{});
          }).detach();
          return caf::delegated<caf::actor>{};
        },
        [=](role_built_atom, uint64_t id, caf::actor& a, caf::error& err) {
          auto it = st->open.find(id);
          if (it == st->open.end())
            return;
          if (err)
            it->second.deliver(std::move(err));
          else
            it->second.deliver(std::move(a));
          st->open.erase(it);
        },
        [=](shutdown_atom) { self->quit(); },
        [=](worker_hung_atom) { // NOTE [deadlocked collectives]: a role's thread is stuck
          std::fprintf(stderr, "%s: the driver found it hung; ending\n", where.c_str());
          std::fflush(stdout);
          std::fflush(stderr);
          ::raise(SIGKILL);
        },
    };
  });
  bool registered = false;
  {
    caf::scoped_actor s{sys};
    s->request(d, std::chrono::milliseconds(o.timeout_ms), register_atom::value, rank,
               static_cast<int64_t>(::getpid()), self_actor)
        .receive(
            [&](uint16_t port, int64_t tick_ms) {
              registered = true;
              if (port == 0)
                return;
              if (auto ok = start_heartbeats(o.driver_host, port,
                                             {rank, static_cast<int64_t>(::getpid())},
                                             std::chrono::milliseconds(tick_ms));
                  !ok)
                std::fprintf(stderr, "%s: %s\n", where.c_str(), describe(ok.error()).c_str());
            },
            [&](caf::error& e) {
              std::fprintf(stderr, "%s: registration failed: %s\n", where.c_str(),
                           sys.render(e).c_str());
            });
  }
  if (!registered) {
    caf::anon_send_exit(self_actor, caf::exit_reason::user_shutdown);
    return 1;
  }
  sys.await_all_actors_done();
  if (*exit_code == worker_exit_driver_lost)
    std::fprintf(stderr, "%s: the driver went away; exiting\n", where.c_str());
  // Every actor is done, but CAF 0.17's actor_system destructor can wait
  // forever for a detached actor's thread when the driver's side still
  // held a reference to it as the connection closed. Nothing is left to
  // flush but the standard streams: end here.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(*exit_code);
}

// ---- the launcher --------------------------------------------------------------------

struct worker_set::impl {
  caf::actor_system* sys = nullptr;
  std::shared_ptr<registry> reg;
  caf::actor registrar;
  uint16_t port = 0;
  std::vector<std::string> roles;
  /// Per worker: its node's name ("" = local) and address.
  std::vector<std::string> nodes;
  std::vector<std::string> hosts;
  /// Local workers: the processes (empty for remote ones).
  std::vector<local_process> procs;
  std::vector<worker_info> infos;
  std::vector<std::string> logs;
  /// Local workers: how often each was started again (NOTE [supervision]),
  /// and the signal that ended each earlier process.
  std::vector<int> restarts;
  std::vector<std::vector<int>> ended_signals;
  launch_options options;
  /// NOTE [heartbeats]: pings the workers (unset: heartbeats off).
  caf::actor dog;
  /// How long revive waits for a lost worker's process to be reaped, and
  /// for a sign (its end, its connection's) that a worker was lost at all.
  static constexpr int64_t revive_wait_ms = 2000;
  static constexpr int64_t revive_settle_ms = 300;

  ~impl() {
    {
      std::lock_guard lock{reg->mu};
      reg->shutting_down = true;
    }
    if (dog)
      caf::anon_send_exit(dog, caf::exit_reason::user_shutdown);
    procs.clear(); // SIGKILL + reap whatever still runs
    if (registrar) {
      [[maybe_unused]] auto ok = sys->middleman().unpublish(registrar, 0);
      caf::anon_send_exit(registrar, caf::exit_reason::user_shutdown);
    }
  }

  bool remote() const { return procs.empty(); }

  std::string name(size_t r) const {
    int64_t pid = 0;
    if (!remote())
      pid = procs[r].pid();
    else if (r < infos.size())
      pid = infos[r].pid;
    return "worker " + std::to_string(r) + " (role " + roles[r] +
           (nodes[r].empty() ? "" : ", node " + nodes[r]) +
           (pid > 0 ? ", pid " + std::to_string(pid) : "") + ")";
  }

  std::string log_hint(size_t r) const {
    return r >= logs.size() || logs[r].empty() ? "" : " (output: " + logs[r] + ")";
  }

  // A process that ended, or a lost connection; empty when all are well.
  caf::error first_failure() {
    for (size_t r = 0; r < procs.size(); ++r)
      if (auto st = procs[r].poll())
        return make_error(errc::process_failed, name(r) + " " + st->describe() + log_hint(r));
    std::optional<std::pair<size_t, std::string>> lost;
    {
      std::lock_guard lock{reg->mu};
      if (!reg->lost.empty())
        lost = reg->lost.front();
    }
    if (!lost)
      return {};
    // A dead process usually drops its connection first: give it a moment
    // to be reaped, so the error says how it ended.
    if (!remote())
      if (auto st = procs[lost->first].wait_for(1000))
        return make_error(errc::process_failed,
                          name(lost->first) + " " + st->describe() + log_hint(lost->first));
    return make_error(errc::unavailable, lost->second);
  }

  expected<void> publish(const launch_options& o) {
    reg = std::make_shared<registry>();
    reg->slots.resize(roles.size());
    reg->roles = roles, reg->nodes = nodes, reg->hosts = hosts;
    auto bind = o.remote ? o.remote->bind_host : std::string{"127.0.0.1"};
    if (o.heartbeat_ms > 0) {
      auto beats = heartbeat_receiver::open(bind);
      if (!beats)
        return with_prefix(beats.error(), "launch workers");
      reg->beats = std::move(*beats);
      reg->tick_ms = heartbeat_tick(std::chrono::milliseconds(o.heartbeat_ms)).count();
    }
    registrar = sys->spawn(cluster::registrar, reg);
    auto p = sys->middleman().publish(registrar, 0, bind.c_str());
    if (!p)
      return make_error(errc::io_error, "launch workers: cannot publish the registrar on " + bind + ": " +
                                            sys->render(p.error()));
    port = *p;
    return {};
  }

  std::string registrar_address(const launch_options& o) const {
    auto host = o.remote ? o.remote->bind_host : std::string{"127.0.0.1"};
    if (host.find(':') != std::string::npos)
      host = "[" + host + "]";
    return host + ":" + std::to_string(port);
  }

  // Starts local worker `r` (its output in `log`, "" = inherited).
  expected<local_process> start_one(size_t r, const std::string& log) const {
    worker_start ws;
    ws.rank = static_cast<int32_t>(r);
    ws.world = static_cast<int32_t>(roles.size());
    ws.label = roles[r];
    ws.driver = registrar_address(options);
    ws.timeout_ms = options.timeout_ms;
    process_spec spec;
    spec.name = "worker " + std::to_string(r);
    spec.argv = worker_argv(options.executable, ws);
    spec.output_path = log;
    auto p = local_process::spawn(spec);
    if (!p)
      return with_prefix(p.error(), "launch workers: rank " + std::to_string(r));
    return p;
  }

  std::string log_path(size_t r, int restart) const {
    if (options.log_dir.empty())
      return "";
    auto name = "worker-" + std::to_string(r) +
                (restart > 0 ? ".restart-" + std::to_string(restart) : "") + ".log";
    return (std::filesystem::path{options.log_dir} / name).string();
  }

  expected<void> start_local() {
    if (!options.log_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(options.log_dir, ec);
    }
    for (size_t r = 0; r < roles.size(); ++r) {
      logs.push_back(log_path(r, 0));
      auto p = start_one(r, logs.back());
      if (!p)
        return p.error();
      procs.push_back(std::move(*p));
    }
    return {};
  }

  // Why the watchdog killed worker `r` ("" when it did not: NOTE [heartbeats]).
  std::string hung_reason(size_t r) const {
    std::lock_guard lock{reg->mu};
    for (const auto& [rank, why] : reg->hung)
      if (rank == r)
        return why;
    return "";
  }

  bool connection_lost(size_t r) {
    std::lock_guard lock{reg->mu};
    return std::any_of(reg->lost.begin(), reg->lost.end(),
                       [r](const auto& l) { return l.first == r; });
  }

  // NOTE [supervision]: worker `r` again, when its process ended or lost
  // its connection (killed first: fencing); a worker that still runs
  // connected is kept. The lost role's proxy usually hears of the end
  // before this process reaps the child, and the registry of the closed
  // connection at about the same moment: wait a moment for either (a DP
  // role's surviving ranks' workers run on: they cost this moment only).
  expected<void> revive(size_t r) {
    if (remote())
      return revive_remote(r);
    auto ended = procs[r].wait_for(0);
    const auto t0 = std::chrono::steady_clock::now();
    while (!ended && !connection_lost(r)) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(revive_settle_ms))
        return {}; // its actor ended, not the process
      ended = procs[r].wait_for(20);
    }
    if (!ended) // its connection closed: a moment to end before the kill
      ended = procs[r].wait_for(revive_wait_ms);
    if (!ended) {
      procs[r].kill(SIGKILL);
      ended = procs[r].wait_for(options.timeout_ms);
    }
    ended_signals[r].push_back(ended ? ended->signal : 0);
    forget(r);
    logs[r] = log_path(r, ++restarts[r]);
    auto p = start_one(r, logs[r]);
    if (!p)
      return p.error();
    procs[r] = std::move(*p);
    return await_registration(r, options.timeout_ms);
  }

  // Worker `r`'s registration and the news of its loss are forgotten: a
  // new process takes its place.
  void forget(size_t r) {
    std::lock_guard lock{reg->mu};
    reg->slots[r].reset();
    auto of_r = [r](const auto& l) { return l.first == r; };
    reg->lost.erase(std::remove_if(reg->lost.begin(), reg->lost.end(), of_r), reg->lost.end());
    reg->hung.erase(std::remove_if(reg->hung.begin(), reg->hung.end(), of_r), reg->hung.end());
  }

  // NOTE [replacing a worker]: a worker on a node whose connection closed
  // (its process or its node ended; a hung one once its connection times
  // out) is asked of the controller again; one still connected is kept.
  expected<void> revive_remote(size_t r) {
    const auto t0 = clock_type::now();
    // A hung worker's connection times out (the middleman's 5 s) before
    // its agent may start it again.
    const auto settle =
        std::chrono::milliseconds(hung_reason(r).empty() ? revive_settle_ms : 10'000);
    while (!connection_lost(r)) {
      if (clock_type::now() - t0 > settle)
        return {}; // its actor ended, not the worker
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const auto& remote = *options.remote;
    if (!remote.replace_worker)
      return make_error(errc::unsupported,
                        "restarting " + name(r) + ": no controller to ask for it again");
    worker_entry x{static_cast<int32_t>(r), remote.node_of[r], roles[r],
                   r < remote.restartable.size() && remote.restartable[r]};
    forget(r); // before the new one may register
    auto placed = remote.replace_worker(x);
    if (!placed)
      return with_prefix(placed.error(), "restarting " + name(r));
    {
      std::lock_guard lock{reg->mu};
      reg->nodes[r] = nodes[r] = placed->name;
      reg->hosts[r] = hosts[r] = placed->host;
      if (reg->slots[r]) // it registered before this answer came
        reg->slots[r]->node = placed->name, reg->slots[r]->host = placed->host;
    }
    ended_signals[r].push_back(0);
    ++restarts[r];
    return await_registration(r, options.timeout_ms);
  }

  // NOTE [remote workers]: the controller hears of them on the driver link
  // and asks the nodes' agents to start them.
  expected<void> request_remote(const launch_options& o) {
    worker_request_file w;
    w.pid = ::getpid();
    w.driver = registrar_address(o);
    std::error_code ec;
    w.cwd = std::filesystem::current_path(ec).string();
    w.timeout_ms = o.timeout_ms;
    for (size_t r = 0; r < roles.size(); ++r)
      w.workers.push_back({static_cast<int32_t>(r), o.remote->node_of[r], roles[r],
                           r < o.remote->restartable.size() && o.remote->restartable[r]});
    if (!o.remote->ask_for_workers)
      return make_error(errc::invalid_argument, "launch workers: on nodes, but no controller to ask");
    o.remote->ask_for_workers(w);
    return {};
  }

  bool all_registered() const {
    return std::all_of(reg->slots.begin(), reg->slots.end(), [](const auto& s) { return s.has_value(); });
  }

  std::string missing() const {
    std::string out;
    for (size_t r = 0; r < roles.size(); ++r)
      if (!reg->slots[r])
        out += (out.empty() ? "" : ", ") + name(r) + log_hint(r);
    return out;
  }

  // Worker `r` ended again, or lost its connection; empty when well.
  caf::error failure_of(size_t r) {
    if (!remote())
      if (auto st = procs[r].poll())
        return make_error(errc::process_failed, name(r) + " " + st->describe() + log_hint(r));
    std::lock_guard lock{reg->mu};
    for (const auto& [rank, why] : reg->lost)
      if (rank == r)
        return make_error(errc::unavailable, why);
    return {};
  }

  // Waits for worker `r`'s registration (a revived one: the others may be
  // lost too, each revived in its turn), watching it meanwhile.
  expected<void> await_registration(size_t r, int64_t timeout_ms) {
    auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      {
        std::unique_lock lock{reg->mu};
        reg->cv.wait_for(lock, std::chrono::milliseconds(20));
        if (reg->slots[r]) {
          infos[r] = *reg->slots[r];
          return {};
        }
      }
      if (auto err = failure_of(r))
        return with_prefix(err, "restarting " + name(r) + ": before registering");
      if (clock_type::now() >= deadline)
        return make_error(errc::timeout, "restarting " + name(r) + ": not registered after " +
                                             std::to_string(timeout_ms) + " ms" + log_hint(r));
    }
  }

  // Waits for every registration, watching the processes meanwhile.
  expected<void> await_registrations(int64_t timeout_ms) {
    auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      {
        std::unique_lock lock{reg->mu};
        reg->cv.wait_for(lock, std::chrono::milliseconds(20));
        if (all_registered())
          break;
      }
      if (auto err = first_failure())
        return with_prefix(err, "launch workers: before registering");
      if (clock_type::now() >= deadline) {
        std::lock_guard lock{reg->mu};
        return make_error(errc::timeout, "launch workers: not registered after " +
                                             std::to_string(timeout_ms) + " ms: " + missing());
      }
    }
    std::lock_guard lock{reg->mu};
    infos.clear();
    for (auto& slot : reg->slots)
      infos.push_back(*slot);
    return {};
  }
};

worker_set::worker_set() = default;
worker_set::~worker_set() = default;
worker_set::worker_set(worker_set&&) noexcept = default;
worker_set& worker_set::operator=(worker_set&&) noexcept = default;

expected<worker_set> worker_set::launch(caf::actor_system& sys, const launch_options& o) {
  if (o.roles.empty())
    return make_error(errc::invalid_argument, "launch workers: no roles");
  if (o.timeout_ms <= 0)
    return make_error(errc::invalid_argument, "launch workers: timeout_ms must be positive");
  auto n = o.roles.size();
  if (o.remote && o.remote->node_of.size() != n)
    return make_error(errc::invalid_argument, "launch workers: " + std::to_string(n) + " workers but " +
                                                  std::to_string(o.remote->node_of.size()) + " nodes given");
  worker_set out;
  out.impl_ = std::make_unique<impl>();
  auto& d = *out.impl_;
  d.sys = &sys;
  d.roles = o.roles;
  for (size_t r = 0; r < n; ++r) {
    if (!o.remote) {
      d.nodes.emplace_back();
      d.hosts.emplace_back("127.0.0.1");
      continue;
    }
    auto k = o.remote->node_of[r];
    if (k < 0 || static_cast<size_t>(k) >= o.remote->nodes.size())
      return make_error(errc::invalid_argument, "launch workers: worker " + std::to_string(r) + " on node " +
                                                    std::to_string(k) + " of " +
                                                    std::to_string(o.remote->nodes.size()));
    d.nodes.push_back(o.remote->nodes[static_cast<size_t>(k)].name);
    d.hosts.push_back(o.remote->nodes[static_cast<size_t>(k)].host);
  }
  if (auto ok = d.publish(o); !ok)
    return ok.error();
  d.options = o;
  if (auto ok = o.remote ? d.request_remote(o) : d.start_local(); !ok)
    return ok.error();
  d.restarts.assign(n, 0);
  d.ended_signals.assign(n, {});
  if (auto ok = d.await_registrations(o.timeout_ms); !ok)
    return ok.error();
  if (o.heartbeat_ms > 0)
    d.dog = sys.spawn(watchdog, d.reg, std::chrono::milliseconds(o.heartbeat_ms));
  return out;
}

const std::vector<worker_info>& worker_set::workers() const {
  static const std::vector<worker_info> none;
  return impl_ ? impl_->infos : none;
}

caf::error worker_set::check() {
  if (!impl_)
    return {};
  return impl_->first_failure();
}

caf::error worker_set::wait_for_failure(int64_t timeout_ms) {
  if (!impl_)
    return {};
  auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    if (auto err = impl_->first_failure())
      return err;
    auto now = clock_type::now();
    if (now >= deadline)
      return {};
    std::unique_lock lock{impl_->reg->mu};
    impl_->reg->cv.wait_for(lock, std::min<clock_type::duration>(std::chrono::milliseconds(20),
                                                                 deadline - now));
  }
}

expected<void> worker_set::revive(int rank) {
  if (!impl_ || rank < 0 || static_cast<size_t>(rank) >= impl_->roles.size())
    return make_error(errc::out_of_range, "revive: no worker " + std::to_string(rank));
  return impl_->revive(static_cast<size_t>(rank));
}

std::string worker_set::hung(int rank) const {
  return impl_ && rank >= 0 ? impl_->hung_reason(static_cast<size_t>(rank)) : "";
}

int worker_set::generation(int rank) const {
  if (!impl_ || rank < 0 || static_cast<size_t>(rank) >= impl_->restarts.size())
    return 0;
  return impl_->restarts[static_cast<size_t>(rank)];
}

int worker_set::exit_signal(int rank, int64_t timeout_ms, int generation) {
  if (!impl_ || rank < 0 || static_cast<size_t>(rank) >= impl_->procs.size())
    return 0;
  const auto& earlier = impl_->ended_signals[static_cast<size_t>(rank)];
  if (generation >= 0 && static_cast<size_t>(generation) < earlier.size())
    return earlier[static_cast<size_t>(generation)];
  auto st = impl_->procs[static_cast<size_t>(rank)].wait_for(timeout_ms);
  return st ? st->signal : 0;
}

expected<void> worker_set::shutdown(int64_t timeout_ms) {
  if (!impl_)
    return {};
  auto& d = *impl_;
  size_t connected = 0; // the connections to see close: a lost one closed already
  {
    std::lock_guard lock{d.reg->mu};
    d.reg->shutting_down = true;
    for (size_t r = 0; r < d.reg->slots.size(); ++r)
      if (d.reg->slots[r] && std::none_of(d.reg->lost.begin(), d.reg->lost.end(),
                                          [r](const auto& l) { return l.first == r; }))
        ++connected;
  }
  if (d.dog)
    caf::anon_send_exit(d.dog, caf::exit_reason::user_shutdown);
  for (const auto& w : d.infos)
    caf::anon_send(w.handle, shutdown_atom::value);
  std::string failures;
  auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
  if (d.remote()) {
    // Their agents see the processes end; here, their connections close.
    std::unique_lock lock{d.reg->mu};
    if (!d.reg->cv.wait_until(lock, deadline, [&] { return d.reg->gone >= connected; }))
      failures = std::to_string(connected - d.reg->gone) + " of " + std::to_string(connected) +
                 " remote workers did not close their connections within " +
                 std::to_string(timeout_ms) + " ms (their agents end them)";
  }
  for (size_t r = 0; r < d.procs.size(); ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    auto st = d.procs[r].wait_for(std::max<int64_t>(1, left.count()));
    if (!st) {
      d.procs[r].kill(SIGKILL);
      failures += (failures.empty() ? "" : "; ") + d.name(r) + " did not exit within " +
                  std::to_string(timeout_ms) + " ms (killed)";
    } else if (!st->ok() && d.hung_reason(r).empty()) {
      // (one the watchdog killed as hung was dealt with: NOTE [heartbeats])
      failures += (failures.empty() ? "" : "; ") + d.name(r) + " " + st->describe() + d.log_hint(r);
    }
  }
  if (!failures.empty())
    return make_error(errc::process_failed, "shutdown: " + failures);
  return {};
}

} // namespace troupe::cluster
