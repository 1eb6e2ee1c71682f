#include "actors/rl/datasets.hpp"
#include "actors/rl/tasks.hpp"

#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace troupe::actors::rl {

// Readable rows in assertion failures (found by GoogleTest through ADL;
// static, so no other test file can clash with them).
static void PrintTo(const example& r, std::ostream* os) {
  *os << "{" << ::testing::PrintToString(r.prompt) << ", " << ::testing::PrintToString(r.answer)
      << "}";
}
static void PrintTo(const demonstration& r, std::ostream* os) {
  *os << "{" << ::testing::PrintToString(r.prompt) << ", " << ::testing::PrintToString(r.response)
      << "}";
}
static void PrintTo(const preference_pair& r, std::ostream* os) {
  *os << "{" << ::testing::PrintToString(r.prompt) << ", " << ::testing::PrintToString(r.chosen)
      << ", " << ::testing::PrintToString(r.rejected) << "}";
}

} // namespace troupe::actors::rl

using namespace troupe;
using namespace troupe::actors::rl;

namespace {

std::unique_ptr<task> make(std::string name, int64_t min_digits, int64_t max_digits) {
  task_options opts;
  opts.name = *enum_from_name<task_kind>(name);
  opts.min_digits = min_digits;
  opts.max_digits = max_digits;
  auto t = make_task(opts);
  EXPECT_TRUE(t) << describe(t.error());
  return t ? std::move(*t) : nullptr;
}

/// The text between `head` and the final '=' of a prompt ("sort:5031=" →
/// "5031"), checking the frame.
std::string body_of(const std::string& prompt, const std::string& head) {
  EXPECT_EQ(prompt.rfind(head, 0), 0u) << prompt;
  EXPECT_FALSE(prompt.empty());
  EXPECT_EQ(prompt.back(), '=') << prompt;
  if (prompt.size() < head.size() + 1)
    return {};
  return prompt.substr(head.size(), prompt.size() - head.size() - 1);
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Decimal conversions through a 128-bit integer (10^32 < 2^128): a second,
// independent implementation of the sum the add task computes on strings.
unsigned __int128 parse_u128(const std::string& s) {
  unsigned __int128 x = 0;
  for (char c : s)
    x = x * 10 + static_cast<unsigned>(c - '0');
  return x;
}

std::string format_u128(unsigned __int128 x) {
  std::string s;
  do {
    s += static_cast<char>('0' + static_cast<int>(x % 10));
    x /= 10;
  } while (x != 0);
  return {s.rbegin(), s.rend()};
}

/// The error of a failed result (none when it succeeded).
template <class T>
caf::error error_of(const expected<T>& r) {
  return r ? caf::error{} : r.error();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

} // namespace

// ---- rules ----------------------------------------------------------------------

TEST(RlTasks, ParsesRuleKindsAndRejectsOthers) {
  for (auto kind : {rule_kind::exact, rule_kind::positional, rule_kind::math, rule_kind::regex,
                    rule_kind::format, rule_kind::overlong}) {
    auto parsed = parse_rule_kind(to_string(kind));
    ASSERT_TRUE(parsed) << describe(parsed.error());
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_EQ(to_string(rule_kind::exact), "exact");
  EXPECT_EQ(to_string(rule_kind::positional), "positional");
  auto bad = parse_rule_kind("Exact");
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::invalid_argument);
  EXPECT_EQ(
      context_of(bad.error()),
      "rule: expected one of exact, positional, math, regex, format, overlong, got \"Exact\"");
}

TEST(RlTasks, RuleScoreTable) {
  struct row {
    rule_kind kind;
    std::string answer;
    std::string response;
    double score;
  };
  const std::vector<row> table{
      {rule_kind::exact, "0135", "0135", 1.0},
      {rule_kind::exact, "0135", "0153", 0.0},
      {rule_kind::exact, "0135", "01350", 0.0},
      {rule_kind::exact, "0135", "", 0.0},
      {rule_kind::exact, "", "", 1.0},
      {rule_kind::positional, "0135", "0135", 1.0},
      {rule_kind::positional, "0135", "0153", 0.5},       // 0,1 match
      {rule_kind::positional, "0135", "013", 0.75},       // 3 of max(4, 3)
      {rule_kind::positional, "0135", "013599", 4.0 / 6}, // 4 of max(4, 6)
      {rule_kind::positional, "0135", "1350", 0.0},       // shifted: nothing aligned
      {rule_kind::positional, "579", "570", 2.0 / 3},
      {rule_kind::positional, "0135", "", 0.0},
      {rule_kind::positional, "", "12", 0.0},
      {rule_kind::positional, "", "", 1.0},
  };
  for (const auto& r : table)
    EXPECT_DOUBLE_EQ(rule_score(r.kind, r.answer, r.response), r.score)
        << to_string(r.kind) << " answer \"" << r.answer << "\" response \"" << r.response << "\"";
}

// ---- options ----------------------------------------------------------------------

TEST(RlTasks, ValidateAcceptsBothTasksAtTheDigitBounds) {
  for (std::string name : {"sort", "add"})
    for (auto [lo, hi] : {std::pair{1, 1}, std::pair{1, 32}, std::pair{32, 32}, std::pair{3, 6}}) {
      task_options opts;
      opts.name = *enum_from_name<task_kind>(name);
      opts.min_digits = lo;
      opts.max_digits = hi;
      auto ok = validate(opts);
      EXPECT_TRUE(ok) << name << " " << lo << ".." << hi << ": " << describe(ok.error());
      auto t = make_task(opts);
      ASSERT_TRUE(t) << describe(t.error());
      EXPECT_EQ((*t)->name(), name);
    }
  EXPECT_TRUE(validate(task_options{}));
}

TEST(RlTasks, ValidateCollectsEveryViolationNamingItsField) {
  task_options opts;
  opts.name = static_cast<task_kind>(9);
  opts.min_digits = 0;
  opts.max_digits = 33;
  auto bad = validate(opts);
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::invalid_config);
  EXPECT_EQ(context_of(bad.error()), "task.name: expected one of sort, add, got 9; "
                                     "task.min_digits: expected an integer in [1, 32], got 0; "
                                     "task.max_digits: expected an integer in [1, 32], got 33");

  opts = task_options{};
  opts.min_digits = 5;
  opts.max_digits = 4;
  bad = validate(opts);
  ASSERT_FALSE(bad);
  EXPECT_EQ(context_of(bad.error()),
            "task.max_digits: expected at least task.min_digits (5), got 4");

  auto t = make_task(opts);
  ASSERT_FALSE(t);
  EXPECT_EQ(code_of(t.error()), errc::invalid_config);
  EXPECT_EQ(context_of(t.error()), "task.max_digits: expected at least task.min_digits (5), got 4");
}

// ---- generation -------------------------------------------------------------------

TEST(RlTasks, ExamplesArePureFunctionsOfSeedAndIndex) {
  for (std::string name : {"sort", "add"}) {
    auto a = make(name, 4, 12);
    auto b = make(name, 4, 12);
    ASSERT_TRUE(a && b);
    // Forward on one instance, backward on another: order and instance do not matter.
    std::vector<example> forward;
    for (int64_t i = 0; i < 200; ++i)
      forward.push_back(a->make_example(7, i));
    for (int64_t i = 199; i >= 0; --i)
      EXPECT_EQ(b->make_example(7, i), forward[static_cast<size_t>(i)]) << name << " " << i;
    // Other seeds and indices give other streams.
    std::set<std::string> prompts;
    int64_t same_as_seed_7 = 0;
    for (int64_t i = 0; i < 200; ++i) {
      prompts.insert(forward[static_cast<size_t>(i)].prompt);
      same_as_seed_7 += a->make_example(8, i) == forward[static_cast<size_t>(i)] ? 1 : 0;
    }
    EXPECT_GT(prompts.size(), 195u) << name;
    EXPECT_LT(same_as_seed_7, 5) << name;
  }
}

TEST(RlTasks, ExamplesMatchPinnedValues) {
  // Cross-machine determinism: these examples must never change. They were
  // checked against a separate Python implementation of the same draws.
  auto sort = make("sort", 3, 6);
  auto add = make("add", 1, 4);
  auto wide_add = make("add", 30, 32);
  ASSERT_TRUE(sort && add && wide_add);
  EXPECT_EQ(sort->make_example(42, 0), (example{"sort:201=", "012"}));
  EXPECT_EQ(sort->make_example(42, 1), (example{"sort:529991=", "125999"}));
  EXPECT_EQ(sort->make_example(UINT64_MAX, 123456789), (example{"sort:8966=", "6689"}));
  EXPECT_EQ(add->make_example(42, 0), (example{"add:2+1=", "3"}));
  EXPECT_EQ(add->make_example(42, 1), (example{"add:4299+34=", "4333"}));
  EXPECT_EQ(wide_add->make_example(UINT64_MAX, 123456789),
            (example{"add:29669975791911799622215217431950+3401910848697168387750769450438=",
                     "33071886640608968009965986882388"}));
}

TEST(RlTasks, SortAnswersAreTheSortedDigitsWithinTheDigitBounds) {
  auto t = make("sort", 2, 7);
  ASSERT_TRUE(t);
  std::set<size_t> lengths;
  std::set<char> digits;
  for (int64_t i = 0; i < 2000; ++i) {
    auto ex = t->make_example(3, i);
    auto body = body_of(ex.prompt, "sort:");
    ASSERT_TRUE(all_digits(body)) << ex.prompt;
    EXPECT_GE(body.size(), 2u);
    EXPECT_LE(body.size(), 7u);
    lengths.insert(body.size());
    digits.insert(body.begin(), body.end());
    // Counting sort of the prompt's digits.
    std::array<int, 10> count{};
    for (char c : body)
      ++count[static_cast<size_t>(c - '0')];
    std::string expected;
    for (int d = 0; d < 10; ++d)
      expected.append(static_cast<size_t>(count[static_cast<size_t>(d)]),
                      static_cast<char>('0' + d));
    EXPECT_EQ(ex.answer, expected) << ex.prompt;
  }
  EXPECT_EQ(lengths, (std::set<size_t>{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(digits.size(), 10u);
}

TEST(RlTasks, AddAnswersAreTheSumOfOperandsWithinTheDigitBounds) {
  for (auto [lo, hi] : {std::pair{1, 3}, std::pair{30, 32}}) {
    auto t = make("add", lo, hi);
    ASSERT_TRUE(t);
    std::set<size_t> lengths;
    bool saw_single_zero = false;
    for (int64_t i = 0; i < 2000; ++i) {
      auto ex = t->make_example(11, i);
      auto body = body_of(ex.prompt, "add:");
      auto plus = body.find('+');
      ASSERT_NE(plus, std::string::npos) << ex.prompt;
      auto a = body.substr(0, plus);
      auto b = body.substr(plus + 1);
      for (const auto& operand : {a, b}) {
        ASSERT_TRUE(all_digits(operand)) << ex.prompt;
        EXPECT_GE(operand.size(), static_cast<size_t>(lo)) << ex.prompt;
        EXPECT_LE(operand.size(), static_cast<size_t>(hi)) << ex.prompt;
        EXPECT_TRUE(operand.size() == 1 || operand[0] != '0') << "leading zero in " << ex.prompt;
        lengths.insert(operand.size());
        saw_single_zero |= operand == "0";
      }
      EXPECT_EQ(ex.answer, format_u128(parse_u128(a) + parse_u128(b))) << ex.prompt;
    }
    EXPECT_EQ(lengths.size(), static_cast<size_t>(hi - lo + 1));
    if (lo == 1) {
      EXPECT_TRUE(saw_single_zero); // a one-digit operand may be 0
    }
  }
}

// ---- wrong answers ---------------------------------------------------------------

TEST(RlTasks, WrongAnswersNeverEqualTheAnswerAndAreDeterministic) {
  for (std::string name : {"sort", "add"})
    for (auto [lo, hi] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{3, 6}, std::pair{32, 32}}) {
      auto t = make(name, lo, hi);
      ASSERT_TRUE(t);
      for (int64_t i = 0; i < 1000; ++i) {
        auto ex = t->make_example(5, i);
        auto wrong = t->wrong_answer(ex, 9, i);
        EXPECT_NE(wrong, ex.answer) << name << " " << ex.prompt;
        EXPECT_FALSE(wrong.empty()) << name << " " << ex.prompt;
        EXPECT_TRUE(all_digits(wrong)) << name << " " << wrong;
        EXPECT_EQ(t->wrong_answer(ex, 9, i), wrong);
      }
    }
  // Answers from edited files need not look like the task's own.
  for (std::string name : {"sort", "add"}) {
    auto t = make(name, 3, 6);
    ASSERT_TRUE(t);
    for (std::string answer : {"", "0", "9", "99", "x", "00"})
      for (int64_t i = 0; i < 50; ++i) {
        auto wrong = t->wrong_answer({"p", answer}, 1, i);
        EXPECT_NE(wrong, answer) << name << " \"" << answer << "\"";
        EXPECT_FALSE(wrong.empty()) << name;
      }
  }
}

TEST(RlTasks, SortWrongAnswersSwapChangeOrDropOneDigit) {
  auto t = make("sort", 3, 6);
  ASSERT_TRUE(t);
  int swapped = 0, changed = 0, dropped = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    auto ex = t->make_example(2, i);
    auto wrong = t->wrong_answer(ex, 2, i);
    auto sorted_wrong = wrong;
    std::sort(sorted_wrong.begin(), sorted_wrong.end());
    if (wrong.size() + 1 == ex.answer.size()) {
      ++dropped;
      EXPECT_TRUE(std::includes(ex.answer.begin(), ex.answer.end(), sorted_wrong.begin(),
                                sorted_wrong.end()))
          << ex.answer << " → " << wrong;
    } else if (sorted_wrong == ex.answer) {
      ++swapped; // the same digits, out of order by one adjacent swap
      size_t first = 0;
      while (wrong[first] == ex.answer[first])
        ++first;
      EXPECT_EQ(wrong[first], ex.answer[first + 1]) << ex.answer << " → " << wrong;
      EXPECT_EQ(wrong[first + 1], ex.answer[first]) << ex.answer << " → " << wrong;
      EXPECT_EQ(wrong.substr(first + 2), ex.answer.substr(first + 2))
          << ex.answer << " → " << wrong;
    } else {
      ++changed;
      ASSERT_EQ(wrong.size(), ex.answer.size()) << ex.answer << " → " << wrong;
      int differing = 0;
      for (size_t k = 0; k < wrong.size(); ++k)
        differing += wrong[k] != ex.answer[k] ? 1 : 0;
      EXPECT_EQ(differing, 1) << ex.answer << " → " << wrong;
    }
  }
  // Each of the three mistakes is drawn about a third of the time.
  EXPECT_GT(swapped, 200);
  EXPECT_GT(changed, 200);
  EXPECT_GT(dropped, 200);
}

TEST(RlTasks, AddWrongAnswersChangeOneDigitWithoutALeadingZero) {
  auto t = make("add", 1, 5);
  ASSERT_TRUE(t);
  std::set<size_t> positions;
  for (int64_t i = 0; i < 1000; ++i) {
    auto ex = t->make_example(4, i);
    auto wrong = t->wrong_answer(ex, 4, i);
    ASSERT_EQ(wrong.size(), ex.answer.size()) << ex.answer << " → " << wrong;
    EXPECT_TRUE(wrong.size() == 1 || wrong[0] != '0') << ex.answer << " → " << wrong;
    int differing = 0;
    for (size_t k = 0; k < wrong.size(); ++k)
      if (wrong[k] != ex.answer[k]) {
        ++differing;
        positions.insert(wrong.size() - k); // column, counted from the units
      }
    EXPECT_EQ(differing, 1) << ex.answer << " → " << wrong;
  }
  for (size_t column = 1; column <= 5; ++column)
    EXPECT_EQ(positions.count(column), 1u) << column;
  EXPECT_LE(*positions.rbegin(), 6u);
}

// ---- splits and derived data ---------------------------------------------------

TEST(RlTasks, SplitsTakeTrainFromTheSeedAndHoldOutUnseenPrompts) {
  auto t = make("sort", 1, 3); // 1110 prompts: repeats within train are common
  ASSERT_TRUE(t);
  auto splits = make_splits(*t, 17, 600, 300);
  ASSERT_TRUE(splits) << describe(splits.error());
  ASSERT_EQ(splits->train.size(), 600u);
  ASSERT_EQ(splits->eval.size(), 300u);
  std::set<std::string> train_prompts;
  for (size_t i = 0; i < splits->train.size(); ++i) {
    EXPECT_EQ(splits->train[i], t->make_example(17, static_cast<int64_t>(i)));
    train_prompts.insert(splits->train[i].prompt);
  }
  EXPECT_LT(train_prompts.size(), 600u); // duplicates within train are kept
  std::set<std::string> eval_prompts;
  for (const auto& ex : splits->eval) {
    EXPECT_EQ(train_prompts.count(ex.prompt), 0u) << "leaked " << ex.prompt;
    EXPECT_TRUE(eval_prompts.insert(ex.prompt).second) << "repeated " << ex.prompt;
    auto digits = body_of(ex.prompt, "sort:");
    std::sort(digits.begin(), digits.end());
    EXPECT_EQ(ex.answer, digits);
  }
  // The eval stream is not the train stream continued or restarted.
  auto more_train = make_splits(*t, 17, 900, 0);
  ASSERT_TRUE(more_train);
  std::vector<example> tail(more_train->train.begin() + 600, more_train->train.end());
  std::vector<example> head(splits->train.begin(), splits->train.begin() + 300);
  EXPECT_NE(splits->eval, tail);
  EXPECT_NE(splits->eval, head);

  auto again = make_splits(*t, 17, 600, 300);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->train, splits->train);
  EXPECT_EQ(again->eval, splits->eval);
}

TEST(RlTasks, SplitsCanExhaustASmallTaskButNoFurther) {
  auto t = make("sort", 1, 1); // exactly 10 prompts
  ASSERT_TRUE(t);
  auto all = make_splits(*t, 1, 0, 10);
  ASSERT_TRUE(all) << describe(all.error());
  std::set<std::string> prompts;
  for (const auto& ex : all->eval)
    prompts.insert(ex.prompt);
  EXPECT_EQ(prompts.size(), 10u);
  EXPECT_EQ(*prompts.begin(), "sort:0=");
  EXPECT_EQ(*prompts.rbegin(), "sort:9=");

  // Train draws that cover all 10 prompts leave nothing to hold out.
  auto covered = make_splits(*t, 1, 200, 0);
  ASSERT_TRUE(covered);
  std::set<std::string> train_prompts;
  for (const auto& ex : covered->train)
    train_prompts.insert(ex.prompt);
  ASSERT_EQ(train_prompts.size(), 10u);
  auto none_left = make_splits(*t, 1, 200, 1);
  ASSERT_FALSE(none_left);
  EXPECT_EQ(code_of(none_left.error()), errc::invalid_argument);
  EXPECT_EQ(context_of(none_left.error()),
            "task \"sort\" has too few held-out prompts: 0 distinct prompts outside the 10 train "
            "prompts in 1050 draws, expected eval_size = 1; allow more digits (task.max_digits) "
            "or request fewer examples");

  auto too_many = make_splits(*t, 1, 0, 11);
  ASSERT_FALSE(too_many);
  EXPECT_EQ(code_of(too_many.error()), errc::invalid_argument);
  EXPECT_EQ(context_of(too_many.error()),
            "task \"sort\" has too few held-out prompts: 10 distinct prompts outside the 0 train "
            "prompts in 1550 draws, expected eval_size = 11; allow more digits (task.max_digits) "
            "or request fewer examples");
}

TEST(RlTasks, SplitsCheckTheirSizes) {
  auto t = make("add", 1, 2);
  ASSERT_TRUE(t);
  auto bad = make_splits(*t, 0, -1, -2);
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::invalid_argument);
  EXPECT_EQ(context_of(bad.error()), "train_size: expected >= 0, got -1; eval_size: expected >= 0, "
                                     "got -2");
  auto empty = make_splits(*t, 0, 0, 0);
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->train.empty());
  EXPECT_TRUE(empty->eval.empty());
}

