#pragma once
// Multi-turn rollouts: episodes of the rollout engine talking with an
// environment (environment.hpp), token by token.
//
// NOTE [episodes]: an episode is a sample's conversation. Its first prompt is
// the first observation of the environment's session (rendered and
// tokenised as a data row's prompt is: NOTE [prompt encoding]); the first
// turns of all episodes go to the rollout in one generate call, a prompt's
// samples as one request of n (the batch path's very requests, so a
// single-turn environment samples what the batch path samples). Then each
// episode goes on by itself, on one of the runner's threads: its turn is
// decoded (cut at EOS), its tool calls read in the configured format and
// checked against the session's tools (NOTE [tool calls]); a malformed or
// invalid call goes back to the model as a tool message saying why, without
// a Step; otherwise the environment's Step answers. Unless done, the
// observation is rendered — messages with the chat template's role markers
// (render_observation), text as it is — tokenised once, and appended; the
// next turn is a request that extends the episode's last sample
// (generate_request::extends), so the model's own tokens are kept exactly,
// nothing earlier is rendered or tokenised again, and the engine reuses the
// K/V of the conversation's whole blocks from its prefix cache. Episodes
// generate while others wait on the environment: a slow session never holds
// the rest of the batch. An episode ends when the environment says done, at
// max_turns model turns, when the next turn could not fit max_context
// tokens, or when the model's turn is cut by max_tokens (each a finish
// reason); troupe closes a session the environment did not end.
// The episode's tokens after its first prompt carry a loss mask: 1 on the
// model's tokens, 0 on observations. The environment's reward at done is the
// outcome; a reward at an earlier step is shaping, placed at the last token
// of that turn.
// Every environment call is bounded by timeout_s; a call that fails, times
// out or answers garbage (another number of results, another session, a
// reward that is not finite in fp32, an empty observation before done)
// fails the whole run with an error naming the environment, the session,
// the phase and the turn ("environment 'calculator': session 3/1/0: step
// (turn 2): ..."); the other episodes stop at their next turn and their
// sessions are closed.

#include "actors/inference/rollout.hpp"
#include "actors/rl/data.hpp"
#include "actors/rl/environment.hpp"
#include "models/tool_calls.hpp"

#include <caf/fwd.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace troupe::actors::rl {

struct episode_options {
  /// Model turns per episode at most.
  int64_t max_turns = 4;
  /// Tokens of a whole episode at most (prompt, turns, observations).
  int64_t max_context = 512;
  /// How the model writes tool calls.
  models::tool_call_format tool_format = models::tool_call_format::hermes;
  /// Bound on each environment call and each generate call (seconds).
  double timeout_s = 30;
  double generate_timeout_s = 600;
  /// Threads that drive episodes after their first turn (at most one
  /// episode each at a time); 0 = one per episode, up to 256.
  int64_t threads = 0;
  /// Episodes go on independently (a turn is generated as soon as its
  /// observation is in); false = in lockstep: each turn of every episode in
  /// one generate call, after every environment step of the turn before
  /// (the same batches in every run, and the baseline of the overlap).
  bool overlap = true;
  /// Where the sessions come from, for the environment's logs.
  std::string job;
  int64_t step = 0;
};

/// One prompt of the batch: `n` episodes of it (sampling.n), their first
/// turn one request named `id`, sessions "<id>/<k>".
struct episode_prompt {
  std::string id;
  example row;
  inference::sampling_params sampling;
};

/// Why an episode ended.
enum class episode_end : uint8_t { done, max_turns, context, length };
TROUPE_ENUM_NAMES(episode_end, "done", "max_turns", "context", "length")

struct episode {
  std::string session;
  /// The first prompt, and every token after it: the model's turns and the
  /// observations between them.
  std::vector<int64_t> prompt;
  std::vector<int64_t> tokens;
  /// Per token of `tokens`: 1 where the model wrote it; the rollout's
  /// log-prob (0 on observations); its weight version (that of the turn
  /// before, on observations).
  std::vector<float> loss_mask;
  std::vector<float> logprobs;
  std::vector<int64_t> versions;
  /// Per token of `tokens`: the shaping rewards of the steps before the
  /// last, at their turn's last token (empty when none was given).
  std::vector<float> shaping;
  /// Where the last model turn begins in `tokens`.
  size_t last_turn_begin = 0;
  /// The environment's reward at done (0 when it did not end the episode).
  double reward = 0;
  episode_end end = episode_end::done;
  int32_t turns = 0;
  /// Turns with at least one tool call; calls; calls that were malformed
  /// or invalid (answered by troupe).
  int32_t tool_turns = 0;
  int32_t tool_calls = 0;
  int32_t tool_errors = 0;
  int64_t observation_tokens = 0;
  /// The environment's info, summed over the episode's steps.
  std::map<std::string, double> info;
  /// The conversation as chat messages (the model's turns as "assistant"
  /// messages, observations as theirs), for the dashboard and logs.
  nlohmann::ordered_json transcript = nlohmann::ordered_json::array();
};

