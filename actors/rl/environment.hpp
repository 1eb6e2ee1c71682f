#pragma once
// What the policy talks with over the turns of an episode: an environment
// (proto/troupe/v1/environment.proto, in C++). Torch-free.
//
// NOTE [environments]: an episode is a session of an environment. reset
// opens sessions — each a data row — and answers their first observations
// and the tools their model may call; step takes the model's turn (its
// text, and its tool calls as the runner read them: NOTE [tool calls] in
// models/tool_calls.hpp) and answers the next observation, a reward and
// whether the episode is done; close ends sessions troupe stopped early.
// Calls are batched (several sessions each) and come concurrently from the
// episode runner's threads (episodes.hpp): an implementation is
// thread-safe. Built in:
//  - task: the data row's prompt, one turn, scored by the rules (the
//    built-in tasks and rule-scored files as single-turn environments);
//  - calculator: arithmetic on numbers too long to add in one's head, with
//    a `calculator` tool the model calls (hermes-style or any format the
//    runner reads) before it answers; the answer is scored by the rules;
//  - remote: an EnvironmentService (cluster/remote_environment.hpp).
// A factory picks one by rl.environment.kind (make_environment; remote
// through role_factories, so actors/ never includes gRPC).

#include "actors/rl/tasks.hpp"
#include "actors/rl/verifiers.hpp"
#include "models/tool_calls.hpp"
#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors::rl {

/// A chat message of an observation (role user, tool, system).
struct env_message {
  std::string role;
  std::string content;
  /// A tool message: the tool's name and the call it answers.
  std::string name;
  std::string tool_call_id;
  bool operator==(const env_message&) const = default;
};

/// What the model is shown: messages (rendered with the chat template's
/// role markers) or text (appended as it is); not both.
struct observation {
  std::vector<env_message> messages;
  std::string text;
  bool empty() const { return messages.empty() && text.empty(); }
  /// The messages as a chat template's JSON list.
  nlohmann::ordered_json messages_json() const;
};

/// A tool call of the model, as the runner read it.
/// OpenAI-format chat messages (JSON) read: a message's content as text (a
/// string; null = ""; a list of parts, their "text" joined), its tool
/// calls (an assistant's "tool_calls", arguments as a JSON string or
/// object), and messages [from, end) as an observation.
std::string message_text(const nlohmann::ordered_json& message);
std::vector<models::tool_call> tool_calls_of(const nlohmann::ordered_json& message);
observation observation_from_messages(const nlohmann::ordered_json& messages, size_t from = 0);

struct env_tool_call {
  std::string id;
  std::string name;
  /// A JSON object, valid for the tool's parameters.
  std::string arguments_json;
};

/// Opens a session for a data row.
struct reset_task {
  std::string session;
  example row;
};

struct reset_result {
  std::string session;
  observation first;
  /// The session's tools: a JSON array of OpenAI function specs (null or
  /// [] = none).
  nlohmann::ordered_json tools;
};

/// A model's turn in a session.
struct env_turn {
  std::string session;
  /// From 1.
  int32_t turn = 0;
  /// The turn as written (cut at EOS, special tokens skipped), the text
  /// outside its calls, its calls (each well formed and valid).
  std::string text;
  std::string content;
  std::vector<env_tool_call> calls;
  /// "stop" or "length".
  std::string finish_reason;
  /// The turn's generated tokens.
  int64_t tokens = 0;
};

struct step_result {
  std::string session;
  observation next;
  /// With done: the outcome reward; before: per-turn shaping.
  double reward = 0;
  bool done = false;
  /// Logged as env/info/<name> (summed over the episode, mean over the batch).
  std::map<std::string, double> info;
};

class environment {
public:
  virtual ~environment() = default;
  /// Names it in errors and logs ("calculator", "remote 127.0.0.1:5000").
  virtual std::string name() const = 0;
  /// One result per task / turn, in order.
  virtual expected<std::vector<reset_result>> reset(const std::vector<reset_task>& tasks) = 0;
  virtual expected<std::vector<step_result>> step(const std::vector<env_turn>& turns) = 0;
  /// Ends sessions troupe stopped before a done ("max_turns", "context",
  /// "error"); best effort.
  virtual void close(const std::vector<std::string>& sessions, std::string_view reason) {}
};

/// The built-in environments, and a remote service.
enum class environment_kind : uint8_t { none, task, calculator, remote };
TROUPE_ENUM_NAMES(environment_kind, "none", "task", "calculator", "remote")

/// The task environment: the row's prompt (or conversation), one turn,
/// scored by `rules` against the row's answer.
std::unique_ptr<environment> make_task_environment(rule_set rules);

/// The calculator environment: the row's prompt and a `calculator` tool
/// ({"expression": "<integers with + - * and parentheses>"}, exact at any
/// length); a turn with calls gets their results as tool messages, a turn
/// without ends the episode, its content scored by `rules`.
std::unique_ptr<environment> make_calculator_environment(rule_set rules);

/// The calculator tool's spec (OpenAI's function format).
nlohmann::ordered_json calculator_tool();

/// The value of an integer expression (+, -, *, parentheses, unary minus;
/// exact at any length, at most 4096 bytes); invalid_argument says where it
/// cannot be read.
expected<std::string> evaluate_integer_expression(std::string_view expression);

/// The add task's examples as tool-using demonstrations (NOTE
/// [demonstration turns]): the model calls the calculator tool with the
/// prompt's sum ("add:482+97=" → {"expression": "482+97"}), reads its
/// result, and answers it. invalid_argument for a row that is not an add
/// prompt whose sum is its answer.
expected<std::vector<demonstration>> to_tool_demonstrations(const std::vector<example>& examples);

} // namespace troupe::actors::rl