TEST(RlTasks, DemonstrationsAndPreferencesDeriveFromExamples) {
  auto t = make("add", 2, 4);
  ASSERT_TRUE(t);
  auto splits = make_splits(*t, 3, 50, 0);
  ASSERT_TRUE(splits);
  const auto& examples = splits->train;
  auto demos = to_demonstrations(examples);
  auto prefs = to_preferences(*t, examples, 8);
  ASSERT_EQ(demos.size(), examples.size());
  ASSERT_EQ(prefs.size(), examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    EXPECT_EQ(demos[i], (demonstration{examples[i].prompt, examples[i].answer}));
    EXPECT_EQ(prefs[i].prompt, examples[i].prompt);
    EXPECT_EQ(prefs[i].chosen, examples[i].answer);
    EXPECT_EQ(prefs[i].rejected, t->wrong_answer(examples[i], 8, static_cast<int64_t>(i)));
    EXPECT_NE(prefs[i].rejected, prefs[i].chosen);
  }
  EXPECT_TRUE(to_demonstrations({}).empty());
  EXPECT_TRUE(to_preferences(*t, {}, 8).empty());
}

// ---- datasets ---------------------------------------------------------------------

TEST(RlDatasets, RoundTripsEveryFormatWithAwkwardStrings) {
  test::temp_dir dir;
  const std::string awkward = "say \"hi\"\\n\nnew line\ttab, \xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6"
                              "\x9c\xac \xf0\x9f\x98\x80 \xe2\x80\xa8 {\"k\": [1]}";
  const std::string with_nul{"a\0b", 3};

  std::vector<example> examples{{"sort:5031=", "0135"}, {awkward, with_nul}, {"\r\n", " "}};
  ASSERT_TRUE(save_examples(dir.file("e.jsonl"), examples));
  auto e = load_examples(dir.file("e.jsonl"));
  ASSERT_TRUE(e) << describe(e.error());
  EXPECT_EQ(*e, examples);

  std::vector<demonstration> demos{{"add:1+2=", "3"}, {with_nul, awkward}};
  ASSERT_TRUE(save_demonstrations(dir.file("d.jsonl"), demos));
  auto d = load_demonstrations(dir.file("d.jsonl"));
  ASSERT_TRUE(d) << describe(d.error());
  EXPECT_EQ(*d, demos);

  std::vector<preference_pair> prefs{{"add:1+2=", "3", "4"}, {awkward, awkward + "!", with_nul}};
  ASSERT_TRUE(save_preferences(dir.file("p.jsonl"), prefs));
  auto p = load_preferences(dir.file("p.jsonl"));
  ASSERT_TRUE(p) << describe(p.error());
  EXPECT_EQ(*p, prefs);

  // Saving replaces the file.
  ASSERT_TRUE(save_examples(dir.file("e.jsonl"), {{"q", "a"}}));
  e = load_examples(dir.file("e.jsonl"));
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, (std::vector<example>{{"q", "a"}}));
}

