// Reading a model's tool calls (NOTE [tool calls] in models/tool_calls.hpp):
// well-formed and malformed calls in each format, the calls a template
// renders read back, and checks against tool schemas.
#include "models/chat_template.hpp"
#include "models/tool_calls.hpp"
#include "runtime/file_io.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace troupe;
using namespace troupe::models;
using ojson = nlohmann::ordered_json;

namespace {

struct turn_case {
  std::string text;
  std::string content;
  /// name + arguments' JSON, in order.
  std::vector<std::pair<std::string, std::string>> calls;
  /// A piece of each malformed call's message, in order.
  std::vector<std::string> malformed;
};

void expect_reads(tool_call_format f, const std::vector<turn_case>& cases) {
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    auto t = parse_tool_calls(c.text, f);
    EXPECT_EQ(t.content, c.content);
    ASSERT_EQ(t.calls.size(), c.calls.size());
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(t.calls[i].name, c.calls[i].first);
      EXPECT_EQ(t.calls[i].arguments, ojson::parse(c.calls[i].second));
    }
    ASSERT_EQ(t.malformed.size(), c.malformed.size());
    for (size_t i = 0; i < c.malformed.size(); ++i)
      EXPECT_NE(t.malformed[i].find(c.malformed[i]), std::string::npos) << t.malformed[i];
  }
}

// DeepSeek's markers, spelled out.
const std::string calls_begin = "<\uFF5Ctool\u2581calls\u2581begin\uFF5C>";
const std::string calls_end = "<\uFF5Ctool\u2581calls\u2581end\uFF5C>";
const std::string call_begin = "<\uFF5Ctool\u2581call\u2581begin\uFF5C>";
const std::string call_end = "<\uFF5Ctool\u2581call\u2581end\uFF5C>";
const std::string sep = "<\uFF5Ctool\u2581sep\uFF5C>";

std::string ds_call(const std::string& name, const std::string& args) {
  return call_begin + "function" + sep + name + "\n```json\n" + args + "\n```" + call_end;
}

} // namespace

TEST(ToolCalls, HermesCallsAreReadAndMalformedOnesSaidWhy) {
  expect_reads(
      tool_call_format::hermes,
      {
          {"The answer is 4.", "The answer is 4.", {}, {}},
          {"Let me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": "
           "2}}\n</tool_call>",
           "Let me add.",
           {{"add", R"({"a": 1, "b": 2})"}},
           {}},
          {"<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
           "<tool_call>\n{\"name\": \"lookup\", \"arguments\": \"{\\\"key\\\": \\\"x\\\"}\"}"
           "\n</tool_call>",
           "",
           {{"add", R"({"a": 1})"}, {"lookup", R"({"key": "x"})"}},
           {}},
          {"<tool_call>{\"name\": \"now\"}</tool_call>", "", {{"now", "{}"}}, {}},
          // Malformed: not JSON, no name, arguments not an object, unclosed.
          {"<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}\n</tool_call>",
           "",
           {},
           {"tool call 1: not JSON"}},
          {"<tool_call>{\"arguments\": {}}</tool_call> then "
           "<tool_call>{\"name\": \"add\", \"arguments\": [1, 2]}</tool_call>",
           "then",
           {},
           {"tool call 1: no \"name\"", "tool call 2: arguments must be a JSON object, got array"}},
          {"ok <tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1}}</tool_call>"
           "<tool_call>{\"name\": \"add\", \"argu",
           "ok",
           {{"add", R"({"a": 1})"}},
           {"tool call 2: no </tool_call>"}},
          {"<tool_call>" + std::string(300, '[') + "</tool_call>",
           "",
           {},
           {"tool call 1: JSON nested deeper than 256"}},
      });
}

TEST(ToolCalls, DeepSeekCallsAreReadAndMalformedOnesSaidWhy) {
  expect_reads(tool_call_format::deepseek_v3,
               {
                   {"plain", "plain", {}, {}},
                   {"Adding." + calls_begin + ds_call("add", R"({"a": 1, "b": 2})") +
                        ds_call("lookup", R"({"key": "x"})") + calls_end,
                    "Adding.",
                    {{"add", R"({"a": 1, "b": 2})"}, {"lookup", R"({"key": "x"})"}},
                    {}},
                   // V3.1's form: the name, the separator, the arguments.
                   {calls_begin + call_begin + "add" + sep + R"({"a": 3})" + call_end + calls_end,
                    "",
                    {{"add", R"({"a": 3})"}},
                    {}},
                   {calls_begin + ds_call("add", R"({"a": )") + call_begin + "function" + sep +
                        "add\n" + R"({"a": 1})" + call_end + call_begin + "function\nadd" +
                        call_end + call_begin + "function" + sep + "add\n```json\n{}\n```",
                    "",
                    {},
                    {"tool call 1: arguments of 'add': not JSON", "tool call 2: no ```json block",
                     "tool call 3: no tool separator", "tool call 4: no tool-call end marker"}},
               });
}

