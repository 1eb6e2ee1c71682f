#include "actors/rl/verifiers.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace troupe::actors::rl {

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front()))
    s.remove_prefix(1);
  while (!s.empty() && is_space(s.back()))
    s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

// The run of -?[0-9.,]+ starting at `i` (the sign only first), or "".
std::string_view number_run(std::string_view text, size_t i) {
  size_t j = i;
  if (j < text.size() && text[j] == '-')
    ++j;
  size_t body = j;
  while (j < text.size() && (is_digit(text[j]) || text[j] == '.' || text[j] == ','))
    ++j;
  return j > body ? text.substr(i, j - i) : std::string_view{};
}

std::string without_commas(std::string_view s) {
  std::string out;
  for (char c : s)
    if (c != ',')
      out += c;
  return out;
}

// The last "#### " followed by a number run.
std::optional<std::string> extract_strict(std::string_view text) {
  std::optional<std::string> out;
  constexpr std::string_view mark = "#### ";
  for (auto at = text.find(mark); at != std::string_view::npos; at = text.find(mark, at + 1)) {
    auto run = number_run(text, at + mark.size());
    if (!run.empty())
      out = without_commas(run);
  }
  return out;
}

// The last run of -?[0-9.,]+ holding a digit (runs are maximal, left to
// right, like the reference's findall).
std::optional<std::string> extract_flexible(std::string_view text) {
  std::optional<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    auto run = number_run(text, i);
    if (run.empty()) {
      ++i;
      continue;
    }
    if (std::any_of(run.begin(), run.end(), is_digit))
      out = std::string{run};
    i += run.size();
  }
  return out;
}

// The brace group opening at text[open] == '{': its content, or nullopt when
// it never closes.
std::optional<std::string> brace_content(std::string_view text, size_t open) {
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '{')
      ++depth;
    else if (text[i] == '}' && --depth == 0)
      return std::string{text.substr(open + 1, i - open - 1)};
  }
  return std::nullopt;
}

} // namespace

std::optional<std::string> last_boxed(std::string_view text) {
  auto at = text.rfind("\\boxed");
  size_t name = 6;
  if (at == std::string_view::npos) {
    at = text.rfind("\\fbox");
    name = 5;
  }
  if (at == std::string_view::npos)
    return std::nullopt;
  auto rest = text.substr(at + name);
  if (starts_with(rest, " ")) { // "\boxed 5$": up to the closing dollar
    rest.remove_prefix(1);
    return std::string{rest.substr(0, rest.find('$'))};
  }
  auto open = rest.find_first_not_of(" \t\n");
  if (open == std::string_view::npos || rest[open] != '{')
    return std::nullopt;
  return brace_content(rest, open);
}

std::optional<std::string> extract_answer(answer_extract mode, std::string_view text) {
  switch (mode) {
  case answer_extract::none:
    return std::string{text};
  case answer_extract::strict:
    return extract_strict(text);
  case answer_extract::flexible:
    return extract_flexible(text);
  case answer_extract::boxed:
    return last_boxed(text);
  }
  return std::nullopt;
}

std::string ground_truth_answer(std::string_view ground_truth) {
  if (auto s = extract_strict(ground_truth))
    return *s;
  if (auto b = last_boxed(ground_truth))
    return *b;
  return std::string{ground_truth};
}

// ---- normalisation ----------------------------------------------------------------

namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (auto at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

// "\text{x}" → "x" (and \mbox, \textbf, \mathrm).
void unwrap_commands(std::string& s) {
  for (std::string_view cmd : {"\\text", "\\mbox", "\\textbf", "\\mathrm"}) {
    for (auto at = s.find(cmd); at != std::string::npos; at = s.find(cmd, at)) {
      auto open = at + cmd.size();
      if (open >= s.size() || s[open] != '{') {
        at = open;
        continue;
      }
      auto inner = brace_content(s, open);
      if (!inner)
        break;
      s.replace(at, inner->size() + cmd.size() + 2, *inner);
    }
  }
}

// Surrounding math delimiters: $x$, $$x$$, \(x\), \[x\].
std::string_view strip_delimiters(std::string_view s) {
  for (auto [open, close] : std::array<std::pair<std::string_view, std::string_view>, 4>{
           {{"$$", "$$"}, {"$", "$"}, {"\\(", "\\)"}, {"\\[", "\\]"}}}) {
    if (s.size() >= open.size() + close.size() && starts_with(s, open) &&
        s.substr(s.size() - close.size()) == close)
      return trim(s.substr(open.size(), s.size() - open.size() - close.size()));
  }
  return s;
}

} // namespace

