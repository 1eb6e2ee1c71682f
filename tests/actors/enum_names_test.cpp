// Every choice is an enum with one name table (NOTE [enum names]): each
// value of each enum goes through its name and back; each job-file choice
// takes each of its values from a YAML file and from --set, prints it back
// (`troupe config show`) and loads the printed file to the same value; bad
// values are refused naming the key and listing the values.
#include "actors/inference/engine.hpp"
#include "actors/job/events.hpp"
#include "actors/job/state.hpp"
#include "actors/rl/job_config.hpp"
#include "actors/rl/role_traits.hpp"
#include "kernels/advantages.hpp"
#include "kernels/kl.hpp"
#include "kernels/losses.hpp"
#include "kernels/masked.hpp"
#include "models/llama.hpp"
#include "runtime/collectives.hpp"
#include "runtime/logging.hpp"
#include "runtime/weight_transport.hpp"
#include "tests/actors/job_yaml.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <set>

using namespace troupe;
using namespace troupe::actors::rl;

namespace {

template <class E>
void expect_round_trip(const char* what) {
  std::set<std::string_view> seen;
  ASSERT_GT(enum_count<E>(), 0u) << what;
  for (size_t i = 0; i < enum_count<E>(); ++i) {
    auto e = static_cast<E>(i);
    auto name = enum_name(e);
    EXPECT_NE(name, "?") << what << " " << i;
    EXPECT_FALSE(name.empty()) << what << " " << i;
    EXPECT_TRUE(seen.insert(name).second) << what << ": '" << name << "' twice";
    EXPECT_EQ(enum_from_name<E>(name), e) << what << " '" << name << "'";
    EXPECT_EQ(to_string(e), name) << what;
  }
  EXPECT_EQ(enum_name(static_cast<E>(enum_count<E>())), "?") << what;
  EXPECT_EQ(enum_from_name<E>("no-such-value"), std::nullopt) << what;
  // The choices a file may use: the names, then the aliases (each naming a value).
  auto choices = enum_choices<E>();
  ASSERT_GE(choices.size(), enum_count<E>()) << what;
  for (auto c : choices)
    EXPECT_TRUE(enum_from_name<E>(c).has_value()) << what << " '" << c << "'";
}

} // namespace

TEST(EnumNames, EveryValueOfEveryEnumRoundTripsThroughItsName) {
  expect_round_trip<runtime::transport_kind>("transport_kind");
  expect_round_trip<runtime::log_level>("log_level");
  expect_round_trip<runtime::reduce_op>("reduce_op");
  expect_round_trip<kernels::kl_estimator>("kl_estimator");
  expect_round_trip<kernels::loss_agg_mode>("loss_agg_mode");
  expect_round_trip<kernels::advantage_estimator>("advantage_estimator");
  expect_round_trip<actors::inference::panels_mode>("panels_mode");
  expect_round_trip<actors::inference::update_kv>("update_kv");
  expect_round_trip<progress_style>("progress_style");
  expect_round_trip<model_source>("model_source");
  expect_round_trip<kl_control>("kl_control");
  expect_round_trip<kl_place>("kl_place");
  expect_round_trip<reward_kind>("reward_kind");
  expect_round_trip<algorithm_kind>("algorithm_kind");
  expect_round_trip<logprob_source>("logprob_source");
  expect_round_trip<launcher_kind>("launcher_kind");
  expect_round_trip<placement_mode>("placement_mode");
  expect_round_trip<rule_kind>("rule_kind");
  expect_round_trip<task_kind>("task_kind");
  expect_round_trip<actors::job::job_state>("job_state");
  expect_round_trip<actors::job::command>("command");
  expect_round_trip<models::head_kind>("head_kind");
  // Aliases name values of their own enum.
  EXPECT_EQ(enum_from_name<kernels::kl_estimator>("low_var_kl"), kernels::kl_estimator::k3);
  EXPECT_EQ(enum_from_name<kernels::kl_estimator>("mse"), kernels::kl_estimator::k2);
  EXPECT_EQ(enum_from_name<kernels::kl_estimator>("kl"), kernels::kl_estimator::k1);
  EXPECT_EQ(enum_from_name<kernels::kl_estimator>("low_var_kl+"), kernels::kl_estimator::k3_st);
  EXPECT_EQ(enum_name_list<kernels::kl_estimator>(), "k1, abs, k2, k3, k1+, k3+");
  expect_round_trip<kernels::policy_loss_kind>("policy_loss_kind");
  expect_round_trip<kernels::dpo_loss_kind>("dpo_loss_kind");
}