TEST(RlDatasets, SavesOneObjectPerLineWithKeysInFileOrder) {
  test::temp_dir dir;
  ASSERT_TRUE(save_examples(dir.file("e.jsonl"), {{"sort:5031=", "0135"}, {"a\"\n", "\xc3\xa9"}}));
  EXPECT_EQ(read_text(dir.file("e.jsonl")), "{\"prompt\":\"sort:5031=\",\"answer\":\"0135\"}\n"
                                            "{\"prompt\":\"a\\\"\\n\",\"answer\":\"\xc3\xa9\"}\n");
  ASSERT_TRUE(save_demonstrations(dir.file("d.jsonl"), {{"p", "r"}}));
  EXPECT_EQ(read_text(dir.file("d.jsonl")), "{\"prompt\":\"p\",\"response\":\"r\"}\n");
  ASSERT_TRUE(save_preferences(dir.file("p.jsonl"), {{"p", "c", "r"}}));
  EXPECT_EQ(read_text(dir.file("p.jsonl")),
            "{\"prompt\":\"p\",\"chosen\":\"c\",\"rejected\":\"r\"}\n");
}

TEST(RlDatasets, RoundTripsTaskExports) {
  test::temp_dir dir;
  auto t = make("sort", 1, 8);
  ASSERT_TRUE(t);
  auto splits = make_splits(*t, 5, 100, 20);
  ASSERT_TRUE(splits);
  auto prefs = to_preferences(*t, splits->train, 5);
  ASSERT_TRUE(save_examples(dir.file("eval.jsonl"), splits->eval));
  ASSERT_TRUE(save_preferences(dir.file("prefs.jsonl"), prefs));
  auto eval = load_examples(dir.file("eval.jsonl"));
  auto loaded_prefs = load_preferences(dir.file("prefs.jsonl"));
  ASSERT_TRUE(eval && loaded_prefs);
  EXPECT_EQ(*eval, splits->eval);
  EXPECT_EQ(*loaded_prefs, prefs);
}

