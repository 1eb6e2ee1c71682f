#pragma once
// The controller's inside, shared by its source files and by nothing else:
// controller.cpp (records, events, commands, the public face),
// controller_jobs.cpp (admission, drivers, nodes, the supervising loop),
// controller_restart.cpp (NOTE [controller restart]), controller_submit.cpp
// and controller_cursor.cpp. The decisions themselves live in
// controller_core.hpp (NOTE [controller core]).
//
// NOTE [supervision by events]: the supervising thread sleeps until there
// is news, and then looks at every job: a driver process that ended (its
// pidfd, process_watch.hpp), a file in a starting job's folder (driver.json
// published, workers.json asked for), an event or a lost connection from a
// driver (its feed), node news (the registry's listeners), a command that
// changes the queue (submit, cancel, resume, shutdown), or the earliest
// deadline (a driver that must publish its job by then, a failed attach
// tried again). There is no fixed polling period.

#include "cluster/controller.hpp"
#include "cluster/controller_core.hpp"
#include "cluster/driver_link.hpp"
#include "cluster/job_nodes.hpp"
#include "cluster/job_store.hpp"
#include "cluster/local_launcher.hpp"
#include "cluster/process_watch.hpp"
#include "actors/rl/job_config.hpp"

#include <caf/all.hpp>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace troupe::cluster {

namespace j = actors::job;
namespace fs = std::filesystem;

inline int64_t now_us() {
  return j::now_us();
}

// The controller's knowledge of one job. Guarded by controller::impl::mu.
struct job_entry {
  job_record rec;
  /// Its state and moves (NOTE [controller core]).
  job_book book;
  ctl_state state() const { return book.state(); }
  j::job_status status;
  std::vector<j::role_changed> roles;
  /// Every event of the journal so far, while the job is not final (the
  /// events of a final job are read from its journal when asked for).
  std::vector<j::event> events;
  job_totals totals;
  /// The config with every accepted runtime setting (checks UpdateJob).
  std::shared_ptr<actors::rl::job_config> cfg;
  /// Stage clock for the ETA (from the events' times).
  int64_t stage_start_us = 0;
  int64_t stage_from = 0;
  int64_t paused_us = 0;
  int64_t paused_since_us = 0;
  /// The driver: our child (proc), or one found running after a restart.
  std::optional<local_process> proc;
  bool driver_alive = false;
  /// Waiting for driver.json until this time (0 = not starting).
  int64_t attach_deadline_us = 0;
  /// Not before this time: the next try to attach (the last one failed).
  int64_t attach_retry_us = 0;
  bool attaching = false;
  std::optional<j::job_actor> actor;
  caf::actor feed;
  /// last_metrics etc. of a final job were folded from its journal.
  bool status_loaded = false;
  /// Cursors waiting for more events.
  std::vector<std::function<void()>> waiters;
  /// Workers on nodes (NOTE [remote workers]): decided at admission; the
  /// node of each node of the plan, the devices it holds there, and whether
  /// the workers were asked for.
  bool on_nodes = false;
  std::vector<std::string> nodes;
  std::vector<int64_t> node_need;
  bool need_known = false;
  bool workers_sent = false;
  /// The driver's request for its workers, its front (NOTE [driver link]),
  /// and the workers it asked for again that have no node yet (NOTE
  /// [replacing a worker] in job_nodes.hpp).
  std::optional<worker_request_file> asked;
  caf::actor front;
  std::vector<worker_entry> replacements;
  /// Why a queued job waits, or a running one waits for a node.
  std::string wait_reason;
  /// The controller's own reason for failing the job (a node lost), kept
  /// ahead of whatever the driver says.
  std::string verdict;
};

/// Whether `pid` is a `troupe driver` of `job_dir` (pids are reused).
bool is_driver_of(int64_t pid, const std::string& job_dir);

// ---- the controller ------------------------------------------------------

