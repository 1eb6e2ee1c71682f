#include "models/tool_calls.hpp"

#include "models/chat_template_detail.hpp"
#include "runtime/jsonl.hpp"

#include <cmath>

namespace troupe::models {

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view hermes_open = "<tool_call>";
constexpr std::string_view hermes_close = "</tool_call>";
// DeepSeek's markers: fullwidth vertical lines (U+FF5C) around words joined
// by U+2581.
constexpr std::string_view ds_calls_begin = "<\uFF5Ctool\u2581calls\u2581begin\uFF5C>";
constexpr std::string_view ds_calls_end = "<\uFF5Ctool\u2581calls\u2581end\uFF5C>";
constexpr std::string_view ds_call_begin = "<\uFF5Ctool\u2581call\u2581begin\uFF5C>";
constexpr std::string_view ds_call_end = "<\uFF5Ctool\u2581call\u2581end\uFF5C>";
constexpr std::string_view ds_sep = "<\uFF5Ctool\u2581sep\uFF5C>";
constexpr std::string_view python_tag = "<|python_tag|>";

std::string_view trim(std::string_view s) {
  const auto* ws = " \t\r\n";
  auto b = s.find_first_not_of(ws);
  if (b == std::string_view::npos)
    return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// What a turn is being read into: calls are numbered as they are met.
struct turn_reader {
  parsed_turn out;
  size_t seen = 0;

  // The next call's number, or nullopt past the bound (then noted once).
  std::optional<size_t> next() {
    ++seen;
    if (seen == max_tool_calls_per_turn + 1)
      out.malformed.push_back("tool call " + std::to_string(seen) + ": more than " +
                              std::to_string(max_tool_calls_per_turn) +
                              " calls in one turn; the rest are not read");
    if (seen > max_tool_calls_per_turn)
      return std::nullopt;
    return seen;
  }
  void bad(size_t n, const std::string& why) {
    out.malformed.push_back("tool call " + std::to_string(n) + ": " + why);
  }
  void add_content(std::string_view text) { out.content.append(text); }
};

// JSON text as a value, or why not.
expected<ojson> parse_json(std::string_view text) {
  if (auto at = runtime::json_too_deep_at(text); at != std::string_view::npos)
    return make_error(errc::out_of_range, "JSON nested deeper than " +
                                              std::to_string(runtime::max_json_depth) +
                                              " levels at byte " + std::to_string(at));
  auto j = ojson::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded())
    return make_error(errc::parse_error, "not JSON: " + std::string{trim(text).substr(0, 80)});
  return j;
}

const char* type_of(const ojson& j) {
  switch (j.type()) {
  case ojson::value_t::null:
    return "null";
  case ojson::value_t::boolean:
    return "boolean";
  case ojson::value_t::number_integer:
  case ojson::value_t::number_unsigned:
    return "integer";
  case ojson::value_t::number_float:
    return "number";
  case ojson::value_t::string:
    return "string";
  case ojson::value_t::array:
    return "array";
  case ojson::value_t::object:
    return "object";
  default:
    return "other";
  }
}

// Arguments as the model wrote them: an object, or a string holding one
// (some models encode them twice).
expected<ojson> arguments_of(const ojson& a) {
  if (a.is_object())
    return a;
  if (a.is_string()) {
    auto inner = parse_json(a.get<std::string>());
    if (inner && inner->is_object())
      return inner;
  }
  return make_error(errc::invalid_argument,
                    std::string{"arguments must be a JSON object, got "} + type_of(a));
}

// A call written as one JSON object: {"name": ..., <args_key>: {...}}.
expected<tool_call> call_of_object(const ojson& j, std::initializer_list<const char*> args_keys) {
  if (!j.is_object())
    return make_error(errc::invalid_argument,
                      std::string{"expected a JSON object, got "} + type_of(j));
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty())
    return make_error(errc::invalid_argument, "no \"name\" (a non-empty string)");
  tool_call c;
  c.name = name->get<std::string>();
  for (const auto* key : args_keys)
    if (auto a = j.find(key); a != j.end()) {
      auto args = arguments_of(*a);
      if (!args)
        return args.error();
      c.arguments = std::move(*args);
      break;
    }
  return c;
}

