// The client commands on the CLI (apps/control.hpp), registered by the lean
// `troupe` binary (NOTE [lean client] in apps/front.cpp).
#include "apps/cli.hpp"
#include "apps/control.hpp"

#include <CLI/CLI.hpp>

#include <map>
#include <memory>
#include <string>

namespace troupe::apps {

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

namespace {

struct client_command_flags {
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
};

} // namespace

std::vector<runner> add_client_commands(CLI::App& app) {
  auto f = std::make_shared<client_command_flags>();
  std::vector<runner> out;

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
  // `troupe nodes`: the joined agents.
  auto* nodes = app.add_subcommand("nodes", "List the node agents: state, address, resources, last heartbeat");
  nodes->add_flag("--json", f->json, "As JSON");
  add_client_flags(nodes, f->client);
  out.push_back([=]() -> std::optional<int> {
    return nodes->parsed() ? std::optional<int>{nodes_command(f->client, f->json)} : std::nullopt;
  });
  return out;
}

} // namespace troupe::apps