std::string normalize_answer(std::string_view text) {
  std::string s{strip_delimiters(trim(text))};
  unwrap_commands(s);
  for (std::string_view drop : {"\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle",
                                "^{\\circ}", "^\\circ", "\\$"})
    replace_all(s, drop, "");
  replace_all(s, "\\dfrac", "\\frac");
  replace_all(s, "\\tfrac", "\\frac");
  replace_all(s, "\\%", "%");
  std::string out;
  for (char c : s)
    if (!is_space(c))
      out += c;
  while (!out.empty() && out.back() == '.')
    out.pop_back();
  return out;
}

// ---- exact numbers -----------------------------------------------------------------

namespace {

using i128 = __int128;

i128 gcd(i128 a, i128 b) {
  a = a < 0 ? -a : a;
  b = b < 0 ? -b : b;
  while (b != 0) {
    auto t = a % b;
    a = b;
    b = t;
  }
  return a;
}

std::optional<exact_number> reduced(i128 num, i128 den) {
  if (den == 0)
    return std::nullopt;
  if (den < 0) {
    num = -num;
    den = -den;
  }
  auto g = gcd(num, den);
  if (g > 1) {
    num /= g;
    den /= g;
  }
  return exact_number{num, den, false};
}

std::optional<i128> times(i128 a, i128 b) {
  i128 out;
  if (__builtin_mul_overflow(a, b, &out))
    return std::nullopt;
  return out;
}

std::optional<i128> pow10(int64_t e) {
  i128 out = 1;
  for (int64_t i = 0; i < e; ++i) {
    auto next = times(out, 10);
    if (!next)
      return std::nullopt;
    out = *next;
  }
  return out;
}

// Digits with thousands separators in groups of three ("1,234,567"), or
// plain digits; the digits alone, or nullopt.
std::optional<std::string> integer_digits(std::string_view s) {
  std::string out;
  size_t group = 0;
  for (size_t start = 0;; ++group) {
    auto comma = s.find(',', start);
    auto part = s.substr(start, comma == std::string_view::npos ? s.npos : comma - start);
    bool sized =
        group == 0 ? !part.empty() && (comma == s.npos || part.size() <= 3) : part.size() == 3;
    if (!sized || !std::all_of(part.begin(), part.end(), is_digit))
      return std::nullopt;
    out += part;
    if (comma == std::string_view::npos)
      return out;
    start = comma + 1;
  }
}

// An optional sign: whether it was '-', the sign removed from `s`.
bool take_sign(std::string_view& s) {
  bool negative = !s.empty() && s.front() == '-';
  if (!s.empty() && (s.front() == '-' || s.front() == '+'))
    s.remove_prefix(1);
  return negative;
}

// [-]digits[.digits][e[+-]digits] with thousands separators, or [-].digits.
std::optional<exact_number> parse_decimal(std::string_view s) {
  bool negative = take_sign(s);
  int64_t exponent = 0;
  if (auto e = s.find_first_of("eE"); e != std::string_view::npos) {
    auto tail = s.substr(e + 1);
    bool neg_exp = take_sign(tail);
    if (tail.empty() || tail.size() > 2 || !std::all_of(tail.begin(), tail.end(), is_digit))
      return std::nullopt;
    exponent = std::stoll(std::string{tail}) * (neg_exp ? -1 : 1);
    s = s.substr(0, e);
  }
  auto dot = s.find('.');
  auto whole = s.substr(0, dot);
  auto frac = dot == std::string_view::npos ? std::string_view{} : s.substr(dot + 1);
  std::string digits;
  if (whole.empty()) {
    if (frac.empty())
      return std::nullopt;
  } else if (auto d = integer_digits(whole)) {
    digits = *d;
  } else {
    return std::nullopt;
  }
  if (!std::all_of(frac.begin(), frac.end(), is_digit) || digits.size() + frac.size() > 36)
    return std::nullopt;
  digits += frac;
  i128 num = 0;
  for (char c : digits)
    num = num * 10 + (c - '0');
  auto scale = exponent - static_cast<int64_t>(frac.size());
  auto p = pow10(scale < 0 ? -scale : scale);
  if (!p)
    return std::nullopt;
  if (scale >= 0) {
    auto n = times(num, *p);
    return n ? reduced(negative ? -*n : *n, 1) : std::nullopt;
  }
  return reduced(negative ? -num : num, *p);
}

std::optional<exact_number> divide(const exact_number& a, const exact_number& b) {
  auto n = times(a.num, b.den);
  auto d = times(a.den, b.num);
  if (!n || !d)
    return std::nullopt;
  return reduced(*n, *d);
}

// \frac{a}{b} or \frac12 (single-digit shorthand), with an optional sign.
std::optional<exact_number> parse_latex_fraction(std::string_view s) {
  bool negative = take_sign(s);
  if (!starts_with(s, "\\frac"))
    return std::nullopt;
  s.remove_prefix(5);
  std::string parts[2];
  for (auto& part : parts) {
    if (s.empty())
      return std::nullopt;
    if (s.front() == '{') {
      auto inner = brace_content(s, 0);
      if (!inner)
        return std::nullopt;
      part = *inner;
      s.remove_prefix(inner->size() + 2);
    } else {
      part = std::string(1, s.front());
      s.remove_prefix(1);
    }
  }
  if (!s.empty())
    return std::nullopt;
  auto a = parse_decimal(parts[0]);
  auto b = parse_decimal(parts[1]);
  if (!a || !b)
    return std::nullopt;
  auto q = divide(*a, *b);
  if (q && negative)
    q->num = -q->num;
  return q;
}

} // namespace

