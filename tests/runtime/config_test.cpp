#include "runtime/config.hpp"
#include "runtime/utf8.hpp"

#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

using namespace troupe;
using namespace troupe::runtime;

namespace {

// A small config tree with every supported field kind.
struct optim_cfg {
  double lr = 1e-5;
  double betas0 = 0.9;
};
template <class V>
void visit(V& v, optim_cfg& c) {
  v.field("lr", c.lr, "Learning rate");
  v.field("beta1", c.betas0);
}

struct stage_cfg {
  std::string kind = "sft";
  int64_t steps = 10;
};
template <class V>
void visit(V& v, stage_cfg& c) {
  v.choice("kind", c.kind, {"sft", "rm", "ppo"}, "Stage algorithm");
  v.field("steps", c.steps);
}

struct job_cfg {
  std::string name = "job";
  int64_t batch_size = 8;
  int32_t mini_batches = 2;
  bool resume = false;
  std::vector<int64_t> stop_ids;
  std::optional<int64_t> seed;
  optim_cfg optim;
  std::vector<stage_cfg> stages;
};
template <class V>
void visit(V& v, job_cfg& c) {
  v.field("name", c.name, "Run name");
  v.field("batch_size", c.batch_size, "Prompts per iteration");
  v.field("mini_batches", c.mini_batches);
  v.field("resume", c.resume);
  v.field("stop_ids", c.stop_ids);
  v.field("seed", c.seed);
  v.section("optim", c.optim, "Optimizer");
  v.list("stages", c.stages, "Stages, in order");
}
void check(const job_cfg& c, config_checks& checks) {
  checks.require(c.batch_size % c.mini_batches == 0, "mini_batches",
                 "batch_size " + std::to_string(c.batch_size) + " is not divisible by " +
                     std::to_string(c.mini_batches) + " mini-batches");
  checks.require(c.optim.lr > 0, "optim.lr", "must be > 0");
}

expected<job_cfg> load(const std::string& text, std::vector<std::string> sets = {}) {
  auto doc = yaml_document::from_text(text, "job.yaml");
  if (!doc)
    return doc.error();
  for (const auto& s : sets)
    if (auto ok = doc->set(s); !ok)
      return ok.error();
  return load_config<job_cfg>(*doc);
}

std::string error_of(const expected<job_cfg>& r) {
  EXPECT_FALSE(r);
  return r ? std::string{} : describe(r.error());
}

} // namespace

TEST(Config, ReadsEveryKindAndKeepsDefaults) {
  auto c = load("name: demo\n"
                "batch_size: 12\n"
                "resume: true\n"
                "stop_ids: [1, 2]\n"
                "seed: 7\n"
                "optim:\n"
                "  lr: 3.0e-4\n"
                "stages:\n"
                "  - kind: sft\n"
                "    steps: 5\n"
                "  - kind: ppo\n");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->name, "demo");
  EXPECT_EQ(c->batch_size, 12);
  EXPECT_EQ(c->mini_batches, 2); // default
  EXPECT_TRUE(c->resume);
  EXPECT_EQ(c->stop_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c->seed, 7);
  EXPECT_DOUBLE_EQ(c->optim.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c->optim.betas0, 0.9);
  ASSERT_EQ(c->stages.size(), 2u);
  EXPECT_EQ(c->stages[0].steps, 5);
  EXPECT_EQ(c->stages[1].kind, "ppo");
  EXPECT_EQ(c->stages[1].steps, 10);
  auto empty = load("");
  ASSERT_TRUE(empty);
  EXPECT_FALSE(empty->seed.has_value());
}