TEST(ToolCalls, Llama3JsonCallsAreReadAndMalformedOnesSaidWhy) {
  expect_reads(
      tool_call_format::llama3_json,
      {
          {"The answer is {not a call}.", "The answer is {not a call}.", {}, {}},
          {R"({"name": "add", "parameters": {"a": 1, "b": 2}})",
           "",
           {{"add", R"({"a": 1, "b": 2})"}},
           {}},
          {R"(<|python_tag|>{"name": "add", "parameters": {"s": "};{"}}; )"
           R"({"name": "lookup", "arguments": {"key": "x"}})",
           "",
           {{"add", R"({"s": "};{"})"}, {"lookup", R"({"key": "x"})"}},
           {}},
          {R"({"name": "add", "parameters": {"a": 1})", "", {}, {"tool call 1: not a JSON object"}},
          {R"({"name": "add", "parameters": {}} and more)",
           "",
           {{"add", "{}"}},
           {"tool call 2: expected ';' between calls"}},
          {R"({"parameters": {}})", "", {}, {"tool call 1: no \"name\""}},
      });
}

TEST(ToolCalls, AtMost64CallsAreReadFromATurn) {
  std::string text;
  for (int i = 0; i < 70; ++i)
    text += "<tool_call>{\"name\": \"t" + std::to_string(i) + "\"}</tool_call>";
  auto t = parse_tool_calls(text, tool_call_format::hermes);
  EXPECT_EQ(t.calls.size(), max_tool_calls_per_turn);
  ASSERT_EQ(t.malformed.size(), 1u);
  EXPECT_NE(t.malformed[0].find("more than 64 calls"), std::string::npos) << t.malformed[0];
}

// What a template renders as a call is read back as that call.
TEST(ToolCalls, CallsRenderedByTheTemplatesReadBackTheSame) {
  const auto dir = std::string{TROUPE_SOURCE_DIR} + "/tests/models/chat_templates/";
  const auto args = ojson::parse(R"({"a": 12345678901, "b": -2.5, "note": "x;}{\"y"})");
  auto conversation = [&](const std::string& name) {
    ojson call = {{"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}};
    return ojson::array(
        {ojson{{"role", "user"}, {"content", "add them"}},
         ojson{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ojson::array({call})}}});
  };
  struct fixture {
    std::string file;
    tool_call_format format;
  };
  for (const auto& [file, format] :
       {fixture{"chatml.jinja", tool_call_format::hermes},
        fixture{"llama31_tools.jinja", tool_call_format::llama3_json}}) {
    SCOPED_TRACE(file);
    auto source = runtime::read_file(dir + file);
    ASSERT_TRUE(source) << describe(source.error());
    auto t = chat_template::parse(*source);
    ASSERT_TRUE(t) << describe(t.error());
    chat_render_request req;
    req.messages = conversation("add");
    auto text = render_chat(*t, req);
    ASSERT_TRUE(text) << describe(text.error());
    // The assistant's turn: after its header, to the end of turn.
    const std::string header = format == tool_call_format::hermes
                                   ? "<|im_start|>assistant\n"
                                   : "<|start_header_id|>assistant<|end_header_id|>\n\n";
    const std::string end = format == tool_call_format::hermes ? "<|im_end|>" : "<|eot_id|>";
    auto at = text->rfind(header);
    ASSERT_NE(at, std::string::npos) << *text;
    auto turn = text->substr(at + header.size());
    turn = turn.substr(0, turn.find(end));
    auto parsed = parse_tool_calls(turn, format);
    // troupe writes a call (SFT demonstrations) as the template renders it.
    EXPECT_EQ(write_tool_calls("", {{"add", args}}, format), turn);
    EXPECT_TRUE(parsed.malformed.empty()) << turn;
    ASSERT_EQ(parsed.calls.size(), 1u) << turn;
    EXPECT_EQ(parsed.calls[0].name, "add");
    EXPECT_EQ(parsed.calls[0].arguments, args);
    EXPECT_EQ(parsed.content, "");
  }
  auto chatml = runtime::read_file(dir + "chatml.jinja");
  ASSERT_TRUE(chatml);
  EXPECT_EQ(tool_call_format_of_template(*chatml), tool_call_format::hermes);
  EXPECT_EQ(tool_call_format_of_template("{{ messages }}"), std::nullopt);
  EXPECT_EQ(enum_from_name<tool_call_format>("deepseek_v3"), tool_call_format::deepseek_v3);
  EXPECT_EQ(enum_from_name<tool_call_format>("json"), std::nullopt);
  EXPECT_EQ(to_string(tool_call_format::llama3_json), "llama3_json");
}

