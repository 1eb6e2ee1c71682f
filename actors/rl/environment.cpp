#include "actors/rl/environment.hpp"

#include <algorithm>
#include <mutex>

// The built-in environments (NOTE [environments]) and the calculator's
// exact integer arithmetic.
namespace troupe::actors::rl {

nlohmann::ordered_json observation::messages_json() const {
  auto out = nlohmann::ordered_json::array();
  for (const auto& m : messages) {
    nlohmann::ordered_json j{{"role", m.role}, {"content", m.content}};
    if (!m.name.empty())
      j["name"] = m.name;
    if (!m.tool_call_id.empty())
      j["tool_call_id"] = m.tool_call_id;
    out.push_back(std::move(j));
  }
  return out;
}

std::string message_text(const nlohmann::ordered_json& m) {
  if (!m.is_object() || !m.contains("content"))
    return "";
  const auto& c = m["content"];
  if (c.is_string())
    return c.get<std::string>();
  std::string out;
  if (c.is_array())
    for (const auto& part : c)
      if (part.is_object() && part.value("type", "") == "text" && part.contains("text") &&
          part["text"].is_string())
        out += part["text"].get<std::string>();
  return out;
}

std::vector<models::tool_call> tool_calls_of(const nlohmann::ordered_json& m) {
  using json = nlohmann::ordered_json;
  std::vector<models::tool_call> out;
  if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array())
    return out;
  for (const auto& c : m["tool_calls"]) {
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
      continue;
    const auto& f = c["function"];
    json args = json::object();
    if (f.contains("arguments") && f["arguments"].is_string())
      args = json::parse(f["arguments"].get<std::string>(), nullptr, false);
    else if (f.contains("arguments"))
      args = f["arguments"];
    out.push_back({f.value("name", ""), std::move(args)});
  }
  return out;
}

observation observation_from_messages(const nlohmann::ordered_json& messages, size_t from) {
  observation o;
  for (size_t i = from; i < messages.size(); ++i) {
    const auto& m = messages[i];
    o.messages.push_back({m.value("role", "user"), message_text(m), m.value("name", ""),
                          m.value("tool_call_id", "")});
  }
  return o;
}

namespace {

// ---- exact integers ------------------------------------------------------------

// A signed integer as its decimal digits, least significant first (no
// leading zeros; zero is an empty magnitude and never negative).
struct big_int {
  bool negative = false;
  std::vector<uint8_t> digits;

  static big_int of(std::string_view decimal) {
    big_int out;
    for (auto it = decimal.rbegin(); it != decimal.rend(); ++it)
      out.digits.push_back(static_cast<uint8_t>(*it - '0'));
    out.trim();
    return out;
  }
  void trim() {
    while (!digits.empty() && digits.back() == 0)
      digits.pop_back();
    if (digits.empty())
      negative = false;
  }
  std::string str() const {
    if (digits.empty())
      return "0";
    std::string s = negative ? "-" : "";
    for (auto it = digits.rbegin(); it != digits.rend(); ++it)
      s.push_back(static_cast<char>('0' + *it));
    return s;
  }
};

int compare_magnitude(const big_int& a, const big_int& b) {
  if (a.digits.size() != b.digits.size())
    return a.digits.size() < b.digits.size() ? -1 : 1;
  for (size_t i = a.digits.size(); i-- > 0;)
    if (a.digits[i] != b.digits[i])
      return a.digits[i] < b.digits[i] ? -1 : 1;
  return 0;
}

big_int add_magnitudes(const big_int& a, const big_int& b) {
  big_int out;
  int carry = 0;
  for (size_t i = 0; i < std::max(a.digits.size(), b.digits.size()) || carry; ++i) {
    int d =
        carry + (i < a.digits.size() ? a.digits[i] : 0) + (i < b.digits.size() ? b.digits[i] : 0);
    out.digits.push_back(static_cast<uint8_t>(d % 10));
    carry = d / 10;
  }
  return out;
}

// |a| - |b| for |a| >= |b|.
big_int subtract_magnitudes(const big_int& a, const big_int& b) {
  big_int out;
  int borrow = 0;
  for (size_t i = 0; i < a.digits.size(); ++i) {
    int d = a.digits[i] - borrow - (i < b.digits.size() ? b.digits[i] : 0);
    borrow = d < 0 ? 1 : 0;
    out.digits.push_back(static_cast<uint8_t>(d + 10 * borrow));
  }
  out.trim();
  return out;
}

big_int add(const big_int& a, const big_int& b) {
  big_int out;
  if (a.negative == b.negative) {
    out = add_magnitudes(a, b);
    out.negative = a.negative;
  } else if (compare_magnitude(a, b) >= 0) {
    out = subtract_magnitudes(a, b);
    out.negative = a.negative;
  } else {
    out = subtract_magnitudes(b, a);
    out.negative = b.negative;
  }
  out.trim();
  return out;
}

big_int negate(big_int a) {
  a.negative = !a.negative;
  a.trim();
  return a;
}

big_int multiply(const big_int& a, const big_int& b) {
  big_int out;
  if (a.digits.empty() || b.digits.empty())
    return out;
  std::vector<uint32_t> acc(a.digits.size() + b.digits.size(), 0);
  for (size_t i = 0; i < a.digits.size(); ++i)
    for (size_t j = 0; j < b.digits.size(); ++j)
      acc[i + j] += static_cast<uint32_t>(a.digits[i]) * b.digits[j];
  uint64_t carry = 0;
  for (auto& d : acc) {
    uint64_t v = d + carry;
    d = static_cast<uint32_t>(v % 10);
    carry = v / 10;
  }
  for (auto d : acc)
    out.digits.push_back(static_cast<uint8_t>(d));
  out.negative = a.negative != b.negative;
  out.trim();
  return out;
}

// expr := term (('+' | '-') term)*; term := factor ('*' factor)*;
// factor := '-' factor | '(' expr ')' | digits.
class expression_reader {
public:
  explicit expression_reader(std::string_view text) : s_(text) {}

