// The control plane's subcommands on the CLI (apps/control.hpp).
#include "apps/cli.hpp"
#include "apps/control.hpp"

#include <CLI/CLI.hpp>

#include <map>
#include <memory>
#include <string>

namespace troupe::apps {

namespace {

void add_client_flags(CLI::App* cmd, client_flags& c) {
  cmd->add_option("--address", c.address, "Controller HOST:PORT (or TROUPE_ADDRESS)")->group("Connection");
  cmd->add_option("--token-file", c.token_file, "File with the API token (or TROUPE_TOKEN_FILE)")
      ->group("Connection");
  cmd->add_option("--token", c.token, "The API token itself (visible to `ps`; prefer --token-file)")
      ->group("Connection");
  cmd->add_option("--state-dir", c.state_dir,
                  "A local controller's state dir: its address and token (or TROUPE_STATE_DIR)")
      ->group("Connection");
  cmd->add_option("--tls-ca", c.tls_ca, "PEM CA of the controller's certificate (or TROUPE_TLS_CA)")
      ->group("Connection");
  cmd->add_option("--tls-cert", c.tls_cert, "PEM client certificate, mutual TLS (or TROUPE_TLS_CERT)")
      ->group("Connection");
  cmd->add_option("--tls-key", c.tls_key, "PEM client key (or TROUPE_TLS_KEY)")->group("Connection");
  cmd->add_option("--timeout", c.timeout_s, "Seconds to wait for each answer")->group("Connection");
}

struct control_flags {
  controller_command_options ctl;
  client_flags client;
  submit_command_options submit;
  std::vector<std::string> states;
  int limit = 0;
  std::string id;
  bool json = false;
  bool follow = false;
  int lines = 0;
  bool now = false;
  std::vector<std::string> settings;
  std::vector<std::string> keys;
  node_command_options node;
  slurm_run_options slurm;
};

// `troupe node` (an agent; its own connection flags: no API token) and
// `troupe nodes`.
void add_node_commands(CLI::App& app, const std::shared_ptr<control_flags>& f, std::vector<runner>& out) {
  auto* node = app.add_subcommand("node", "Join this machine to a controller as a node agent (docs/cluster.md)");
  node->add_option("--controller", f->client.address,
                   "Controller HOST:PORT (default: TROUPE_ADDRESS, or a controller on this machine)");
  node->add_option("--secret", f->node.secret_file,
                   "File with the cluster secret (the controller's <state dir>/cluster_secret; mode 600)");
  node->add_option("--name", f->node.name, "Node name (default: the host name)");
  node->add_option("--advertise", f->node.advertise,
                   "Address the driver and other nodes reach this node at (default: as the controller "
                   "sees this agent)");
  node->add_option("--cores", f->node.cores, "Cores to offer (default: this process's CPU affinity)")
      ->check(CLI::NonNegativeNumber);
  node->add_option("--memory-gb", f->node.memory_gb, "Memory to offer, GiB (default: the machine's)")
      ->check(CLI::NonNegativeNumber);
  node->add_option("--gpus", f->node.gpus, "GPUs to offer (default: those visible)")->check(CLI::NonNegativeNumber);
  node->add_option("--reconnect-s", f->node.reconnect_s,
                   "Seconds to keep trying to reach the controller before giving up")
      ->check(CLI::PositiveNumber);
  node->add_option("--state-dir", f->client.state_dir, "A local controller's state dir (its address and secret)");
  node->add_option("--work-dir", f->node.work_dir,
                   "Where the workers' output goes, by job (default: <tmp>/troupe-node-<name>)");
  node->add_option("--tls-ca", f->client.tls_ca, "PEM CA of the controller's certificate")->group("Connection");
  node->add_option("--tls-cert", f->client.tls_cert, "PEM client certificate, mutual TLS")->group("Connection");
  node->add_option("--tls-key", f->client.tls_key, "PEM client key")->group("Connection");
#ifdef TROUPE_VERSION
  f->node.version = TROUPE_VERSION;
#endif
  out.push_back([=]() -> std::optional<int> {
    return node->parsed() ? std::optional<int>{node_command(f->client, f->node)} : std::nullopt;
  });

  auto* nodes = app.add_subcommand("nodes", "List the node agents: state, address, resources, last heartbeat");
  nodes->add_flag("--json", f->json, "As JSON");
  add_client_flags(nodes, f->client);
  out.push_back([=]() -> std::optional<int> {
    return nodes->parsed() ? std::optional<int>{nodes_command(f->client, f->json)} : std::nullopt;
  });
}

// `troupe slurm run`: a job inside a Slurm allocation.
void add_slurm_commands(CLI::App& app, const std::shared_ptr<control_flags>& f, std::vector<runner>& out) {
  auto* slurm = app.add_subcommand("slurm", "Run jobs inside a Slurm allocation (docs/cluster.md)");
  slurm->require_subcommand(1);
  auto* srun = slurm->add_subcommand(
      "run", "In an allocation (sbatch, salloc): a controller here, an agent per node (srun), the job; "
             "exits with its result");
  srun->add_option("file", f->slurm.file, "Job YAML file")->required();
  srun->add_option("--set", f->slurm.overrides, "Override a key (repeatable)");
  srun->add_option("--state-dir", f->slurm.state_dir,
                   "The controller's state dir, on a filesystem every node sees (default: "
                   "<submit dir>/troupe-slurm-<job id>)");
  srun->add_option("--start-timeout-s", f->slurm.start_timeout_s, "Bound on the controller and agents starting")
      ->check(CLI::PositiveNumber);
  out.push_back([=]() -> std::optional<int> {
    return srun->parsed() ? std::optional<int>{slurm_run_command(f->slurm)} : std::nullopt;
  });
}

} // namespace

std::vector<runner> add_control_commands(CLI::App& app) {
  auto f = std::make_shared<control_flags>();
  std::vector<runner> out;

  auto* ctl = app.add_subcommand("controller", "Run the controller: the job API, queue and records");
  ctl->add_option("--config", f->ctl.config_path, "Controller YAML file (docs/control.md)");
  ctl->add_option("--listen", f->ctl.listen, "HOST:PORT of the API (default 127.0.0.1:7450)");
  ctl->add_option("--state-dir", f->ctl.state_dir, "Records, token, audit log and the jobs root");
  ctl->add_option("--max-running-jobs", f->ctl.max_running_jobs, "Jobs running at once")
      ->check(CLI::PositiveNumber);
  ctl->add_option("--on-shutdown", f->ctl.on_shutdown, "checkpoint | drain | detach");
  ctl->add_option("--tls-cert", f->ctl.tls_cert, "PEM server certificate (TLS)");
  ctl->add_option("--tls-key", f->ctl.tls_key, "PEM server key");
  ctl->add_option("--tls-client-ca", f->ctl.tls_client_ca, "PEM CA of client certificates (mutual TLS)");
  ctl->add_option("--dashboard", f->ctl.dashboard,
                  "HOST:PORT of the web dashboard and /metrics (default 127.0.0.1:7451), or off");
  ctl->add_option("--advertise", f->ctl.advertise,
                  "The address node agents' workers reach this machine's job drivers at (default: the "
                  "--listen host when it is an address, else this host's name)");
  out.push_back([=]() -> std::optional<int> {
    return ctl->parsed() ? std::optional<int>{controller_command(f->ctl)} : std::nullopt;
  });

  auto* submit = app.add_subcommand("submit", "Submit a job to the controller; prints its id");
  submit->add_option("file", f->submit.file, "Job YAML file")->required();
  submit->add_option("--set", f->submit.overrides, "Override a key (repeatable)");
  submit->add_option("--name", f->submit.name, "Display name (default: run.name)");
  auto* wait = submit->add_flag("--wait", f->submit.wait,
                                "Wait for the end: exit 0 succeeded, 1 failed, 130 cancelled");
  submit->add_flag("--follow", f->submit.follow, "Show progress until the end (exit like --wait)")
      ->excludes(wait);
  add_client_flags(submit, f->client);
  out.push_back([=]() -> std::optional<int> {
    return submit->parsed() ? std::optional<int>{submit_command(f->client, f->submit)} : std::nullopt;
  });

  auto* jobs = app.add_subcommand("jobs", "List jobs, newest first");
  jobs->add_option("--state", f->states, "Only jobs in this state (repeatable)");
  jobs->add_option("--limit", f->limit, "At most this many")->check(CLI::NonNegativeNumber);
  add_client_flags(jobs, f->client);
  out.push_back([=]() -> std::optional<int> {
    return jobs->parsed() ? std::optional<int>{jobs_command(f->client, f->states, f->limit)} : std::nullopt;
  });

  auto* status = app.add_subcommand("status", "A job's state, progress, ETA, key metrics and roles");
  status->add_option("id", f->id, "Job id")->required();
  status->add_flag("--json", f->json, "As JSON");
  add_client_flags(status, f->client);
  out.push_back([=]() -> std::optional<int> {
    return status->parsed() ? std::optional<int>{status_command(f->client, f->id, f->json)} : std::nullopt;
  });

  auto* logs = app.add_subcommand("logs", "A job's log lines");
  logs->add_option("id", f->id, "Job id")->required();
  logs->add_flag("-f,--follow", f->follow, "Keep printing new lines until the job ends");
  logs->add_option("-n,--lines", f->lines, "Only the last N lines first")->check(CLI::NonNegativeNumber);
  add_client_flags(logs, f->client);
  out.push_back([=]() -> std::optional<int> {
    return logs->parsed() ? std::optional<int>{logs_command(f->client, f->id, f->follow, f->lines)}
                          : std::nullopt;
  });

  auto* watch = app.add_subcommand("watch", "A job's live progress until it ends (exit like submit --wait)");
  watch->add_option("id", f->id, "Job id")->required();
  add_client_flags(watch, f->client);
  out.push_back([=]() -> std::optional<int> {
    return watch->parsed() ? std::optional<int>{watch_command(f->client, f->id)} : std::nullopt;
  });

  for (const char* verb : {"cancel", "pause", "resume", "checkpoint"}) {
    static const std::map<std::string, std::string> help{
        {"cancel", "Cancel a job: a checkpoint, then stop (--now: without the checkpoint)"},
        {"pause", "Pause a job at its next phase boundary"},
        {"resume", "Resume a paused job, or queue a lost / failed / cancelled one from its checkpoint"},
        {"checkpoint", "Write a checkpoint at the job's next consistent boundary"}};
    auto* cmd = app.add_subcommand(verb, help.at(verb));
    cmd->add_option("id", f->id, "Job id")->required();
    if (std::string{verb} == "cancel")
      cmd->add_flag("--now", f->now, "Stop at the next boundary without a checkpoint");
    add_client_flags(cmd, f->client);
    out.push_back([=, v = std::string{verb}]() -> std::optional<int> {
      return cmd->parsed() ? std::optional<int>{job_command(f->client, v, f->id, f->now)} : std::nullopt;
    });
  }

  auto* set = app.add_subcommand("set", "Change runtime settings of a running job: troupe set ID k=v ...");
  set->add_option("id", f->id, "Job id")->required();
  set->add_option("settings", f->settings, "KEY=VALUE (rl.kl.coef=0.05, ...)")->required();
  add_client_flags(set, f->client);
  out.push_back([=]() -> std::optional<int> {
    return set->parsed() ? std::optional<int>{set_command(f->client, f->id, f->settings)} : std::nullopt;
  });

  auto* metrics = app.add_subcommand("metrics", "A job's metric series");
  metrics->add_option("id", f->id, "Job id")->required();
  metrics->add_option("--key", f->keys, "Only this key; ending in '/' or '*': a prefix (repeatable)");
  metrics->add_flag("--json", f->json, "One JSON object per step");
  add_client_flags(metrics, f->client);
  out.push_back([=]() -> std::optional<int> {
    return metrics->parsed() ? std::optional<int>{metrics_command(f->client, f->id, f->keys, f->json)}
                             : std::nullopt;
  });
  add_node_commands(app, f, out);
  add_slurm_commands(app, f, out);
  return out;
}

} // namespace troupe::apps