namespace {

/// A job-file choice: its YAML path, the values a file may give, and how
/// the loaded config names it ("auto" for an unset optional).
struct choice_field {
  std::string path;
  std::vector<std::string> values;
  std::function<std::string(const job_config&)> loaded;
};

template <class E>
std::vector<std::string> names_of(bool with_auto = false) {
  std::vector<std::string> out;
  if (with_auto)
    out.emplace_back("auto");
  for (auto n : enum_choices<E>())
    out.emplace_back(n);
  return out;
}

template <class E>
std::string name_or_auto(const std::optional<E>& e) {
  return e ? std::string{to_string(*e)} : std::string{"auto"};
}

std::vector<choice_field> job_choices() {
  auto s = [](auto e) { return std::string{to_string(e)}; };
  return {
      {"run.progress", names_of<progress_style>(),
       [=](const job_config& c) { return s(c.run.progress); }},
      {"run.log_level", names_of<runtime::log_level>(),
       [=](const job_config& c) { return s(c.run.log_level); }},
      {"data.task", names_of<task_kind>(), [=](const job_config& c) { return s(c.data.task); }},
      {"rm.init", {"sft", "base"}, [=](const job_config& c) { return s(c.rm.init); }},
      {"dpo.init", {"sft", "base"}, [=](const job_config& c) { return s(c.dpo.init); }},
      {"dpo.loss_type", names_of<kernels::dpo_loss_kind>(),
       [=](const job_config& c) { return s(c.dpo.loss_type); }},
      {"rl.algorithm", names_of<algorithm_kind>(),
       [=](const job_config& c) { return s(c.rl.algorithm); }},
      {"rl.advantage", names_of<kernels::advantage_estimator>(true),
       [](const job_config& c) { return name_or_auto(c.rl.advantage); }},
      {"rl.policy_loss", names_of<kernels::policy_loss_kind>(),
       [=](const job_config& c) { return s(c.rl.policy_loss); }},
      {"rl.loss_agg", names_of<kernels::loss_agg_mode>(),
       [=](const job_config& c) { return s(c.rl.loss_agg); }},
      {"rl.old_logprobs", names_of<logprob_source>(),
       [=](const job_config& c) { return s(c.rl.old_logprobs); }},
      {"rl.critic.init", names_of<model_source>(),
       [=](const job_config& c) { return s(c.rl.critic.init); }},
      {"rl.reward.kind", names_of<reward_kind>(),
       [=](const job_config& c) { return s(c.rl.reward.kind); }},
      {"rl.reward.rule",
       {"positional", "exact"}, // the built-in tasks' rules only
       [=](const job_config& c) { return s(c.rl.reward.rule); }},
      {"rl.kl.estimator", names_of<kernels::kl_estimator>(),
       [=](const job_config& c) { return s(c.rl.kl.estimator); }},
      {"rl.kl.controller", names_of<kl_control>(),
       [=](const job_config& c) { return s(c.rl.kl.controller); }},
      {"rl.kl.placement", names_of<kl_place>(true),
       [](const job_config& c) { return name_or_auto(c.rl.kl.placement); }},
      {"rl.rollout.decode_panels", names_of<actors::inference::panels_mode>(),
       [=](const job_config& c) { return s(c.rl.rollout.decode_panels); }},
      {"rl.rollout.decode_isa", names_of<actors::inference::isa_mode>(),
       [=](const job_config& c) { return s(c.rl.rollout.decode_isa); }},
      {"rl.rollout.on_update", names_of<actors::inference::update_kv>(),
       [=](const job_config& c) { return s(c.rl.rollout.on_update); }},
      {"weight_sync.transport", names_of<runtime::transport_kind>(true),
       [](const job_config& c) { return name_or_auto(c.weight_sync.transport); }},
      {"resources.launcher", names_of<launcher_kind>(),
       [=](const job_config& c) { return s(c.resources.launcher); }},
      {"placement.mode", names_of<placement_mode>(),
       [=](const job_config& c) { return s(c.placement.mode); }},
  };
}

/// The canonical name of `value` (aliases → their value's name).
std::string canonical(const std::string& value) {
  if (value == "kl" || value == "mse" || value == "low_var_kl" || value == "kl+" ||
      value == "low_var_kl+")
    return std::string{to_string(*enum_from_name<kernels::kl_estimator>(value))};
  return value;
}

/// `path: value` as nested YAML.
std::string nested_yaml(const std::string& path, const std::string& value) {
  std::string out, indent;
  size_t start = 0;
  for (auto dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    out += indent + path.substr(start, dot - start) + ":\n";
    indent += "  ";
    start = dot + 1;
  }
  return out + indent + path.substr(start) + ": " + value + "\n";
}

} // namespace