/// What a run measured.
struct episode_stats {
  /// Seconds of each Step call (for percentiles).
  std::vector<double> step_seconds;
  double reset_seconds = 0;
  double seconds = 0;
  /// The rollout's counters in the reply of most steps (NOTE [busy on
  /// replies]).
  inference::engine_metrics engine;
};

/// The episodes of `prompts`, in order (prompt by prompt, sample by
/// sample), and what the run measured.
struct episode_batch {
  std::vector<episode> episodes;
  episode_stats stats;
};

/// NOTE [episodes]: runs the prompts' episodes on `rollout` against `env`.
/// `enc` renders the observations (its tokenizer's EOS cuts turns).
expected<episode_batch> run_episodes(caf::actor_system& sys,
                                     const inference::rollout_actor& rollout,
                                     std::shared_ptr<environment> env, const prompt_encoder& enc,
                                     const std::vector<episode_prompt>& prompts,
                                     const episode_options& opts);

/// Appends a model turn to `ep` (loss mask 1, the engine's log-probs and
/// versions; last_turn_begin and turns updated).
void append_model_tokens(episode& ep, const inference::sample_output& out);
/// Appends observation tokens to `ep` (loss mask 0, log-prob 0, the last
/// version).
void append_observation_tokens(episode& ep, const std::vector<int64_t>& tokens);

/// An environment's info entries per Step at most.
inline constexpr size_t max_env_info = 32;

/// The checks of an environment's answer for `session` before any of it is
/// used (NOTE [episodes]): the session it names; a first observation of
/// messages or text (not both), tools a list; a reward and info values
/// finite in fp32, info names usable as metric names, at most max_env_info
/// of them, an observation before done. corrupted says what is wrong.
expected<void> check_reset_answer(const reset_result& r, const std::string& session);
expected<void> check_step_answer(const step_result& r, const std::string& session);

/// The tokens of an observation that follows a model turn ending in EOS
/// (NOTE [observation tokens] in episodes.cpp): messages rendered with the
/// chat template's role markers (or the plain rendering without a
/// template), text as it is.
expected<std::vector<int64_t>> render_observation(const prompt_encoder& enc, const observation& o,
                                                  const nlohmann::ordered_json& tools);

/// The tokens of a session's first prompt: as a data row's prompt
/// (prompt_encoder::prompt), with the session's tools passed to the chat
/// template.
expected<std::vector<int64_t>> render_first_prompt(const prompt_encoder& enc, const observation& o,
                                                   const nlohmann::ordered_json& tools);

/// What a model's turn says: its text as rules read it (cut at EOS,
/// special tokens skipped) and its tool calls (read in `format` from the
/// text with special tokens, where some formats' markers are), each
/// checked against `tools`: errors says why a call is malformed or invalid.
struct read_turn {
  std::string text;
  models::parsed_turn parsed;
  std::vector<std::string> errors;
  int64_t tokens = 0;
};
expected<read_turn> read_model_turn(const prompt_encoder& enc, const std::vector<int64_t>& turn,
                                    models::tool_call_format format,
                                    const nlohmann::ordered_json& tools);
/// The environment's view of a read turn (its calls named
/// call_<turn>_<k>).
env_turn env_turn_of(const std::string& session, int32_t turn, const read_turn& read,
                     const std::string& finish_reason);

/// NOTE [demonstration turns]: a multi-turn demonstration (a tool-using
/// episode written out, tasks.hpp) as the tokens an episode of it would be:
/// the first prompt as render_first_prompt makes it (the prompt's messages
/// and the tools); each assistant turn as the model writes it — its
/// content and tool calls in `format` (models::write_tool_calls), then EOS
/// — with loss mask 1; the tool (or user) messages between turns rendered
/// as the episode runner renders an observation (render_observation), mask
/// 0. SFT on it trains the model's turns and never the tools' answers, in
/// the very token layout its RL episodes have.
struct demonstration_tokens {
  std::vector<int64_t> prompt;
  std::vector<int64_t> tokens;
  std::vector<float> loss_mask;
};
expected<demonstration_tokens> render_demonstration(const prompt_encoder& enc,
                                                    const demonstration& d,
                                                    models::tool_call_format format);

/// The metrics of a batch of episodes ("env/..."): turns, tool-call and
/// error rates, Step latency p50 / p99, generated and observation tokens,
/// rewards, finish reasons, the environment's info.
std::map<std::string, double> episode_metrics(const episode_batch& b);

} // namespace troupe::actors::rl