TEST(ToolCalls, CallsAreCheckedAgainstTheToolsSchemas) {
  const auto tools = ojson::parse(R"([
    {"type": "function", "function": {"name": "add", "description": "a + b",
      "parameters": {"type": "object", "required": ["a", "b"], "additionalProperties": false,
        "properties": {"a": {"type": "number"}, "b": {"type": "integer"},
                       "mode": {"type": "string", "enum": ["exact", "round"]},
                       "tags": {"type": "array", "items": {"type": "string"}}}}}},
    {"type": "function", "function": {"name": "now"}}
  ])");
  auto check = [&](const std::string& name, const std::string& args) {
    return check_tool_call(tool_call{name, ojson::parse(args)}, tools);
  };
  EXPECT_TRUE(check("add", R"({"a": 1.5, "b": 2})"));
  EXPECT_TRUE(check("add", R"({"a": 1, "b": 2.0, "mode": "round", "tags": ["x"]})"));
  EXPECT_TRUE(check("now", R"({"anything": true})"));
  struct bad {
    std::string name, args, why;
  };
  for (const auto& b : std::vector<bad>{
           {"sub", "{}", "no tool named 'sub' (the tools: add, now)"},
           {"add", R"({"a": 1})", "add: arguments: missing \"b\""},
           {"add", R"({"a": "1", "b": 2})", "add: arguments.a: expected number, got string"},
           {"add", R"({"a": 1, "b": 2.5})", "add: arguments.b: expected integer, got number"},
           {"add", R"({"a": 1, "b": 2, "c": 3})", "add: arguments: unexpected \"c\""},
           {"add", R"({"a": 1, "b": 2, "mode": "fast"})",
            "add: arguments.mode: \"fast\" is not one of [\"exact\",\"round\"]"},
           {"add", R"({"a": 1, "b": 2, "tags": ["x", 3]})",
            "add: arguments.tags[1]: expected string, got integer"},
       }) {
    auto r = check(b.name, b.args);
    ASSERT_FALSE(r) << b.args;
    EXPECT_EQ(code_of(r.error()), errc::invalid_argument);
    EXPECT_EQ(context_of(r.error()), b.why);
  }
}

TEST(ToolCalls, WrittenCallsReadBackInEachFormat) {
  const std::vector<tool_call> calls{
      {"calculator", ojson{{"expression", "48213 * 97"}}},
      {"lookup", ojson::parse(R"({"key": "pi", "n": 18446744073709551615, "x": [0.1, -0.0]})")}};
  for (auto f :
       {tool_call_format::hermes, tool_call_format::deepseek_v3, tool_call_format::llama3_json}) {
    SCOPED_TRACE(to_string(f));
    for (size_t k : {size_t{0}, size_t{1}, size_t{2}}) {
      std::vector<tool_call> some(calls.begin(), calls.begin() + static_cast<long>(k));
      // llama3_json: a turn with calls has no content.
      const std::string content = k > 0 && f == tool_call_format::llama3_json ? "" : "Let me see.";
      auto text = write_tool_calls(content, some, f);
      auto t = parse_tool_calls(text, f);
      EXPECT_TRUE(t.malformed.empty()) << text;
      EXPECT_EQ(t.content, content) << text;
      ASSERT_EQ(t.calls.size(), k) << text;
      for (size_t i = 0; i < k; ++i) {
        EXPECT_EQ(t.calls[i].name, some[i].name);
        EXPECT_EQ(t.calls[i].arguments, some[i].arguments);
      }
    }
  }
}
