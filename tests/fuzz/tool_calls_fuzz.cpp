// Fuzz target: reading a model's tool calls (models/tool_calls.hpp) — the
// text a policy writes in its turn, which an RL run samples at random, and
// the tool schemas an environment offers. The input is the format (its
// first byte), then the turn's text and, after a "%%" line, the tools as
// JSON. Invariants: every call read has a name and an object of arguments;
// at most 64 are read, and the calls and malformed ones together account
// for no more than one past that; the calls read, written back in the
// format's own spelling, read back the same; checking a call against the
// tools answers, an invalid_argument when it fails.
#include "models/tool_calls.hpp"
#include "runtime/jsonl.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <cstdint>
#include <string>

using namespace troupe;
using models::tool_call_format;

namespace {

// The calls in the format's spelling (NOTE [tool calls]).
std::string spelled(const std::vector<models::tool_call>& calls, tool_call_format f) {
  std::string out;
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto& c = calls[i];
    const auto args = c.arguments.dump();
    auto name = [&] { return nlohmann::ordered_json(c.name).dump(); };
    switch (f) {
    case tool_call_format::hermes:
      out += "<tool_call>\n{\"name\": " + name() + ", \"arguments\": " + args + "}\n</tool_call>";
      break;
    case tool_call_format::deepseek_v3:
      // (The V3.1 form: a name written on its own line cannot hold a newline.)
      out += "<\uFF5Ctool\u2581call\u2581begin\uFF5C>" + c.name + "<\uFF5Ctool\u2581sep\uFF5C>" +
             args + "<\uFF5Ctool\u2581call\u2581end\uFF5C>";
      break;
    case tool_call_format::llama3_json:
      out +=
          (i ? "; " : "") + std::string{"{\"name\": "} + name() + ", \"parameters\": " + args + "}";
      break;
    }
  }
  if (f == tool_call_format::deepseek_v3)
    out =
        "<\uFF5Ctool\u2581calls\u2581begin\uFF5C>" + out + "<\uFF5Ctool\u2581calls\u2581end\uFF5C>";
  return out;
}

// Whether a name survives the spelling (DeepSeek's has no quoting).
bool plain_name(const std::string& name) {
  return name.find('<') == std::string::npos && name.find('\n') == std::string::npos &&
         name == std::string{name.c_str()} && name.find_first_of(" \t\r") == std::string::npos &&
         name != "function";
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const auto format = static_cast<tool_call_format>(data[0] % 3);
  const auto s = fuzz::sections_of(fuzz::text_of(data + 1, size - 1));
  const auto turn = models::parse_tool_calls(s[0], format);
  if (turn.calls.size() > models::max_tool_calls_per_turn ||
      turn.calls.size() + turn.malformed.size() > s[0].size() + 1)
    fuzz::broken("more calls than the bound");
  bool plain = true;
  for (const auto& c : turn.calls) {
    if (c.name.empty() || !c.arguments.is_object())
      fuzz::broken("a call without a name or an object of arguments");
    plain = plain && plain_name(c.name);
  }
  if (plain && !turn.calls.empty()) {
    const auto again = models::parse_tool_calls(spelled(turn.calls, format), format);
    if (!again.malformed.empty() || again.calls.size() != turn.calls.size())
      fuzz::broken("the calls read, written back, do not read back");
    for (size_t i = 0; i < turn.calls.size(); ++i)
      if (again.calls[i].name != turn.calls[i].name ||
          again.calls[i].arguments != turn.calls[i].arguments)
        fuzz::broken("a call read back differs");
  }
  if (runtime::json_too_deep_at(fuzz::section(s, 1)) != std::string::npos)
    return 0;
  const auto tools = nlohmann::ordered_json::parse(fuzz::section(s, 1), nullptr, false);
  if (tools.is_discarded())
    return 0;
  for (const auto& c : turn.calls)
    if (auto ok = models::check_tool_call(c, tools);
        !ok && code_of(ok.error()) != errc::invalid_argument)
      fuzz::broken("a failed check that is not invalid_argument");
  return 0;
}