TEST(Config, ReportsEveryViolationWithLineColumnAndPath) {
  auto msg = error_of(load("name: demo\n"
                           "batch_size: lots\n"
                           "resume: yes\n"
                           "optim:\n"
                           "  lr: 1e-4\n"
                           "  lrr: 2\n"
                           "stages:\n"
                           "  - kind: dpo\n"
                           "    steps: [1]\n"
                           "extra: 1\n"));
  EXPECT_NE(msg.find("job.yaml:2:13: batch_size: expected an integer, got 'lots'"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("job.yaml:3:9: resume: expected true or false, got 'yes'"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("job.yaml:6:3: optim.lrr: unknown key 'lrr' (known here: beta1, lr)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("job.yaml:8:11: stages[0].kind: expected one of sft, rm, ppo, got 'dpo'"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("job.yaml:9:12: stages[0].steps: expected an integer, got a list"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("job.yaml:10:1: extra: unknown key 'extra' (known here: batch_size, "
                     "mini_batches, name, optim, resume, seed, stages, stop_ids)"),
            std::string::npos)
      << msg;
}

TEST(Config, RefusesARepeatedKeyAtItsSecondOccurrence) {
  // yaml-cpp would keep the first value and drop the second without a word.
  auto msg = error_of(load("batch_size: 8\n"
                           "optim:\n"
                           "  lr: 1e-4\n"
                           "  lr: 2e-4\n"
                           "batch_size: 16\n"));
  EXPECT_NE(msg.find("job.yaml:4:3: optim.lr: duplicate key 'lr' (first given at line 3)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("job.yaml:5:1: batch_size: duplicate key 'batch_size' (first given at line 1)"),
            std::string::npos)
      << msg;
}

TEST(Config, CrossFieldChecksPointAtTheLineOfTheirPath) {
  auto msg = error_of(load("batch_size: 10\nmini_batches: 4\noptim:\n  lr: -1\n"));
  EXPECT_NE(msg.find("job.yaml:2:15: mini_batches: batch_size 10 is not divisible by 4 mini-batches"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("job.yaml:4:7: optim.lr: must be > 0"), std::string::npos) << msg;
  // A check on a key the file does not set names the file and "(default)".
  auto d = error_of(load("batch_size: 3\n"));
  EXPECT_NE(d.find("job.yaml (default): mini_batches: batch_size 3 is not divisible"),
            std::string::npos)
      << d;
}

TEST(Config, SyntaxErrorsAndBadTopLevelsAreLocated) {
  auto bad = yaml_document::from_text("a: [1, 2\nb: 3\n", "x.yaml");
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::parse_error);
  EXPECT_NE(describe(bad.error()).find("x.yaml:"), std::string::npos) << describe(bad.error());
  auto list = yaml_document::from_text("- 1\n- 2\n", "y.yaml");
  ASSERT_FALSE(list);
  EXPECT_NE(describe(list.error()).find("y.yaml: the top level must be a mapping"),
            std::string::npos);
  auto missing = yaml_document::from_file("/nonexistent/troupe/job.yaml");
  ASSERT_FALSE(missing);
  EXPECT_EQ(code_of(missing.error()), errc::io_error);
}

TEST(Config, OverridesApplyInOrderAndAreNamedInErrors) {
  auto c = load("optim:\n  lr: 1e-4\n",
                {"optim.lr=5e-5", "batch_size=16", "stages=[{kind: rm}]", "batch_size=32"});
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_DOUBLE_EQ(c->optim.lr, 5e-5);
  EXPECT_EQ(c->batch_size, 32);
  ASSERT_EQ(c->stages.size(), 1u);
  EXPECT_EQ(c->stages[0].kind, "rm");
  auto msg = error_of(load("", {"optim.lr=fast"}));
  EXPECT_NE(msg.find("--set optim.lr=fast: optim.lr: expected a finite number, got 'fast'"),
            std::string::npos)
      << msg;
  auto typo = error_of(load("", {"optim.lrate=1"}));
  EXPECT_NE(typo.find("--set optim.lrate=1: optim.lrate: unknown key 'lrate'"), std::string::npos)
      << typo;
  // Errors inside an overridden value name the override, not a file line.
  auto nested = error_of(load("", {"stages=[{kind: sft, stepz: 1}]", "stop_ids=[1, x]"}));
  EXPECT_NE(nested.find("--set stages=[{kind: sft, stepz: 1}]: stages[0].stepz: unknown key"),
            std::string::npos)
      << nested;
  EXPECT_NE(nested.find("--set stop_ids=[1, x]: stop_ids[1]: expected integers, got 'x'"),
            std::string::npos)
      << nested;
  auto doc = yaml_document::from_text("name: x\n", "j.yaml");
  ASSERT_TRUE(doc);
  EXPECT_FALSE(doc->set("no_equals_sign"));
  EXPECT_FALSE(doc->set("a..b=1"));
  auto into_scalar = doc->set("name.first=1");
  ASSERT_FALSE(into_scalar);
  EXPECT_NE(describe(into_scalar.error()).find("'name' is 'x', not a mapping"), std::string::npos);
}

TEST(Config, WrittenYamlLoadsBackToTheSameValues) {
  job_cfg c;
  c.name = "has: colon";
  c.batch_size = 6;
  c.mini_batches = 3;
  c.resume = true;
  c.stop_ids = {4, 5};
  c.seed = 11;
  c.optim.lr = 0.1 + 0.2; // needs 17 digits
  c.stages = {{"sft", 3}, {"ppo", 4}};
  auto text = to_yaml(c);
  EXPECT_NE(text.find("# Learning rate"), std::string::npos) << text;
  EXPECT_NE(text.find("# Stage algorithm (sft, rm, ppo)"), std::string::npos) << text;
  auto back = load(text);
  ASSERT_TRUE(back) << describe(back.error()) << "\n" << text;
  EXPECT_EQ(back->name, c.name);
  EXPECT_EQ(back->batch_size, 6);
  EXPECT_EQ(back->mini_batches, 3);
  EXPECT_TRUE(back->resume);
  EXPECT_EQ(back->stop_ids, c.stop_ids);
  EXPECT_EQ(back->seed, 11);
  EXPECT_EQ(back->optim.lr, c.optim.lr);
  ASSERT_EQ(back->stages.size(), 2u);
  EXPECT_EQ(back->stages[1].kind, "ppo");
  EXPECT_EQ(back->stages[1].steps, 4);
  EXPECT_EQ(to_yaml(*back), text);
}

TEST(Config, LoadsFromAFile) {
  test::temp_dir dir;
  auto path = dir.write("job.yaml", "batch_size: 4\nmini_batches: 3\n");
  auto r = load_config_file<job_cfg>(path);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find(path + ":2:15: mini_batches:"), std::string::npos)
      << describe(r.error());
  auto ok = load_config_file<job_cfg>(path, {"mini_batches=2"});
  ASSERT_TRUE(ok) << describe(ok.error());
  EXPECT_EQ(ok->mini_batches, 2);
}

// NOTE [base files]: mappings merge key by key over the base, lists and
// scalars replace; errors name the file each key came from.
TEST(Config, BaseFilesMergeAndErrorsNameTheirFile) {
  test::temp_dir dir;
  auto base = dir.write("base.yaml", "name: base\nbatch_size: 6\nmini_batches: 4\noptim: {lr: 0.5, beta1: 0.8}\n"
                                     "stages: [{kind: rm}, {kind: ppo}]\n");
  std::filesystem::create_directories(dir.file("sub"));
  auto child = dir.write("sub/child.yaml", "base: ../base.yaml\nname: child\noptim: {lr: 0.25}\n"
                                           "stages: [{kind: sft, steps: 3}]\n");
  auto r = load_config_file<job_cfg>(child, {"mini_batches=3"});
  ASSERT_TRUE(r) << describe(r.error());
  EXPECT_EQ(r->name, "child");
  EXPECT_EQ(r->batch_size, 6);        // inherited
  EXPECT_EQ(r->optim.lr, 0.25);       // merged: this file's
  EXPECT_EQ(r->optim.betas0, 0.8);    // merged: the base's
  ASSERT_EQ(r->stages.size(), 1u);    // a list replaces
  EXPECT_EQ(r->stages[0].kind, "sft");

  // An inherited violation points into the base file, one of the child's into the child.
  auto bad = load_config_file<job_cfg>(child);
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find(dir.file("base.yaml") + ":3:15: mini_batches:"), std::string::npos)
      << describe(bad.error());
  auto own = dir.write("sub/own.yaml", "base: ../base.yaml\noptim: {lr: -1}\n");
  auto bad2 = load_config_file<job_cfg>(own, {"mini_batches=3"});
  ASSERT_FALSE(bad2);
  EXPECT_NE(describe(bad2.error()).find(own + ":2:13: optim.lr:"), std::string::npos) << describe(bad2.error());

  // Missing and cyclic bases are errors at the `base:` line.
  auto missing = dir.write("missing.yaml", "name: x\nbase: nowhere.yaml\n");
  auto m = load_config_file<job_cfg>(missing);
  ASSERT_FALSE(m);
  EXPECT_NE(describe(m.error()).find(missing + ":2:7: base"), std::string::npos) << describe(m.error());
  // A key given twice is refused in a file with a base too (a merge would
  // keep one silently), and in its base.
  auto twice = dir.write("sub/twice.yaml", "base: ../base.yaml\nname: a\nname: b\n");
  auto t = load_config_file<job_cfg>(twice, {"mini_batches=3"});
  ASSERT_FALSE(t);
  EXPECT_NE(describe(t.error()).find(twice + ":3:1: name: duplicate key 'name' (first given at line 2)"),
            std::string::npos)
      << describe(t.error());
  auto base2 = dir.write("base2.yaml", "optim: {lr: 0.5, lr: 0.25}\n");
  auto over2 = dir.write("over2.yaml", "base: base2.yaml\nname: a\n");
  auto t2 = load_config_file<job_cfg>(over2);
  ASSERT_FALSE(t2);
  EXPECT_NE(describe(t2.error()).find(base2 + ":1:18: optim.lr: duplicate key 'lr'"), std::string::npos)
      << describe(t2.error());
  auto loop = dir.write("loop.yaml", "base: loop.yaml\n");
  auto l = load_config_file<job_cfg>(loop);
  ASSERT_FALSE(l);
  EXPECT_NE(describe(l.error()).find("more than 8 levels"), std::string::npos) << describe(l.error());
}

// Text fields take UTF-8 only: an invalid byte sequence is refused at load
// with its location (it would otherwise reach logs, events and file names).
TEST(Config, InvalidUtf8IsRefusedWithItsLocation) {
  auto e = error_of(load("batch_size: 8\nname: \"ab\xff\xfe\"\n"));
  EXPECT_NE(e.find("job.yaml:2:7: name: expected UTF-8 text, got an invalid byte sequence at byte 2"),
            std::string::npos)
    << e;
  e = error_of(load("name: x\n", {"name=caf\xc3"}));
  EXPECT_NE(e.find("name: expected UTF-8 text"), std::string::npos) << e;
  // Valid multi-byte text passes.
  auto ok = load("name: \"gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80\"\n");
  ASSERT_TRUE(ok) << describe(ok.error());
  EXPECT_EQ(ok->name, "gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80");
}

TEST(Utf8, InvalidSequencesBecomeReplacementCharacters) {
  EXPECT_EQ(valid_utf8("plain \xc3\xa9"), "plain \xc3\xa9");
  EXPECT_EQ(valid_utf8("ab\x80"
                       "c"),
            "ab\xef\xbf\xbd"
            "c");
  EXPECT_EQ(valid_utf8("ok\xe2\x82"), "ok\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(valid_utf8("\xff\xfe"), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(invalid_utf8_at(valid_utf8("\xe0\x80\xaf x \xed\xa0\x80")), std::string_view::npos);
  EXPECT_EQ(valid_utf8(""), "");
}

TEST(Utf8, FindsTheFirstInvalidSequence) {
  EXPECT_EQ(invalid_utf8_at("plain ascii"), std::string_view::npos);
  EXPECT_EQ(invalid_utf8_at("\xc3\xa9\xe2\x82\xac\xf4\x8f\xbf\xbf"), std::string_view::npos); // é € U+10FFFF
  EXPECT_EQ(invalid_utf8_at("ab\x80"), 2u);              // a lone continuation byte
  EXPECT_EQ(invalid_utf8_at("a\xc0\xaf"), 1u);           // overlong '/'
  EXPECT_EQ(invalid_utf8_at("\xe0\x80\xaf"), 0u);        // overlong, 3 bytes
  EXPECT_EQ(invalid_utf8_at("x\xed\xa0\x80"), 1u);       // a surrogate
  EXPECT_EQ(invalid_utf8_at("\xf4\x90\x80\x80"), 0u);    // above U+10FFFF
  EXPECT_EQ(invalid_utf8_at("ok\xe2\x82"), 2u);          // truncated
  EXPECT_EQ(invalid_utf8_at("\xff"), 0u);
}
