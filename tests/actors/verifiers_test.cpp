// Verifiable rule rewards: answer extraction, numeric equivalence and the
// rules (NOTE [verifiable rewards] in actors/rl/verifiers.hpp).

#include "actors/rl/verifiers.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace troupe::actors::rl {
namespace {

std::string show(const std::optional<std::string>& s) {
  return s ? "\"" + *s + "\"" : "(none)";
}

TEST(Verifiers, ExtractionTable) {
  struct row {
    answer_extract mode;
    std::string text;
    std::optional<std::string> answer;
  };
  const std::vector<row> table{
      // strict: the last "#### " number, commas dropped
      {answer_extract::strict, "so 3 + 4 = 7\n#### 7", "7"},
      {answer_extract::strict, "#### 1,234", "1234"},
      {answer_extract::strict, "#### -5 then #### 12", "12"},
      {answer_extract::strict, "#### 3.5.", "3.5."},
      {answer_extract::strict, "the answer is 7", std::nullopt},
      {answer_extract::strict, "####7", std::nullopt}, // the space is part of the format
      {answer_extract::strict, "#### abc", std::nullopt},
      {answer_extract::strict, "", std::nullopt},
      // flexible: the last number anywhere
      {answer_extract::flexible, "I think 3, no, 42.", "42."},
      {answer_extract::flexible, "costs -1,500 dollars", "-1,500"},
      {answer_extract::flexible, "first 1 then 2 then 3", "3"},
      {answer_extract::flexible, "no digits here, really.", std::nullopt},
      {answer_extract::flexible, "3/4", "4"},
      // boxed: the last \boxed{...}, nested braces matched
      {answer_extract::boxed, R"(so \boxed{\frac{1}{2}})", R"(\frac{1}{2})"},
      {answer_extract::boxed, R"(\boxed{1} or \boxed{2})", "2"},
      {answer_extract::boxed, R"(\boxed{{a}{b}} end)", "{a}{b}"},
      {answer_extract::boxed, R"(\boxed{unclosed {x})", std::nullopt},
      {answer_extract::boxed, R"($\boxed 5$ ok)", "5"},
      {answer_extract::boxed, R"(\fbox{9})", "9"},
      {answer_extract::boxed, "plain 7", std::nullopt},
      // none: the whole text
      {answer_extract::none, " 7 ", " 7 "},
  };
  for (const auto& r : table)
    EXPECT_EQ(extract_answer(r.mode, r.text), r.answer)
        << to_string(r.mode) << " of \"" << r.text << "\": got "
        << show(extract_answer(r.mode, r.text));
}

TEST(Verifiers, EquivalenceTable) {
  struct row {
    std::string response;
    std::string truth;
    bool equal;
  };
  const std::vector<row> table{
      {"42", "42", true},
      {"42.0", "42", true},
      {"42.", "42", true},
      {"042", "42", true},
      {"1,234", "1234", true},
      {"1,234.50", "1234.5", true},
      {"12,34", "1234", false}, // not thousands groups: compared as text
      {"-7", "-7", true},
      {"-7", "7", false},
      {"+7", "7", true},
      {"0.5", R"(\frac{1}{2})", true},
      {R"(\dfrac{2}{4})", "1/2", true},
      {R"(\frac12)", "0.5", true},
      {R"(-\frac{3}{4})", "-0.75", true},
      {"3/4", "0.75", true},
      {"3/4", "0.7", false},
      {"50%", "50", true},
      {"50%", "0.5", true},
      {R"(50\%)", "50", true},
      {"50%", "5", false},
      {"1e3", "1000", true},
      {"$42$", "42", true},
      {R"(\$42)", "42", true},
      {R"(\text{42})", "42", true},
      {"90^\\circ", "90", true},
      {"1/0", "0", false},
      {R"(\sqrt{2})", R"(\sqrt{2})", true}, // not a number: normalised text
      {R"(\sqrt{2})", R"(\sqrt{3})", false},
      {"x + 1", "x+1", true},
      {"", "", false}, // nothing answered is never right
      {"123456789012345678901234567890123456789012345", "1", false}, // too long: text
  };
  for (const auto& r : table)
    EXPECT_EQ(answers_equivalent(r.response, r.truth), r.equal)
        << "\"" << r.response << "\" vs \"" << r.truth << "\"";
}

TEST(Verifiers, AGroundTruthSolutionGivesItsFinalAnswer) {
  EXPECT_EQ(ground_truth_answer("She pays 3 * 4 = 12.\n#### 12"), "12");
  EXPECT_EQ(ground_truth_answer(R"(Hence the answer is $\boxed{\frac{1}{3}}$.)"), R"(\frac{1}{3})");
  EXPECT_EQ(ground_truth_answer("42"), "42");
}

rule_config rule_of(rule_kind k, answer_extract e = answer_extract::none, double w = 1) {
  rule_config c;
  c.kind = k;
  c.extract = e;
  c.weight = w;
  return c;
}

double score(const rule_set& rules, std::string_view text, std::string_view answer,
             int64_t tokens = 1) {
  auto s = rules.score({text, tokens, answer});
  EXPECT_TRUE(s) << describe(s.error());
  return s ? *s : -99;
}

TEST(Verifiers, EachRuleKindScores) {
  auto math = *rule_set::make({rule_of(rule_kind::math, answer_extract::boxed)}, 16);
  EXPECT_EQ(score(math, R"(\boxed{0.5})", R"(\frac{1}{2})"), 1.0);
  EXPECT_EQ(score(math, "0.5", "0.5"), 0.0) << "no boxed answer";

  auto exact = *rule_set::make({rule_of(rule_kind::exact, answer_extract::strict)}, 16);
  EXPECT_EQ(score(exact, "#### 12", "12"), 1.0);
  EXPECT_EQ(score(exact, "#### 12.0", "12"), 0.0) << "exact compares bytes";

  auto regex = *rule_set::make({rule_of(rule_kind::regex, answer_extract::flexible)}, 16);
  EXPECT_EQ(score(regex, "it is 43", "4[2-3]"), 1.0);
  EXPECT_EQ(score(regex, "it is 430", "4[2-3]"), 0.0) << "the whole answer must match";
  auto bad = regex.score({"it is 4", 1, "4[2-"});
  ASSERT_FALSE(bad);
  EXPECT_NE(context_of(bad.error()).find("read as a regex"), std::string::npos);

  rule_config fmt = rule_of(rule_kind::format);
  fmt.pattern = R"(<think>.*</think>\s*\d+)";
  auto format = *rule_set::make({fmt}, 16);
  EXPECT_EQ(score(format, "<think>a\nb</think> 7", ""), 1.0) << "'.' spans newlines";
  EXPECT_EQ(score(format, "<think>a</think> 7 extra", ""), 0.0) << "the whole response";

  rule_config over = rule_of(rule_kind::overlong);
  over.buffer = 4;
  over.penalty = 0.5;
  auto overlong = *rule_set::make({over}, 12); // max_length = max_tokens = 12
  EXPECT_EQ(score(overlong, "", "", 8), 0.0);
  EXPECT_EQ(score(overlong, "", "", 10), -0.25);
  EXPECT_EQ(score(overlong, "", "", 12), -0.5);
  EXPECT_EQ(score(overlong, "", "", 40), -0.5) << "never below -penalty";
}

TEST(Verifiers, WeightsSumAndAccuracyFollowsTheFirstAnswerRule) {
  rule_config fmt = rule_of(rule_kind::format, answer_extract::none, 0.25);
  fmt.pattern = R"(.*#### .*)";
  auto rules = *rule_set::make({fmt, rule_of(rule_kind::math, answer_extract::strict, 2)}, 16);
  EXPECT_EQ(score(rules, "#### 7", "7"), 2.25);
  EXPECT_EQ(score(rules, "#### 8", "7"), 0.25);
  EXPECT_TRUE(*rules.correct({"#### 7.00", 1, "7"}));
  EXPECT_FALSE(*rules.correct({"#### 8", 1, "7"}));
  auto positional = *rule_set::make({rule_of(rule_kind::positional)}, 16);
  EXPECT_FALSE(*positional.correct({"0153", 1, "0135"})) << "partial credit is not correct";
  EXPECT_TRUE(*positional.correct({"0135", 1, "0135"}));
  auto no_answer_rule = *rule_set::make({fmt}, 16);
  EXPECT_TRUE(*no_answer_rule.correct({"#### 7", 1, "#### 7"})) << "whole-response match";
}

TEST(Verifiers, BadRulesAreReportedByPath) {
  rule_config fmt = rule_of(rule_kind::format, answer_extract::boxed);
  fmt.pattern = "(unclosed";
  rule_config over = rule_of(rule_kind::overlong);
  rule_config math = rule_of(rule_kind::math);
  math.pattern = "x";
  math.weight = -1;
  auto bad = rule_set::make({fmt, over, math}, 16);
  ASSERT_FALSE(bad);
  auto v = violations_of(bad.error());
  auto has = [&](const std::string& part) {
    for (auto& x : v)
      if (x.find(part) != std::string::npos)
        return true;
    return false;
  };
  EXPECT_TRUE(has("rules[0].pattern: invalid regex '(unclosed'"));
  EXPECT_TRUE(has("rules[0].extract: a format rule reads no answer"));
  EXPECT_TRUE(has("rules[1].buffer: expected an integer in [1, 16]"));
  EXPECT_TRUE(has("rules[2].pattern: only a format rule takes a pattern"));
  EXPECT_TRUE(has("rules[2].weight: expected >= 0"));
  EXPECT_EQ(v.size(), 5u);
}

TEST(Verifiers, AHostilePatternEndsInBoundedTime) {
  rule_config fmt = rule_of(rule_kind::format);
  fmt.pattern = "(a+)+b"; // catastrophic backtracking on a run of a's
  auto rules = *rule_set::make({fmt}, 16);
  std::string text(20000, 'a');
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(score(rules, text, ""), 0.0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

} // namespace
} // namespace troupe::actors::rl
