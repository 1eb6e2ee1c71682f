// The control plane's daemons on the CLI (apps/control.hpp): controller,
// node, slurm run; registered by the engine binary.
#include "apps/cli.hpp"
#include "apps/control.hpp"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

namespace troupe::apps {

namespace {

struct daemon_flags {
  controller_command_options ctl;
  client_flags client;
  node_command_options node;
  slurm_run_options slurm;
};

// `troupe node`: an agent, with connection flags of its own (no API token).
void add_node_commands(CLI::App& app, const std::shared_ptr<daemon_flags>& f, std::vector<runner>& out) {
  auto* node = app.add_subcommand("node", command_help("node"));
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
}

// `troupe slurm run`: a job inside a Slurm allocation.
void add_slurm_commands(CLI::App& app, const std::shared_ptr<daemon_flags>& f, std::vector<runner>& out) {
  auto* slurm = app.add_subcommand("slurm", command_help("slurm"));
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

std::vector<runner> add_daemon_commands(CLI::App& app) {
  auto f = std::make_shared<daemon_flags>();
  std::vector<runner> out;

  auto* ctl = app.add_subcommand("controller", command_help("controller"));
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

  add_node_commands(app, f, out);
  add_slurm_commands(app, f, out);
  return out;
}

} // namespace troupe::apps
