#pragma once
// The control plane's commands (docs/control.md): `troupe controller`, and
// the client — submit, jobs, status, logs, watch, cancel, pause, resume,
// checkpoint, set — with the conventions of `ray job` and `kubectl`.

#include <string>
#include <vector>

namespace troupe::apps {

struct controller_command_options {
  std::string config_path;
  /// Flags over the config file ("" / -1 = the file's value).
  std::string listen;
  std::string state_dir;
  int64_t max_running_jobs = -1;
  std::string on_shutdown;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  /// host:port of the dashboard, "off" for none ("" = the file's value).
  std::string dashboard;
  /// The address nodes' workers reach job drivers at ("" = the file's).
  std::string advertise;
};

/// Runs the controller until SIGINT / SIGTERM; 0 after a clean shutdown.
int controller_command(const controller_command_options& o);

/// Where the client finds the controller: flags, then TROUPE_ADDRESS /
/// TROUPE_TOKEN / TROUPE_TOKEN_FILE / TROUPE_TLS_CA / TROUPE_TLS_CERT /
/// TROUPE_TLS_KEY, then the client file (TROUPE_CLIENT_CONFIG or
/// ~/.config/troupe/client.yaml), then a controller on this machine (its
/// state dir: --state-dir, TROUPE_STATE_DIR or the default).
struct client_flags {
  std::string address;
  std::string token;
  std::string token_file;
  std::string state_dir;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  double timeout_s = 60;
};

struct submit_command_options {
  std::string file;
  std::vector<std::string> overrides;
  std::string name;
  /// Wait for the end (exit status from the final state), showing progress.
  bool wait = false;
  bool follow = false;
  /// With wait / follow: a job still queued with a wait reason after this
  /// many seconds is cancelled, and the reason is the error (0 = wait on).
  double give_up_queued_s = 0;
};

/// Exit statuses of --wait and watch: 0 succeeded, 1 failed or lost, 130
/// cancelled; 2 for a client error (bad flags, no controller, refused call).
int submit_command(const client_flags& c, const submit_command_options& o);
int jobs_command(const client_flags& c, const std::vector<std::string>& states, int limit);
int status_command(const client_flags& c, const std::string& id, bool json);
int logs_command(const client_flags& c, const std::string& id, bool follow, int lines);
int watch_command(const client_flags& c, const std::string& id);
/// cancel | pause | resume | checkpoint.
int job_command(const client_flags& c, const std::string& verb, const std::string& id, bool now);
int set_command(const client_flags& c, const std::string& id, const std::vector<std::string>& settings);
/// `troupe node`: flags over the detected resources (-1 = detected).
struct node_command_options {
  std::string secret_file;
  std::string name;
  std::string advertise;
  int cores = -1;
  double memory_gb = -1;
  int gpus = -1;
  double reconnect_s = 60;
  std::string version;
  std::string work_dir;
};

/// Runs a node agent (cluster/node_agent.hpp) until SIGINT / SIGTERM; exit
/// 0 after leaving, 2 when refused, 3 when the controller stays unreachable.
int node_command(const client_flags& c, const node_command_options& n);
/// `troupe nodes`: the joined agents.
int nodes_command(const client_flags& c, bool json);

struct slurm_run_options {
  std::string file;
  std::vector<std::string> overrides;
  /// "" = <submit dir>/troupe-slurm-<job id>.
  std::string state_dir;
  /// Bound on the controller's start and on every agent joining.
  double start_timeout_s = 120;
};

/// `troupe slurm run` (docs/cluster.md, "On Slurm"): inside an allocation,
/// a controller on this node and an agent per allocated node (srun), the
/// job submitted and followed; exits like `submit --wait`.
int slurm_run_command(const slurm_run_options& o);
int metrics_command(const client_flags& c, const std::string& id, const std::vector<std::string>& keys,
                    bool json);

} // namespace troupe::apps