TEST(RlDatasets, IgnoresExtraKeysBlankLinesAndCarriageReturns) {
  test::temp_dir dir;
  auto path =
      dir.write("e.jsonl", "\n{\"id\": 7, \"answer\": \"0135\", \"prompt\": \"sort:5031=\", "
                           "\"meta\": {\"x\": null}}\r\n   \n{\"prompt\":\"p\",\"answer\":"
                           "\"a\"}");
  auto e = load_examples(path);
  ASSERT_TRUE(e) << describe(e.error());
  EXPECT_EQ(*e, (std::vector<example>{{"sort:5031=", "0135"}, {"p", "a"}}));
}

TEST(RlDatasets, MalformedLinesNameFileLineAndField) {
  enum format { examples, demos, prefs };
  struct row {
    format fmt;
    std::string bad_line;
    std::string reason; // after "<path>:<line>: "
  };
  const std::vector<row> table{
      {examples, "{\"prompt\": \"p\"", "not valid JSON"},
      {examples, "[\"p\", \"a\"]", "expected a JSON object, got array"},
      {examples, "\"p\"", "expected a JSON object, got string"},
      {examples, "{\"answer\": \"a\"}", "field \"prompt\": missing, expected a string"},
      {examples, "{\"prompt\": \"p\"}", "field \"answer\": missing, expected a string"},
      {examples, "{\"prompt\": 5, \"answer\": \"a\"}",
       "field \"prompt\": expected a string, got number"},
      {examples, "{\"prompt\": \"p\", \"answer\": null}",
       "field \"answer\": expected a string or a number, got null"},
      {examples, "{\"prompt\": [\"p\"], \"answer\": \"a\"}",
       "field \"prompt[0]\": expected a message object, got string"},
      {examples, "{\"prompt\": \"\", \"answer\": \"a\"}",
       "field \"prompt\": expected a non-empty string"},
      {examples, "{\"prompt\": \"p\", \"answer\": \"\"}",
       "field \"answer\": expected a non-empty string"},
      {examples, "{\"Prompt\": \"p\", \"answer\": \"a\"}",
       "field \"prompt\": missing, expected a string"},
      {demos, "{\"prompt\": \"p\", \"answer\": \"a\"}",
       "field \"response\": missing, expected a string"},
      {demos, "{\"prompt\": \"p\", \"response\": true}",
       "field \"response\": expected a string, got boolean"},
      {demos, "{\"prompt\": \"p\", \"response\": \"\"}",
       "field \"response\": expected a non-empty string"},
      {prefs, "{\"prompt\": \"p\", \"chosen\": \"c\"}",
       "field \"rejected\": missing, expected a string"},
      {prefs, "{\"prompt\": \"p\", \"chosen\": {}, \"rejected\": \"r\"}",
       "field \"chosen\": expected a string, got object"},
      {prefs, "{\"prompt\": \"p\", \"chosen\": \"c\", \"rejected\": \"\"}",
       "field \"rejected\": expected a non-empty string"},
      {prefs, "{\"prompt\": \"p\", \"chosen\": \"c\", \"rejected\": \"c\"}",
       "fields \"chosen\" and \"rejected\": expected different strings, got equal ones"},
  };
  const std::string good[] = {"{\"prompt\": \"q\", \"answer\": \"a\"}",
                              "{\"prompt\": \"q\", \"response\": \"r\"}",
                              "{\"prompt\": \"q\", \"chosen\": \"c\", \"rejected\": \"r\"}"};
  test::temp_dir dir;
  for (size_t i = 0; i < table.size(); ++i) {
    const auto& r = table[i];
    // A good line, a blank line (still counted), then the bad line 3, then a good one.
    const auto& ok = good[r.fmt];
    auto path = dir.write("bad" + std::to_string(i) + ".jsonl",
                          ok + "\n\n" + r.bad_line + "\n" + ok + "\n");
    caf::error err;
    switch (r.fmt) {
    case examples:
      err = error_of(load_examples(path));
      break;
    case demos:
      err = error_of(load_demonstrations(path));
      break;
    case prefs:
      err = error_of(load_preferences(path));
      break;
    }
    ASSERT_TRUE(err) << r.bad_line;
    EXPECT_EQ(code_of(err), errc::parse_error) << r.bad_line;
    EXPECT_EQ(context_of(err), path + ":3: " + r.reason) << r.bad_line;
  }
}

