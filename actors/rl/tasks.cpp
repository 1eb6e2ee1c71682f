#include "actors/rl/tasks.hpp"

#include "runtime/seeded_random.hpp"

#include <algorithm>
#include <limits>
#include <unordered_set>

namespace troupe::actors::rl {

namespace {

// NOTE [task streams]
// Every random draw of a task comes from a splitmix64 generator whose state
// is derived from (seed, stream, index), so example `index` never depends on
// the examples before it and the same seed gives the same data everywhere.
// Streams keep independent uses of one seed apart: examples, wrong answers,
// and the eval split (whose examples come from a second seed derived from
// the first, see eval_seed).
enum stream_id : uint64_t {
  example_stream = 1,
  wrong_answer_stream = 2,
  eval_split_stream = 3,
};

constexpr int64_t max_task_digits = 32;

using runtime::splitmix64;

/// A bijective 64-bit mix (one splitmix64 output from state `x`).
uint64_t mix(uint64_t x) {
  return splitmix64(x);
}

/// The generator state of (seed, stream, index). Injective in `index` for a
/// fixed seed and stream, since `mix` is a bijection.
uint64_t derive(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix(mix(mix(seed) ^ stream) ^ index);
}

/// The seed of the eval stream of `seed` (the train stream is `seed` itself).
uint64_t eval_seed(uint64_t seed) {
  return mix(mix(seed) ^ eval_split_stream);
}

/// A splitmix64 generator with exact uniform integers (no std distributions,
/// whose output is implementation-defined).
class generator {
public:
  explicit generator(uint64_t state) : state_(state) {}

  uint64_t next() { return splitmix64(state_); }

  /// Uniform in [lo, hi] (lo <= hi), by rejection: the accepted outputs
  /// [threshold, 2^64) are a whole number of copies of the span.
  int64_t uniform(int64_t lo, int64_t hi) {
    uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
    if (span == 0) // the whole 64-bit range
      return static_cast<int64_t>(next());
    uint64_t threshold = (0 - span) % span; // 2^64 mod span
    for (;;) {
      uint64_t r = next();
      if (r >= threshold)
        return static_cast<int64_t>(static_cast<uint64_t>(lo) + r % span);
    }
  }