  expected<big_int> read() {
    auto v = expr(0);
    if (!v)
      return v;
    skip();
    if (at_ < s_.size())
      return fail("unexpected '" + std::string(1, s_[at_]) + "'");
    return v;
  }

private:
  static constexpr int max_depth = 64;

  void skip() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n'))
      ++at_;
  }
  caf::error fail(const std::string& why) const {
    return make_error(errc::invalid_argument,
                      "expression: byte " + std::to_string(at_) + ": " + why);
  }
  expected<big_int> expr(int depth) {
    auto left = term(depth);
    if (!left)
      return left;
    for (skip(); at_ < s_.size() && (s_[at_] == '+' || s_[at_] == '-'); skip()) {
      const bool minus = s_[at_++] == '-';
      auto right = term(depth);
      if (!right)
        return right;
      *left = add(*left, minus ? negate(std::move(*right)) : *right);
    }
    return left;
  }
  expected<big_int> term(int depth) {
    auto left = factor(depth);
    if (!left)
      return left;
    for (skip(); at_ < s_.size() && s_[at_] == '*'; skip()) {
      ++at_;
      auto right = factor(depth);
      if (!right)
        return right;
      *left = multiply(*left, *right);
    }
    return left;
  }
  expected<big_int> factor(int depth) {
    if (depth > max_depth)
      return fail("more than " + std::to_string(max_depth) + " nested terms");
    skip();
    if (at_ == s_.size())
      return fail("a number was expected, the expression ended");
    if (s_[at_] == '-') {
      ++at_;
      auto v = factor(depth + 1);
      return v ? expected<big_int>{negate(std::move(*v))} : v;
    }
    if (s_[at_] == '(') {
      ++at_;
      auto v = expr(depth + 1);
      if (!v)
        return v;
      skip();
      if (at_ == s_.size() || s_[at_] != ')')
        return fail("')' was expected");
      ++at_;
      return v;
    }
    auto begin = at_;
    while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9')
      ++at_;
    if (begin == at_)
      return fail("a number was expected, found '" + std::string(1, s_[at_]) + "'");
    return big_int::of(s_.substr(begin, at_ - begin));
  }

  std::string_view s_;
  size_t at_ = 0;
};

// ---- the built-in environments --------------------------------------------------

// The row's prompt as the first observation: its conversation when it has
// one, else its text (which the prompt encoder renders as the batch path does).
observation first_observation(const example& row) {
  observation o;
  if (row.messages.empty()) {
    o.text = row.prompt;
    return o;
  }
  auto all = nlohmann::ordered_json::parse(row.messages, nullptr, false);
  if (all.is_array())
    for (const auto& m : all)
      if (m.is_object())
        o.messages.push_back({m.value("role", ""), m.value("content", ""), m.value("name", ""),
                              m.value("tool_call_id", "")});
  return o;
}

// Sessions' answers, kept from reset to their last step.
class answer_book {
public:
  void open(const std::vector<reset_task>& tasks) {
    std::lock_guard lock{mu_};
    for (const auto& t : tasks)
      answers_[t.session] = t.row.answer;
  }
  expected<std::string> of(const std::string& session) const {
    std::lock_guard lock{mu_};
    auto it = answers_.find(session);
    if (it == answers_.end())
      return make_error(errc::not_found, "session '" + session + "': not open");
    return it->second;
  }
  void close(const std::string& session) {
    std::lock_guard lock{mu_};
    answers_.erase(session);
  }

private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> answers_;
};

// The final turn scored by the rules against the session's answer.
expected<step_result> scored_end(const rule_set& rules, answer_book& book, const env_turn& t) {
  auto answer = book.of(t.session);
  if (!answer)
    return answer.error();
  auto score = rules.score({t.text, t.tokens, *answer});
  if (!score)
    return with_prefix(score.error(), "session '" + t.session + "'");
  book.close(t.session);
  step_result r;
  r.session = t.session;
  r.done = true;
  r.reward = *score;
  return r;
}