std::optional<exact_number> parse_exact_number(std::string_view text) {
  std::string s = normalize_answer(text);
  std::string_view v = s;
  bool percent = !v.empty() && v.back() == '%';
  if (percent)
    v.remove_suffix(1);
  std::optional<exact_number> out;
  if (starts_with(v, "\\frac") || starts_with(v, "-\\frac")) {
    out = parse_latex_fraction(v);
  } else if (auto slash = v.find('/'); slash != std::string_view::npos) {
    auto a = parse_decimal(v.substr(0, slash));
    auto b = parse_decimal(v.substr(slash + 1));
    if (a && b)
      out = divide(*a, *b);
  } else {
    out = parse_decimal(v);
  }
  if (out)
    out->percent = percent;
  return out;
}

namespace {

bool same_value(const exact_number& a, const exact_number& b) {
  return a.num == b.num && a.den == b.den;
}

// A percentage p% equals p and p/100.
bool numbers_equivalent(const exact_number& a, const exact_number& b) {
  if (same_value(a, b))
    return true;
  auto hundredth = [](const exact_number& x) -> std::optional<exact_number> {
    auto d = times(x.den, 100);
    return d ? reduced(x.num, *d) : std::nullopt;
  };
  if (a.percent && !b.percent)
    if (auto h = hundredth(a))
      return same_value(*h, b);
  if (b.percent && !a.percent)
    if (auto h = hundredth(b))
      return same_value(a, *h);
  return false;
}

} // namespace

bool answers_equivalent(std::string_view response_answer, std::string_view ground_truth) {
  auto a = parse_exact_number(response_answer);
  auto b = parse_exact_number(ground_truth);
  if (a && b)
    return numbers_equivalent(*a, *b);
  auto na = normalize_answer(response_answer);
  return !na.empty() && na == normalize_answer(ground_truth);
}

// ---- rules ----------------------------------------------------------------------

namespace {

bool extracts(rule_kind k) {
  return k == rule_kind::exact || k == rule_kind::positional || k == rule_kind::math ||
         k == rule_kind::regex;
}

expected<models::regex> compile_python(const std::string& pattern) {
  return models::regex::compile(pattern,
                                {models::regex::dialect::python, /*dot_all=*/true, /*full=*/true});
}

// DAPO's soft overlong punishment for a response of `length` tokens.
double overlong_score(const rule_config& c, int64_t length) {
  auto soft_start = c.max_length - c.buffer;
  if (length <= soft_start)
    return 0.0;
  auto over = static_cast<double>(length - soft_start) / static_cast<double>(c.buffer);
  return -c.penalty * std::min(over, 1.0);
}

} // namespace

