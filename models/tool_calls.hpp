#pragma once
// The tool calls a model writes in its turn, read back from the turn's text,
// and checked against the tools an environment offers.
//
// NOTE [tool calls]: each chat-template family spells a call its own way, and
// the model writes it the way its template renders one:
//  - hermes (Qwen2.5, Qwen3, Hermes): one block per call,
//      <tool_call>
//      {"name": "add", "arguments": {"a": 1, "b": 2}}
//      </tool_call>
//  - deepseek_v3: the calls in one block, each with its name and its
//    arguments as a fenced JSON code block,
//      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add
//      ```json
//      {"a": 1, "b": 2}
//      ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//  - llama3_json (Llama 3.1's JSON tool calling): the whole turn is a call,
//    {"name": "add", "parameters": {"a": 1, "b": 2}}, after an optional
//    <|python_tag|>; several are separated by ';'.
// The text outside the calls is the turn's content. A call that cannot be
// read — unclosed, not JSON, no name, arguments that are not an object — is
// not an error of the rollout: it is kept, with why, to go back to the model
// as an observation (the model learns to call tools by being told).
// Checking a call against the tools' schemas (OpenAI's function format, a
// JSON Schema subset: type, properties, required, enum, items,
// additionalProperties) is separate, for the same use.

#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::models {

enum class tool_call_format { hermes, deepseek_v3, llama3_json };
TROUPE_ENUM_NAMES(tool_call_format, "hermes", "deepseek_v3", "llama3_json")

/// The format a chat template renders tool calls in, when it renders them
/// in one of the known ones (nullopt: a template without tools, such as
/// the installed Llama 3's).
std::optional<tool_call_format> tool_call_format_of_template(std::string_view source) noexcept;

struct tool_call {
  std::string name;
  /// A JSON object.
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
  bool operator==(const tool_call&) const = default;
};

/// A model's turn, read.
struct parsed_turn {
  /// The text outside the calls, trimmed.
  std::string content;
  std::vector<tool_call> calls;
  /// The calls that could not be read, each as "tool call N: why" (N counts
  /// every call of the turn from 1).
  std::vector<std::string> malformed;
};

/// At most this many calls are read from one turn; the rest are malformed.
inline constexpr size_t max_tool_calls_per_turn = 64;

parsed_turn parse_tool_calls(std::string_view text, tool_call_format format);

/// A turn's text with `content` and `calls` as the model writes them in
/// `format` (parse_tool_calls reads it back): hermes puts the content
/// first, then a block per call; deepseek_v3 the content, then the calls'
/// block; llama3_json the calls alone, separated by "; " (a turn with
/// calls has no content there).
std::string write_tool_calls(std::string_view content, const std::vector<tool_call>& calls,
                             tool_call_format format);

/// `call` against `tools` (a JSON array of {"type": "function", "function":
/// {"name", "description", "parameters"}}): the tool exists and its
/// arguments satisfy its parameters' schema. invalid_argument says what
/// does not, by path ("add: arguments.a: expected number, got string").
expected<void> check_tool_call(const tool_call& call, const nlohmann::ordered_json& tools);

} // namespace troupe::models