struct controller::impl : std::enable_shared_from_this<impl> {
  explicit impl(caf::actor_system& s) : sys(s) {}

  caf::actor_system& sys;
  controller_options opt;
  std::unique_ptr<job_store> store;
  std::unique_ptr<node_registry> nodes;
  std::string jobs_root;
  int lock_fd = -1;

  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::shared_ptr<job_entry>> jobs;
  admission adm;
  bool accepting = true;
  bool stopping = false;
  bool shut_down = false;
  std::thread supervisor;
  /// From the node registry's listeners, for the supervisor (which alone
  /// talks to agents, never with `mu` held: an agent's stream calls the
  /// listeners with its own lock held).
  std::vector<node_view> lost_nodes;
  std::vector<std::pair<std::string, worker_exit>> worker_exits;
  /// Commands for agents, sent by the supervisor once `mu` is released.
  std::vector<std::pair<std::string, node_command>> outbox;
  /// NOTE [replacing a worker]: a StartWorker for a worker started again,
  /// and the answer its driver gets once the node took it.
  struct replacement_send {
    std::string job;
    worker_entry entry;
    std::string node;
    worker_start start;
    caf::actor front;
    worker_replaced answer;
  };
  std::vector<replacement_send> replacement_sends;
  /// NOTE [supervision by events]: wakes the supervisor when a driver
  /// process ends or a file lands in a starting job's folder (driver.json,
  /// workers.json). Declared after `mu` and `cv`, which its thread uses: it
  /// is destroyed (its thread joined) first.
  std::unique_ptr<process_watch> watch;
  std::atomic<int64_t> rounds{0};

  ~impl();

  // ---- records and views (mu held) ----

  void persist(job_entry& e);

  // Moves the job when the move is legal and not a replayed event's (NOTE
  // [controller core]), and records it.
  void set_state(job_entry& e, ctl_state s, const std::string& reason, int64_t time_us);

  job_view view_of(const job_entry& e) const;

  double eta_of(const job_entry& e) const;

  std::shared_ptr<job_entry> find(const std::string& id);

  caf::error unknown(const std::string& id) const;

  // ---- events (mu held) ----

  void apply_event(job_entry& e, const j::event& ev);

  void on_body(job_entry& e, const j::event& ev, const j::stage_started& b);
  void on_body(job_entry& e, const j::event&, const j::stage_finished& b);
  void on_body(job_entry& e, const j::event&, const j::checkpoint_saved&) { e.rec.resumable = true; }
  void on_body(job_entry& e, const j::event&, const j::role_changed& b);
  void on_body(job_entry& e, const j::event&, const j::setting_updated& b);
  void on_body(job_entry& e, const j::event& ev, const j::state_changed& b);
  template <class T>
  void on_body(job_entry&, const j::event&, const T&) {}

  std::vector<std::function<void()>> take_waiters(job_entry& e) {
    std::vector<std::function<void()>> out;
    out.swap(e.waiters);
    return out;
  }

  // The journal's events after the last one seen (a driver that ended, or
  // a gap in the feed).
  void catch_up(job_entry& e);

  // A job that reached a final state: records written, memory released.
  void finalize(job_entry& e);

  // ---- the supervisor's work (mu held) ----

  // Cores a job takes on this machine: its driver only, when its workers
  // run on nodes.
  int64_t local_cores(const job_entry& e) const;

  std::vector<running_job> running_jobs() const;

  // What admission needs to know of a queued job (its plan's nodes, once).
  admission_request request_of(job_entry& e);

  // Starts queued jobs in order while admission says they fit.
  void admit();

  // ---- jobs on nodes (mu held; NOTE [remote workers]) ----

  // nodes.json for the driver: where its workers run.
  bool write_nodes(job_entry& e, const std::vector<std::string>& picked);

  // The driver asked for its workers (NOTE [driver link]): a StartWorker
  // per worker for its node's agent, or the reason the job cannot have them.
  std::optional<std::string> request_workers(job_entry& e, const worker_request_file& w);