void read_call_text(turn_reader& r, size_t n, std::string_view body,
                    std::initializer_list<const char*> args_keys) {
  auto j = parse_json(trim(body));
  if (!j)
    return r.bad(n, context_of(j.error()));
  auto c = call_of_object(*j, args_keys);
  if (!c)
    return r.bad(n, context_of(c.error()));
  r.out.calls.push_back(std::move(*c));
}

void read_hermes(turn_reader& r, std::string_view text) {
  size_t pos = 0;
  for (;;) {
    auto open = text.find(hermes_open, pos);
    if (open == std::string_view::npos) {
      r.add_content(text.substr(pos));
      return;
    }
    r.add_content(text.substr(pos, open - pos));
    auto n = r.next();
    auto body = open + hermes_open.size();
    auto close = text.find(hermes_close, body);
    if (!n)
      return;
    if (close == std::string_view::npos)
      return r.bad(*n, "no </tool_call>: the turn ended inside the call");
    read_call_text(r, *n, text.substr(body, close - body), {"arguments", "parameters"});
    pos = close + hermes_close.size();
  }
}

// One DeepSeek call: "function<sep>NAME\n```json\nARGS\n```" (V3), or
// "NAME<sep>ARGS" (V3.1).
void read_deepseek_call(turn_reader& r, size_t n, std::string_view body) {
  auto sep = body.find(ds_sep);
  if (sep == std::string_view::npos)
    return r.bad(n, "no tool separator between the call's type and its name");
  auto head = trim(body.substr(0, sep));
  auto rest = body.substr(sep + ds_sep.size());
  tool_call c;
  std::string_view args_text;
  if (head == "function") {
    auto eol = rest.find('\n');
    c.name = std::string{trim(rest.substr(0, eol))};
    auto fence = rest.find("```", eol == std::string_view::npos ? rest.size() : eol);
    if (fence == std::string_view::npos)
      return r.bad(n, "no ```json block with the arguments of '" + c.name + "'");
    auto args_start = rest.find('\n', fence);
    auto fence_end = args_start == std::string_view::npos ? std::string_view::npos
                                                          : rest.find("```", args_start);
    if (fence_end == std::string_view::npos)
      return r.bad(n, "the arguments' ```json block of '" + c.name + "' is not closed");
    args_text = rest.substr(args_start, fence_end - args_start);
  } else {
    c.name = std::string{head};
    args_text = rest;
  }
  if (c.name.empty())
    return r.bad(n, "no tool name");
  auto j = parse_json(trim(args_text));
  if (!j)
    return r.bad(n, "arguments of '" + c.name + "': " + context_of(j.error()));
  auto args = arguments_of(*j);
  if (!args)
    return r.bad(n, "'" + c.name + "': " + context_of(args.error()));
  c.arguments = std::move(*args);
  r.out.calls.push_back(std::move(c));
}

void read_deepseek(turn_reader& r, std::string_view text) {
  auto begin = text.find(ds_calls_begin);
  if (begin == std::string_view::npos)
    return r.add_content(text);
  r.add_content(text.substr(0, begin));
  auto block_start = begin + ds_calls_begin.size();
  auto end = text.find(ds_calls_end, block_start);
  auto block = text.substr(block_start, end == std::string_view::npos ? std::string_view::npos
                                                                      : end - block_start);
  if (end != std::string_view::npos)
    r.add_content(text.substr(end + ds_calls_end.size()));
  size_t pos = 0;
  for (;;) {
    auto open = block.find(ds_call_begin, pos);
    if (open == std::string_view::npos)
      return;
    auto n = r.next();
    if (!n)
      return;
    auto body = open + ds_call_begin.size();
    auto close = block.find(ds_call_end, body);
    if (close == std::string_view::npos)
      return r.bad(*n, "no tool-call end marker: the turn ended inside the call");
    read_deepseek_call(r, *n, block.substr(body, close - body));
    pos = close + ds_call_end.size();
  }
}