std::vector<rule_violation> rule_violations(const rule_config& c, const std::string& path,
                                            int64_t max_tokens) {
  std::vector<rule_violation> out;
  auto fail = [&](const char* key, std::string message) {
    out.push_back({path + "." + key, std::move(message)});
  };
  if (c.kind == rule_kind::format) {
    if (c.pattern.empty())
      fail("pattern", "a format rule needs the regex its responses must match");
    else if (auto re = compile_python(c.pattern); !re)
      fail("pattern", context_of(re.error()));
  } else if (!c.pattern.empty()) {
    fail("pattern", "only a format rule takes a pattern");
  }
  if (c.extract != answer_extract::none && !extracts(c.kind))
    fail("extract", "a " + std::string{to_string(c.kind)} +
                        " rule reads no answer (extract is for exact, positional, math, regex)");
  if (c.kind == rule_kind::overlong) {
    auto length = c.max_length > 0 ? c.max_length : max_tokens;
    if (c.max_length < 0)
      fail("max_length", "expected >= 0 (0 = rl.generation.max_tokens)");
    if (c.buffer <= 0 || c.buffer > length)
      fail("buffer", "expected an integer in [1, " + std::to_string(length) +
                         "] (the soft zone before max_length " + std::to_string(length) +
                         "), got " + std::to_string(c.buffer));
    if (!(c.penalty >= 0))
      fail("penalty", "expected >= 0");
  }
  if (!(c.weight >= 0))
    fail("weight", "expected >= 0");
  return out;
}

expected<rule_set> rule_set::make(const std::vector<rule_config>& rules, int64_t max_tokens) {
  std::vector<std::string> violations;
  rule_set out;
  for (size_t i = 0; i < rules.size(); ++i) {
    auto v = rule_violations(rules[i], "rules[" + std::to_string(i) + "]", max_tokens);
    for (auto& x : v)
      violations.push_back(x.path + ": " + x.message);
    compiled_rule r{rules[i], std::nullopt};
    if (r.config.kind == rule_kind::overlong && r.config.max_length == 0)
      r.config.max_length = max_tokens;
    if (v.empty() && r.config.kind == rule_kind::format)
      r.format = *compile_python(r.config.pattern);
    out.rules_.push_back(std::move(r));
  }
  if (!violations.empty())
    return make_error_list(errc::invalid_config, violations);
  return out;
}

expected<double> rule_set::score_one(const compiled_rule& rule, const scored_response& r) const {
  const auto& c = rule.config;
  if (c.kind == rule_kind::format)
    return rule.format->matches(r.text) ? 1.0 : 0.0;
  if (c.kind == rule_kind::overlong)
    return overlong_score(c, r.tokens);
  auto answer = extract_answer(c.extract, r.text);
  if (!answer)
    return 0.0;
  switch (c.kind) {
  case rule_kind::exact:
  case rule_kind::positional:
    return rule_score(c.kind, r.answer, *answer);
  case rule_kind::math:
    return answers_equivalent(*answer, ground_truth_answer(r.answer)) ? 1.0 : 0.0;
  case rule_kind::regex: {
    auto re = compile_python(std::string{r.answer});
    if (!re)
      return with_prefix(re.error(), "the row's answer, read as a regex by a regex rule");
    return re->matches(*answer) ? 1.0 : 0.0;
  }
  default:
    break;
  }
  return 0.0;
}

expected<double> rule_set::score(const scored_response& r) const {
  double sum = 0;
  for (const auto& rule : rules_) {
    auto s = score_one(rule, r);
    if (!s)
      return s.error();
    sum += rule.config.weight * *s;
  }
  return sum;
}

std::optional<bool> rule_set::formatted(const scored_response& r) const {
  std::optional<bool> out;
  for (const auto& rule : rules_)
    if (rule.config.kind == rule_kind::format)
      out = out.value_or(true) && rule.format->matches(r.text);
  return out;
}

expected<bool> rule_set::correct(const scored_response& r) const {
  for (const auto& rule : rules_) {
    if (!extracts(rule.config.kind))
      continue;
    auto as_exact = rule;
    if (as_exact.config.kind == rule_kind::positional)
      as_exact.config.kind = rule_kind::exact;
    auto s = score_one(as_exact, r);
    if (!s)
      return s.error();
    return *s == 1.0;
  }
  return r.text == r.answer;
}

} // namespace troupe::actors::rl