TEST(RlDatasets, EmptyAndMissingFilesAreErrors) {
  test::temp_dir dir;
  for (std::string content : {"", "\n", "  \n\t\n\r\n"}) {
    auto path = dir.write("empty.jsonl", content);
    auto e = load_examples(path);
    ASSERT_FALSE(e);
    EXPECT_EQ(code_of(e.error()), errc::parse_error);
    EXPECT_EQ(context_of(e.error()), path + ": no records");
    auto p = load_preferences(path);
    ASSERT_FALSE(p);
    EXPECT_EQ(context_of(p.error()), path + ": no records");
  }
  auto missing = load_demonstrations(dir.file("missing.jsonl"));
  ASSERT_FALSE(missing);
  EXPECT_EQ(code_of(missing.error()), errc::io_error);
  EXPECT_NE(context_of(missing.error()).find(dir.file("missing.jsonl")), std::string::npos)
      << context_of(missing.error());
}

TEST(RlDatasets, SaveRefusesRowsThatWouldNotLoadBack) {
  test::temp_dir dir;
  auto path = dir.file("out.jsonl");
  struct row {
    expected<void> result;
    std::string reason; // after "<path>: "
  };
  std::vector<row> table;
  table.push_back({save_examples(path, {}), "no records to write"});
  table.push_back({save_examples(path, {{"p", "a"}, {"", "a"}}),
                   "row 2: field \"prompt\": expected a non-empty string"});
  table.push_back({save_demonstrations(path, {{"p", ""}}),
                   "row 1: field \"response\": expected a non-empty string"});
  table.push_back({save_preferences(path, {{"p", "c", "r"}, {"p", "x", "x"}}),
                   "row 2: fields \"chosen\" and \"rejected\": expected different strings, got "
                   "equal ones"});
  table.push_back({save_examples(path, {{"p", "bad \xff byte"}}),
                   "row 1: field \"answer\": expected valid UTF-8"});
  for (const auto& r : table) {
    ASSERT_FALSE(r.result) << r.reason;
    EXPECT_EQ(code_of(r.result.error()), errc::invalid_argument);
    EXPECT_EQ(context_of(r.result.error()), path + ": " + r.reason);
  }
  EXPECT_FALSE(std::filesystem::exists(path)); // nothing was written
}

// The bound a job checks its context length against is the longest prompt
// the task actually makes (reached, never exceeded).
TEST(RlTasks, MaxPromptLengthIsTheLongestPrompt) {
  for (const char* name : {"sort", "add"}) {
    task_options o;
    o.name = *enum_from_name<task_kind>(name);
    o.min_digits = 1;
    o.max_digits = 3;
    auto t = make_task(o);
    ASSERT_TRUE(t) << describe(t.error());
    size_t longest = 0;
    for (int64_t i = 0; i < 2000; ++i)
      longest = std::max(longest, (*t)->make_example(7, i).prompt.size());
    EXPECT_EQ(static_cast<int64_t>(longest), (*t)->max_prompt_length()) << name;
  }
}
