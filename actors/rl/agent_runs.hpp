#pragma once
// Agent code as the rollout: the job's agent command, run once per
// iteration against the OpenAI-compatible endpoint, and its episodes taken
// from the agent book for training.
//
// NOTE [agent runs]: with rl.agent.command set, an iteration's episodes are
// written by agent code that calls the endpoint (NOTE [agent gateway]),
// not by the episode runner. Per iteration the driver:
//  1. names each episode "<iteration>.<prompt>.<sample>" and, with an
//     environment, opens its session (Reset: the first messages and tools);
//     without one, the data row's conversation (or prompt) is the first;
//  2. opens the agent book for exactly these episodes (calls and rewards of
//     any other are refused, and calls past max_calls), starts the
//     endpoint with a fresh random key, and writes the task file: one JSON
//     object per line and episode, {"episode", "base_url", "messages",
//     "prompt", "tools", "max_tokens", "temperature", "top_p"};
//  3. starts the command — argv as given, never a shell — with
//     OPENAI_BASE_URL (the endpoint's /v1; an agent names its episode by
//     X-Troupe-Episode there, or calls the episode's own base_url),
//     OPENAI_API_KEY, TROUPE_AGENT_TASKS (the task file) and
//     TROUPE_AGENT_STEP added to its environment, its output appended to
//     the agent log;
//  4. waits for the command to exit, at most timeout_s: past it the command
//     is killed and the iteration fails naming the episodes still without
//     a reward; a command that exits with an error fails it too;
//  5. takes each episode's last trajectory from the book — the exact
//     tokens, log-probs and versions the engine served, the loss mask on
//     the model's tokens only — as the episode runner's episodes are
//     taken (earlier trajectories of a rewritten history are dropped, and
//     counted in agent/history_rewrites). Its reward: the one posted
//     (POST /v1/episodes/{id}/reward); else the environment's Step on the
//     episode's last assistant turn (done: its reward; not done: 0 and the
//     session closed, finish reason max_turns); else, where
//     rl.environment.score asks the reward role (reward), none is needed.
//     An episode that made no call, or lacks a reward it needs, fails the
//     iteration with an error naming it.

#include "actors/inference/rollout.hpp"
#include "actors/rl/agent_book.hpp"
#include "actors/rl/episodes.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace troupe::actors::rl {

struct job_config;

/// An iteration's endpoint and agent process (cluster/agent_host.hpp
/// builds one). Destroying it stops the endpoint and kills a command that
/// still runs.
class agent_host {
public:
  virtual ~agent_host() = default;
  /// The base URL an agent of `episode` calls (<endpoint>/e/<episode>/v1).
  virtual std::string base_url(const std::string& episode) const = 0;
  /// The endpoint's /v1, for agents that name episodes by header.
  virtual std::string api_base() const = 0;
  /// The API key every call must carry.
  virtual std::string key() const = 0;
  /// Starts `argv` (no shell; argv[0] looked up on PATH when it has no
  /// slash) with `env` added to the environment, its stdout and stderr
  /// appended to `log`.
  virtual expected<void> start(const std::vector<std::string>& argv,
                               const std::vector<std::pair<std::string, std::string>>& env,
                               const std::string& log) = 0;
  /// nullopt while the command runs; then "" (it exited with status 0) or
  /// how it ended ("exited with status 3").
  virtual std::optional<std::string> ended() = 0;
  /// Ends a command that still runs (SIGTERM, then SIGKILL).
  virtual void kill() = 0;
};

/// What an iteration's endpoint serves with (rl.agent of the job): the
/// calls' sampling where they do not say (the batch path's), their context.
struct agent_endpoint_spec {
  const job_config* job = nullptr;
  inference::sampling_params defaults;
  int64_t max_context = 0;
  double generate_timeout_s = 600;
};

struct agent_run_options {
  std::vector<std::string> command;
  double timeout_s = 600;
  /// Calls per episode at most (0 = no bound).
  int64_t max_calls = 0;
  /// The task file (rewritten) and the agent's log (appended to).
  std::string task_file;
  std::string log_file;
  /// The episodes' limits, tool format and environment timeout; step names
  /// the iteration.
  episode_options episodes;
  /// Every episode needs a reward of its own (a posted one or the
  /// environment's): false when rl.reward scores the last turn alone.
  bool need_reward = true;
};

/// An iteration of agent episodes, in the episode runner's order (prompt
/// by prompt, sample by sample), and the endpoint's counters.
struct agent_run {
  episode_batch batch;
  /// agent/history_rewrites, agent/trajectories/mean, agent/calls/mean,
  /// agent/seconds.
  std::map<std::string, double> metrics;
};

/// The episode name of sample `k` of the prompt whose request is `id`
/// ("3/0" → "3.0.k"): letters, digits and _ . : - only.
std::string agent_episode_id(const std::string& id, int64_t k);

/// NOTE [agent runs]: one iteration's agent run on `host`, recorded in
/// `book`, with `env` (may be null) opening sessions and scoring last turns.
expected<agent_run> run_agent_episodes(agent_host& host, agent_book& book,
                                       std::shared_ptr<environment> env, const prompt_encoder& enc,
                                       const std::vector<episode_prompt>& prompts,
                                       const agent_run_options& opts);

} // namespace troupe::actors::rl