  char digit(char lo = '0') { return static_cast<char>(uniform(lo, '9')); }

private:
  uint64_t state_;
};

/// `count` random digits; the first is nonzero when `count` > 1 and
/// `no_leading_zero` is set.
std::string random_digits(generator& g, int64_t count, bool no_leading_zero) {
  std::string out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    out += g.digit(no_leading_zero && i == 0 && count > 1 ? '1' : '0');
  return out;
}

/// The decimal sum of two non-negative decimal numbers of any length.
std::string add_decimal(std::string_view a, std::string_view b) {
  std::string out;
  int carry = 0;
  for (size_t i = 0; i < std::max(a.size(), b.size()) || carry != 0; ++i) {
    int sum = carry;
    if (i < a.size())
      sum += a[a.size() - 1 - i] - '0';
    if (i < b.size())
      sum += b[b.size() - 1 - i] - '0';
    out += static_cast<char>('0' + sum % 10);
    carry = sum / 10;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

/// Replaces the character at `pos` by a different digit, never by a leading
/// '0' of a multi-digit number when `no_leading_zero` is set.
void change_digit(std::string& s, size_t pos, generator& g, bool no_leading_zero) {
  std::string choices;
  for (char c = (no_leading_zero && pos == 0 && s.size() > 1) ? '1' : '0'; c <= '9'; ++c)
    if (c != s[pos])
      choices += c;
  s[pos] = choices[static_cast<size_t>(g.uniform(0, static_cast<int64_t>(choices.size()) - 1))];
}

/// The guarantee behind every wrong_answer: `candidate` if it is a non-empty
/// string other than `answer`, else `answer` with a digit appended (longer,
/// hence different).
std::string ensure_wrong(std::string candidate, const std::string& answer) {
  if (!candidate.empty() && candidate != answer)
    return candidate;
  return answer + '0';
}

/// Digit tasks draw their sizes from [min_digits, max_digits] (validated).
class digit_task : public task {
public:
  digit_task(int64_t min_digits, int64_t max_digits)
      : min_digits_(min_digits), max_digits_(max_digits) {}

protected:
  int64_t min_digits_;
  int64_t max_digits_;
};

/// "sort:5031=" → "0135": a digit string, sorted ascending.
class sort_task final : public digit_task {
public:
  using digit_task::digit_task;

  std::string_view name() const override { return "sort"; }
  int64_t max_prompt_length() const override { return 6 + max_digits_; } // sort: ... =

  example make_example(uint64_t seed, int64_t index) const override {
    generator g{derive(seed, example_stream, static_cast<uint64_t>(index))};
    auto digits = random_digits(g, g.uniform(min_digits_, max_digits_), false);
    example ex;
    ex.prompt = "sort:" + digits + "=";
    std::sort(digits.begin(), digits.end());
    ex.answer = std::move(digits);
    return ex;
  }

  /// One of the applicable mistakes, drawn uniformly: swap two unequal
  /// adjacent digits, change one digit, or drop one digit (only when another
  /// remains). Each differs from the answer by construction.
  std::string wrong_answer(const example& ex, uint64_t seed, int64_t index) const override {
    generator g{derive(seed, wrong_answer_stream, static_cast<uint64_t>(index))};
    const auto& answer = ex.answer;
    if (answer.empty())
      return ensure_wrong({}, answer);
    std::vector<size_t> unequal; // i with answer[i] != answer[i + 1]
    for (size_t i = 0; i + 1 < answer.size(); ++i)
      if (answer[i] != answer[i + 1])
        unequal.push_back(i);
    enum mistake { swap_adjacent, change_one, drop_one };
    std::vector<mistake> applicable{change_one};
    if (!unequal.empty())
      applicable.push_back(swap_adjacent);
    if (answer.size() > 1)
      applicable.push_back(drop_one);
    auto pick = [&g](size_t n) {
      return static_cast<size_t>(g.uniform(0, static_cast<int64_t>(n) - 1));
    };
    auto wrong = answer;
    switch (applicable[pick(applicable.size())]) {
    case swap_adjacent: {
      auto i = unequal[pick(unequal.size())];
      std::swap(wrong[i], wrong[i + 1]);
      break;
    }
    case change_one:
      change_digit(wrong, pick(wrong.size()), g, false);
      break;
    case drop_one:
      wrong.erase(pick(wrong.size()), 1);
      break;
    }
    return ensure_wrong(std::move(wrong), answer);
  }
};

/// "add:482+97=" → "579": the decimal sum of two operands without leading
/// zeros.
class add_task final : public digit_task {
public:
  using digit_task::digit_task;

  std::string_view name() const override { return "add"; }
  int64_t max_prompt_length() const override { return 6 + 2 * max_digits_; } // add: ... + ... =

  example make_example(uint64_t seed, int64_t index) const override {
    generator g{derive(seed, example_stream, static_cast<uint64_t>(index))};
    auto a = random_digits(g, g.uniform(min_digits_, max_digits_), true);
    auto b = random_digits(g, g.uniform(min_digits_, max_digits_), true);
    example ex;
    ex.prompt = "add:" + a + "+" + b + "=";
    ex.answer = add_decimal(a, b);
    return ex;
  }

  /// The answer with one digit changed (a slip in one column).
  std::string wrong_answer(const example& ex, uint64_t seed, int64_t index) const override {
    generator g{derive(seed, wrong_answer_stream, static_cast<uint64_t>(index))};
    auto wrong = ex.answer;
    if (!wrong.empty()) {
      auto pos = g.uniform(0, static_cast<int64_t>(wrong.size()) - 1);
      change_digit(wrong, static_cast<size_t>(pos), g, true);
    }
    return ensure_wrong(std::move(wrong), ex.answer);
  }
};

} // namespace

expected<rule_kind> parse_rule_kind(std::string_view name) {
  if (auto k = enum_from_name<rule_kind>(name))
    return *k;
  return make_error(errc::invalid_argument, "rule: expected one of " + enum_name_list<rule_kind>() +
                                                ", got \"" + std::string{name} + "\"");
}

double rule_score(rule_kind kind, std::string_view answer, std::string_view response) {
  switch (kind) {
  case rule_kind::exact:
    return answer == response ? 1.0 : 0.0;
  case rule_kind::positional: {
    auto longest = std::max(answer.size(), response.size());
    if (longest == 0) // an empty answer, answered by nothing: exact
      return 1.0;
    auto shortest = std::min(answer.size(), response.size());
    size_t equal = 0;
    for (size_t i = 0; i < shortest; ++i)
      equal += answer[i] == response[i] ? 1 : 0;
    return static_cast<double>(equal) / static_cast<double>(longest);
  }
  default:
    break;
  }
  return 0.0;
}

expected<void> validate(const task_options& opts) {
  std::vector<std::string> violations;
  if (static_cast<size_t>(opts.name) >= enum_count<task_kind>())
    violations.push_back("task.name: expected one of " + enum_name_list<task_kind>() + ", got " +
                         std::to_string(static_cast<int>(opts.name)));
  auto in_range = [](int64_t n) { return n >= 1 && n <= max_task_digits; };
  auto range = "[1, " + std::to_string(max_task_digits) + "]";
  if (!in_range(opts.min_digits))
    violations.push_back("task.min_digits: expected an integer in " + range + ", got " +
                         std::to_string(opts.min_digits));
  if (!in_range(opts.max_digits))
    violations.push_back("task.max_digits: expected an integer in " + range + ", got " +
                         std::to_string(opts.max_digits));
  if (in_range(opts.min_digits) && in_range(opts.max_digits) && opts.max_digits < opts.min_digits)
    violations.push_back("task.max_digits: expected at least task.min_digits (" +
                         std::to_string(opts.min_digits) + "), got " +
                         std::to_string(opts.max_digits));
  if (!violations.empty())
    return make_error_list(errc::invalid_config, violations);
  return caf::unit;
}

expected<std::unique_ptr<task>> make_task(const task_options& opts) {
  if (auto ok = validate(opts); !ok)
    return ok.error();
  std::unique_ptr<task> t;
  if (opts.name == task_kind::sort)
    t = std::make_unique<sort_task>(opts.min_digits, opts.max_digits);
  else
    t = std::make_unique<add_task>(opts.min_digits, opts.max_digits);
  return t;
}

expected<task_splits> make_splits(const task& t, uint64_t seed, int64_t train_size,
                                  int64_t eval_size) {
  std::vector<std::string> violations;
  if (train_size < 0)
    violations.push_back("train_size: expected >= 0, got " + std::to_string(train_size));
  if (eval_size < 0)
    violations.push_back("eval_size: expected >= 0, got " + std::to_string(eval_size));
  if (!violations.empty())
    return make_error_list(errc::invalid_argument, violations);

  task_splits out;
  std::unordered_set<std::string> train_prompts;
  for (int64_t i = 0; i < train_size; ++i) {
    out.train.push_back(t.make_example(seed, i));
    train_prompts.insert(out.train.back().prompt);
  }

  // Held-out prompts are distinct and unseen in training; a small task runs
  // out of them, so the number of draws is bounded (saturating).
  constexpr int64_t int64_max = std::numeric_limits<int64_t>::max();
  const int64_t max_draws = eval_size > (int64_max - 1000) / 50 ? int64_max : 50 * eval_size + 1000;
  const auto held_out_seed = eval_seed(seed);
  std::unordered_set<std::string> eval_prompts;
  int64_t draws = 0;
  while (static_cast<int64_t>(out.eval.size()) < eval_size && draws < max_draws) {
    auto ex = t.make_example(held_out_seed, draws++);
    if (train_prompts.count(ex.prompt) != 0 || !eval_prompts.insert(ex.prompt).second)
      continue;
    out.eval.push_back(std::move(ex));
  }
  if (static_cast<int64_t>(out.eval.size()) < eval_size)
    return make_error(errc::invalid_argument,
                      "task \"" + std::string{t.name()} +
                          "\" has too few held-out prompts: " + std::to_string(out.eval.size()) +
                          " distinct prompts outside the " + std::to_string(train_prompts.size()) +
                          " train prompts in " + std::to_string(draws) +
                          " draws, expected eval_size = " + std::to_string(eval_size) +
                          "; allow more digits (task.max_digits) or request fewer examples");
  return out;
}

std::vector<demonstration> to_demonstrations(const std::vector<example>& examples) {
  std::vector<demonstration> out;
  out.reserve(examples.size());
  for (const auto& ex : examples)
    out.push_back({ex.prompt, ex.answer});
  return out;
}

std::vector<preference_pair> to_preferences(const task& t, const std::vector<example>& examples,
                                            uint64_t seed) {
  std::vector<preference_pair> out;
  out.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& ex = examples[i];
    out.push_back({ex.prompt, ex.answer, t.wrong_answer(ex, seed, static_cast<int64_t>(i))});
  }
  return out;
}

} // namespace troupe::actors::rl