// An environment over data rows whose episode ends with an answer scored
// by rules against the row's answer: the row's prompt first, the tools of
// tools(), a turn with calls answered by call().
class rule_scored_environment : public environment {
public:
  explicit rule_scored_environment(rule_set rules) : rules_(std::move(rules)) {}

  expected<std::vector<reset_result>> reset(const std::vector<reset_task>& tasks) override {
    book_.open(tasks);
    std::vector<reset_result> out;
    for (const auto& t : tasks)
      out.push_back({t.session, first_observation(t.row), tools()});
    return out;
  }

  expected<std::vector<step_result>> step(const std::vector<env_turn>& turns) override {
    std::vector<step_result> out;
    for (const auto& t : turns) {
      if (t.calls.empty()) {
        auto r = scored_end(rules_, book_, t);
        if (!r)
          return r.error();
        out.push_back(std::move(*r));
        continue;
      }
      step_result r;
      r.session = t.session;
      for (const auto& c : t.calls)
        r.next.messages.push_back({"tool", call(c), c.name, c.id});
      r.info[name() + "_calls"] = static_cast<double>(t.calls.size());
      out.push_back(std::move(r));
    }
    return out;
  }

  void close(const std::vector<std::string>& sessions, std::string_view) override {
    for (const auto& s : sessions)
      book_.close(s);
  }

protected:
  virtual nlohmann::ordered_json tools() const { return nullptr; }
  /// A call's result text (an error is a result: the model reads it).
  virtual std::string call(const env_tool_call& c) const { return "error: no tools"; }

private:
  rule_set rules_;
  answer_book book_;
};

class task_environment final : public rule_scored_environment {
public:
  using rule_scored_environment::rule_scored_environment;
  std::string name() const override { return "task"; }
};

class calculator_environment final : public rule_scored_environment {
public:
  using rule_scored_environment::rule_scored_environment;
  std::string name() const override { return "calculator"; }

protected:
  nlohmann::ordered_json tools() const override {
    return nlohmann::ordered_json::array({calculator_tool()});
  }
  std::string call(const env_tool_call& c) const override {
    auto args = nlohmann::ordered_json::parse(c.arguments_json, nullptr, false);
    std::string expression = args.is_object() ? args.value("expression", "") : "";
    auto value = evaluate_integer_expression(expression);
    return value ? *value : "error: " + context_of(value.error());
  }
};

} // namespace

std::unique_ptr<environment> make_task_environment(rule_set rules) {
  return std::make_unique<task_environment>(std::move(rules));
}

std::unique_ptr<environment> make_calculator_environment(rule_set rules) {
  return std::make_unique<calculator_environment>(std::move(rules));
}

nlohmann::ordered_json calculator_tool() {
  return {{"type", "function"},
          {"function",
           {{"name", "calculator"},
            {"description", "Evaluates an integer expression exactly (+, -, *, parentheses)."},
            {"parameters",
             {{"type", "object"},
              {"properties",
               {{"expression", {{"type", "string"}, {"description", "e.g. 48213 + 99731"}}}}},
              {"required", {"expression"}}}}}}};
}

expected<std::string> evaluate_integer_expression(std::string_view expression) {
  constexpr size_t max_bytes = 4096;
  if (expression.size() > max_bytes)
    return make_error(errc::invalid_argument, "expression: " + std::to_string(expression.size()) +
                                                  " bytes (at most " + std::to_string(max_bytes) +
                                                  ")");
  auto v = expression_reader{expression}.read();
  if (!v)
    return v.error();
  return v->str();
}

expected<std::vector<demonstration>> to_tool_demonstrations(const std::vector<example>& examples) {
  using json = nlohmann::ordered_json;
  const auto tools = json::array({calculator_tool()}).dump();
  std::vector<demonstration> out;
  out.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& ex = examples[i];
    const std::string_view p = ex.prompt;
    const auto where = "tool demonstration " + std::to_string(i + 1) + " ('" + ex.prompt + "')";
    if (p.size() < 6 || p.substr(0, 4) != "add:" || p.back() != '=')
      return make_error(errc::invalid_argument, where + ": not an add prompt");
    const std::string expression{p.substr(4, p.size() - 5)};
    auto value = evaluate_integer_expression(expression);
    if (!value || *value != ex.answer)
      return make_error(errc::invalid_argument, where + ": its sum is not its answer");
    const std::string id = "call_1_1";
    json call{{"id", id},
              {"type", "function"},
              {"function",
               {{"name", "calculator"}, {"arguments", json{{"expression", expression}}.dump()}}}};
    json turns = json::array(
        {json{{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}},
         json{{"role", "tool"}, {"tool_call_id", id}, {"name", "calculator"}, {"content", *value}},
         json{{"role", "assistant"}, {"content", ex.answer}}});
    out.push_back({ex.prompt, ex.answer, "", turns.dump(), tools});
  }
  return out;
}

} // namespace troupe::actors::rl
