#include "actors/job/events.hpp"
#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cmath>

namespace troupe::actors::job {

namespace {

using json = nlohmann::json;


// Payload → JSON object members.
struct json_writer {
  json& out;
  void operator()(const char* key, const std::string& v) { out[key] = v; }
  void operator()(const char* key, int64_t v) { out[key] = v; }
  void operator()(const char* key, int32_t v) { out[key] = v; }
  void operator()(const char* key, bool v) { out[key] = v; }
  void operator()(const char* key, double v) {
    out[key] = std::isfinite(v) ? json(v) : json(nullptr);
  }
  void operator()(const char* key, job_state v) { out[key] = to_string(v); }
  void operator()(const char* key, const metric_map& m) {
    json o = json::object();
    for (const auto& [k, v] : m)
      o[k] = std::isfinite(v) ? json(v) : json(nullptr);
    out[key] = std::move(o);
  }
  void operator()(const char* key, const std::vector<eval_sample>& v) {
    json a = json::array();
    for (const auto& s : v) {
      json o{{"prompt", s.prompt}, {"response", s.response}, {"score", s.score}};
      if (!s.conversation.empty())
        o["conversation"] = s.conversation;
      a.push_back(std::move(o));
    }
    out[key] = std::move(a);
  }
  template <class T>
  void operator()(const char* key, added_field<T> v) {
    (*this)(key, v.value);
  }
};

// JSON object members → payload; the first problem is kept.
struct json_reader {
  const json& in;
  std::string problem;

  const json* get(const char* key) {
    auto it = in.find(key);
    if (it == in.end()) {
      if (problem.empty())
        problem = std::string{"missing field \""} + key + "\"";
      return nullptr;
    }
    return &*it;
  }
  void bad(const char* key, const char* what) {
    if (problem.empty())
      problem = std::string{"field \""} + key + "\" is not " + what;
  }
  void operator()(const char* key, std::string& v) {
    if (auto* j = get(key))
      j->is_string() ? void(v = j->get<std::string>()) : bad(key, "a string");
  }
  template <class I>
  void integer(const char* key, I& v) {
    if (auto* j = get(key))
      j->is_number_integer() ? void(v = j->get<I>()) : bad(key, "an integer");
  }
  void operator()(const char* key, int64_t& v) { integer(key, v); }
  void operator()(const char* key, int32_t& v) { integer(key, v); }
  void operator()(const char* key, bool& v) {
    if (auto* j = get(key))
      j->is_boolean() ? void(v = j->get<bool>()) : bad(key, "a boolean");
  }
  static bool number(const json& j, double& v) {
    if (j.is_null())
      return v = NAN, true;
    if (!j.is_number())
      return false;
    v = j.get<double>();
    return true;
  }
  void operator()(const char* key, double& v) {
    if (auto* j = get(key); j && !number(*j, v))
      bad(key, "a number");
  }
  void operator()(const char* key, job_state& v) {
    auto* j = get(key);
    if (!j)
      return;
    auto s = j->is_string() ? parse_job_state(j->get<std::string>()) : std::nullopt;
    s ? void(v = *s) : bad(key, "a job state");
  }
  void operator()(const char* key, metric_map& m) {
    auto* j = get(key);
    if (!j)
      return;
    if (!j->is_object())
      return bad(key, "an object of numbers");
    for (const auto& [k, x] : j->items())
      if (!number(x, m[k]))
        return bad(key, "an object of numbers");
  }
  void operator()(const char* key, std::vector<eval_sample>& v) {
    auto* j = get(key);
    if (!j)
      return;
    if (!j->is_array())
      return bad(key, "an array");
    for (const auto& s : *j) {
      if (!s.is_object() || !s.contains("prompt") || !s.contains("response") ||
          !s["prompt"].is_string() || !s["response"].is_string() || !s.contains("score"))
        return bad(key, "an array of {prompt, response, score}");
      eval_sample e{s["prompt"].get<std::string>(), s["response"].get<std::string>(), 0, {}};
      if (!number(s["score"], e.score))
        return bad(key, "an array of {prompt, response, score}");
      if (s.contains("conversation")) {
        if (!s["conversation"].is_string())
          return bad(key, "an array of {prompt, response, score, conversation (text)}");
        e.conversation = s["conversation"].get<std::string>();
      }
      v.push_back(std::move(e));
    }
  }
  template <class T>
  void operator()(const char* key, added_field<T> v) {
    if (in.contains(key))
      (*this)(key, v.value);
  }
};

template <size_t I = 0>
bool make_body(std::string_view kind, event_body& out) {
  if constexpr (I == std::variant_size_v<event_body>) {
    return false;
  } else {
    using T = std::variant_alternative_t<I, event_body>;
    if (kind == T::kind) {
      out.emplace<I>();
      return true;
    }
    return make_body<I + 1>(kind, out);
  }
}

} // namespace

std::optional<job_state> parse_job_state(std::string_view s) noexcept {
  return enum_from_name<job_state>(s);
}

bool is_final(job_state s) noexcept {
  return s == job_state::succeeded || s == job_state::failed || s == job_state::cancelled;
}

std::string_view kind_of(const event_body& e) noexcept {
  return std::visit([](const auto& x) -> std::string_view { return x.kind; }, e);
}

std::vector<std::string_view> event_kinds() {
  return []<size_t... Is>(std::index_sequence<Is...>) {
    return std::vector<std::string_view>{std::variant_alternative_t<Is, event_body>::kind...};
  }
  (std::make_index_sequence<std::variant_size_v<event_body>>{});
}

std::string to_json(const event& e) {
  json j = json::object();
  j["seq"] = e.seq;
  j["time_us"] = e.time_us;
  j["kind"] = kind_of(e.body);
  std::visit(
      [&](const auto& x) {
        json_writer w{j};
        fields(w, const_cast<std::decay_t<decltype(x)>&>(x));
      },
      e.body);
  return j.dump();
}

expected<event> event_from_json(std::string_view line) {
  if (auto at = runtime::json_too_deep_at(line); at != std::string_view::npos)
    return runtime::json_too_deep("event", at);
  auto j = json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(errc::parse_error, "event: not a JSON object");
  event e;
  if (!j.contains("seq") || !j["seq"].is_number_integer() || !j.contains("time_us") ||
      !j["time_us"].is_number_integer() || !j.contains("kind") || !j["kind"].is_string())
    return make_error(errc::parse_error, "event: needs integer seq and time_us and a string kind");
  e.seq = j["seq"].get<int64_t>();
  e.time_us = j["time_us"].get<int64_t>();
  auto kind = j["kind"].get<std::string>();
  if (!make_body(kind, e.body))
    return make_error(errc::parse_error,
                      "event " + std::to_string(e.seq) + ": unknown kind \"" + kind + "\"");
  json_reader r{j, {}};
  std::visit([&](auto& x) { fields(r, x); }, e.body);
  if (!r.problem.empty())
    return make_error(errc::parse_error,
                      "event " + std::to_string(e.seq) + " (" + kind + "): " + r.problem);
  return e;
}

int64_t now_us() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

size_t each_journal_event(std::string_view text, const std::function<void(const event&)>& fn) {
  size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string_view::npos)
      break;
    if (auto e = event_from_json(text.substr(start, end - start)))
      fn(*e);
    start = end + 1;
  }
  return start;
}

} // namespace troupe::actors::job