void read_llama3(turn_reader& r, std::string_view text) {
  auto t = trim(text);
  if (t.substr(0, python_tag.size()) == python_tag)
    t = trim(t.substr(python_tag.size()));
  if (t.empty() || t.front() != '{')
    return r.add_content(text);
  size_t pos = 0;
  while (pos < t.size()) {
    auto n = r.next();
    if (!n)
      return;
    auto end = t[pos] == '{' ? runtime::json_container_end(t, pos) : std::string_view::npos;
    if (end == std::string_view::npos)
      return r.bad(*n, "not a JSON object: " + std::string{t.substr(pos, 80)});
    read_call_text(r, *n, t.substr(pos, end - pos), {"parameters", "arguments"});
    auto next = trim(t.substr(end));
    if (next.empty())
      return;
    if (next.front() != ';') {
      if (auto m = r.next())
        r.bad(*m, "expected ';' between calls, got: " + std::string{next.substr(0, 80)});
      return;
    }
    next = trim(next.substr(1));
    pos = t.size() - next.size();
  }
}

// ---- schemas ----------------------------------------------------------------

bool has_type(const ojson& v, std::string_view type) {
  if (type == "object")
    return v.is_object();
  if (type == "array")
    return v.is_array();
  if (type == "string")
    return v.is_string();
  if (type == "boolean")
    return v.is_boolean();
  if (type == "null")
    return v.is_null();
  if (type == "number")
    return v.is_number();
  if (type == "integer") {
    if (v.is_number_integer())
      return true;
    if (!v.is_number_float())
      return false;
    double d = v.get<double>();
    return std::isfinite(d) && d == std::floor(d);
  }
  return true; // a type this subset does not know constrains nothing
}

std::string type_check(const ojson& v, const ojson& type) {
  std::string want;
  if (type.is_string()) {
    if (has_type(v, type.get<std::string>()))
      return {};
    want = type.get<std::string>();
  } else if (type.is_array()) {
    for (const auto& t : type) {
      if (t.is_string() && has_type(v, t.get<std::string>()))
        return {};
      want += (want.empty() ? "" : " or ") + (t.is_string() ? t.get<std::string>() : "?");
    }
  } else {
    return {};
  }
  return "expected " + want + ", got " + type_of(v);
}

constexpr int max_schema_depth = 64;

// Why `v` does not satisfy `schema` ("" when it does), at `path`.
std::string schema_check(const ojson& v, const ojson& schema, const std::string& path, int depth) {
  if (!schema.is_object())
    return {};
  if (depth > max_schema_depth)
    return path + ": the schema nests deeper than " + std::to_string(max_schema_depth) + " levels";
  if (auto t = schema.find("type"); t != schema.end())
    if (auto why = type_check(v, *t); !why.empty())
      return path + ": " + why;
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
    bool found = false;
    for (const auto& x : *e)
      found = found || x == v;
    if (!found)
      return path + ": " + v.dump() + " is not one of " + e->dump();
  }
  if (v.is_object()) {
    if (auto req = schema.find("required"); req != schema.end() && req->is_array())
      for (const auto& k : *req)
        if (k.is_string() && !v.contains(k.get<std::string>()))
          return path + ": missing \"" + k.get<std::string>() + "\"";
    auto props = schema.find("properties");
    auto extra = schema.find("additionalProperties");
    for (const auto& [k, x] : v.items()) {
      if (props != schema.end() && props->is_object() && props->contains(k)) {
        if (auto why = schema_check(x, (*props)[k], path + "." + k, depth + 1); !why.empty())
          return why;
      } else if (extra != schema.end() && extra->is_boolean() && !extra->get<bool>()) {
        return path + ": unexpected \"" + k + "\"";
      } else if (extra != schema.end() && extra->is_object()) {
        if (auto why = schema_check(x, *extra, path + "." + k, depth + 1); !why.empty())
          return why;
      }
    }
  }
  if (v.is_array())
    if (auto items = schema.find("items"); items != schema.end())
      for (size_t i = 0; i < v.size(); ++i)
        if (auto why = schema_check(v[i], *items, path + "[" + std::to_string(i) + "]", depth + 1);
            !why.empty())
          return why;
  return {};
}