  // Ends the job with `reason` now: the controller's own verdict (a node
  // lost, a worker that could not start), recorded before its driver is
  // killed so that the driver's end reports it.
  void fail_job(job_entry& e, const std::string& reason);

  // What the job was doing on node `node` when it was lost.
  std::string loss_reason(const job_entry& e, const node_view& n) const;

  // A node lost while the job ran there: the controller fails the job, or,
  // when the driver failed it first (a collective with a rank on that node
  // broke), says in its error what happened to the node.
  void on_node_lost(job_entry& e, const node_view& n);

  // Lost nodes and worker exits the registry reported.
  void handle_node_news();

  // ---- replacing workers (NOTE [replacing a worker]; mu held) ----

  // Whether every worker of `e` on node `node` may be restarted by its
  // driver (which then asks for them again).
  bool recoverable_on(const job_entry& e, const std::string& node) const;

  // Starts each of the job's replacements that a node can take now and
  // answers its driver; the others wait, the reason in wait_reason.
  void place_replacements(job_entry& e);
  std::optional<std::string> place_replacement(job_entry& e, const worker_entry& x,
                                               const std::vector<node_view>& ready,
                                               const std::map<std::string, int64_t>& used);
  // Without `mu`: the StartWorkers, and each answer once its node took it.
  void send_replacements(const std::vector<replacement_send>& sends);
  // Without `mu`: refuses the replacements job `id` waits for (`why`).
  void give_up_replacements(const std::string& id, const std::string& why);

  void start_driver(job_entry& e);

  // Drivers that ended, and drivers whose job actor is ready to attach.
  void poll_drivers(std::vector<std::pair<std::string, driver_info>>& to_attach,
                    std::vector<std::function<void()>>& wake);

  void on_driver_exit(job_entry& e, const std::string& how);

  void attach(const std::string& id, const driver_info& info);
  /// What the driver link answered (NOTE [driver link]); without `mu`.
  void on_workers(const std::string& id, const worker_request_file& w);
  void on_job(const std::string& id, const j::job_actor& job);
  void on_replace(const std::string& id, const worker_entry& x);

  void supervise();
  /// The earliest time the supervisor must look again without news.
  std::optional<int64_t> next_deadline_us() const;
  /// A driver is watched while it runs (its process and its job folder).
  void watch_driver(job_entry& e);
  void unwatch_driver(job_entry& e);

  // Without `mu`. A StartWorker its node cannot take fails the job (the
  // next round: the node is lost, or gone).
  void send_to_agents(const std::vector<std::pair<std::string, node_command>>& sends);

  // ---- submit (no lock) ----

  expected<job_record> validate(const submit_request& r, std::shared_ptr<actors::rl::job_config>& cfg_out);

  // ---- commands ----

  template <class... Ts>
  void ask(std::shared_ptr<job_entry> e, j::job_actor actor, reply done, Ts... xs);
  /// A command for the job actor of `id`, or the reason it cannot take one.
  template <class... Ts>
  void forward(const std::string& id, std::string_view what, reply done, Ts... xs);
  expected<j::job_actor> actor_for(job_entry& e, std::string_view what);

  // ---- restart ----

  expected<void> load_records();
  void recover(job_entry& e);
  void reattach(job_entry& e);
  void load_journal_status(job_entry& e);
};

// The controller's end of a driver link (NOTE [driver link]): asks the
// driver's front for its job actor and, for a job on nodes, its workers
// and then each worker it wants again; subscribes to the job's events
// from `from`, hands each to the controller, and tells it when the
// driver's connection goes down.
caf::behavior driver_contact(caf::event_based_actor* self, std::weak_ptr<controller::impl> ctl,
                             std::string id, caf::actor front, bool on_nodes, int64_t from,
                             double timeout_s);

} // namespace troupe::cluster