// Read with the visitors alone: some values need other keys to pass the
// cross-field checks (those are RlJobConfig.BadSpecsNameTheLineAndPath's).
TEST(EnumNames, EveryJobFileChoiceLoadsFromYamlAndSetAndPrintsBack) {
  for (const auto& f : job_choices())
    for (const auto& v : f.values) {
      SCOPED_TRACE(f.path + " = " + v);
      auto doc = runtime::yaml_document::from_text(nested_yaml(f.path, v), "job.yaml");
      ASSERT_TRUE(doc) << describe(doc.error());
      runtime::config_errors errors;
      runtime::location_map where;
      job_config from_file;
      runtime::config_reader reader{*doc, errors, where};
      visit(reader, from_file);
      reader.finish();
      ASSERT_TRUE(errors.empty()) << errors.lines().front();
      EXPECT_EQ(f.loaded(from_file), canonical(v));

      auto set = runtime::yaml_document::from_text("", "job.yaml");
      ASSERT_TRUE(set->set(f.path + "=" + v));
      job_config from_set;
      runtime::config_reader set_reader{*set, errors, where};
      visit(set_reader, from_set);
      ASSERT_TRUE(errors.empty()) << errors.lines().front();
      EXPECT_EQ(f.loaded(from_set), f.loaded(from_file));

      // troupe config show, loaded again.
      auto shown = runtime::yaml_document::from_text(runtime::to_yaml(from_file), "shown.yaml");
      ASSERT_TRUE(shown);
      job_config again;
      runtime::config_reader again_reader{*shown, errors, where};
      visit(again_reader, again);
      ASSERT_TRUE(errors.empty()) << errors.lines().front();
      EXPECT_EQ(f.loaded(again), f.loaded(from_file));
    }
}

TEST(EnumNames, ABadChoiceIsRefusedWithItsPathAndTheValues) {
  auto bad = troupe::actors::rl::testing::parse_job("weight_sync:\n  transport: pigeon\n");
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error())
                .find("job.yaml:2:14: weight_sync.transport: expected one of auto, "
                      "alias, shm, broadcast, disk, cuda_ipc, got 'pigeon'"),
            std::string::npos)
      << describe(bad.error());
  auto set = troupe::actors::rl::testing::parse_job("", {"rl.kl.estimator=k9"});
  ASSERT_FALSE(set);
  EXPECT_NE(describe(set.error())
                .find("rl.kl.estimator: expected one of k1, abs, k2, k3, k1+, k3+, kl, mse, "
                      "low_var_kl, kl+, low_var_kl+"),
            std::string::npos)
      << describe(set.error());
  // A choice limited to some of its enum's values.
  auto rm_from_rm = troupe::actors::rl::testing::parse_job("rm:\n  init: rm\n");
  ASSERT_FALSE(rm_from_rm);
  EXPECT_NE(describe(rm_from_rm.error())
                .find("job.yaml:2:9: rm.init: expected one of sft, base, got 'rm'"),
            std::string::npos)
      << describe(rm_from_rm.error());
}