// A tool's function entry: {"type": "function", "function": {...}}, or the
// function itself.
const ojson* function_of(const ojson& tool) {
  if (!tool.is_object())
    return nullptr;
  if (auto f = tool.find("function"); f != tool.end() && f->is_object())
    return &*f;
  return &tool;
}

} // namespace

std::optional<tool_call_format> tool_call_format_of_template(std::string_view source) noexcept {
  if (source.find(hermes_open) != std::string_view::npos)
    return tool_call_format::hermes;
  if (source.find(ds_calls_begin) != std::string_view::npos)
    return tool_call_format::deepseek_v3;
  return std::nullopt;
}

parsed_turn parse_tool_calls(std::string_view text, tool_call_format format) {
  turn_reader r;
  switch (format) {
  case tool_call_format::hermes:
    read_hermes(r, text);
    break;
  case tool_call_format::deepseek_v3:
    read_deepseek(r, text);
    break;
  case tool_call_format::llama3_json:
    read_llama3(r, text);
    break;
  }
  r.out.content = std::string{trim(r.out.content)};
  return std::move(r.out);
}

std::string write_tool_calls(std::string_view content, const std::vector<tool_call>& calls,
                             tool_call_format format) {
  // As templates spell JSON (Python's json.dumps: ", " and ": "); a value
  // Jinja cannot hold (an integer past int64) compactly.
  auto dump = [](const nlohmann::ordered_json& j) {
    try {
      return jinja::dump_json(jinja::from_json(j), jinja::json_options{});
    } catch (const jinja::failure&) {
      return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    }
  };
  auto object = [&](std::string_view args_key, const tool_call& c) {
    return "{\"name\": " + dump(c.name) + ", \"" + std::string{args_key} +
           "\": " + dump(c.arguments) + "}";
  };
  std::string out;
  switch (format) {
  case tool_call_format::hermes:
    out = std::string{content};
    for (const auto& c : calls)
      out += (out.empty() ? "" : "\n") + std::string{hermes_open} + "\n" + object("arguments", c) +
             "\n" + std::string{hermes_close};
    return out;
  case tool_call_format::deepseek_v3:
    out = std::string{content};
    if (calls.empty())
      return out;
    out += ds_calls_begin;
    for (const auto& c : calls)
      out += std::string{ds_call_begin} + "function" + std::string{ds_sep} + c.name +
             "\n```json\n" + dump(c.arguments) + "\n```" + std::string{ds_call_end};
    return out + std::string{ds_calls_end};
  case tool_call_format::llama3_json:
    if (calls.empty())
      return std::string{content};
    for (const auto& c : calls)
      out += (out.empty() ? "" : "; ") + object("parameters", c);
    return out;
  }
  return out;
}

expected<void> check_tool_call(const tool_call& call, const nlohmann::ordered_json& tools) {
  std::string names;
  if (tools.is_array())
    for (const auto& t : tools) {
      const auto* f = function_of(t);
      if (!f)
        continue;
      auto name = f->find("name");
      if (name == f->end() || !name->is_string())
        continue;
      if (name->get<std::string>() != call.name) {
        names += (names.empty() ? "" : ", ") + name->get<std::string>();
        continue;
      }
      auto params = f->find("parameters");
      if (params == f->end())
        return {};
      if (auto why = schema_check(call.arguments, *params, "arguments", 0); !why.empty())
        return make_error(errc::invalid_argument, call.name + ": " + why);
      return {};
    }
  return make_error(errc::invalid_argument, "no tool named '" + call.name + "' (the tools: " +
                                                (names.empty() ? "none" : names) + ")");
}

} // namespace troupe::models
