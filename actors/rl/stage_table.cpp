#include "actors/rl/stage_table.hpp"

#include "actors/rl/data.hpp"
#include "runtime/hash.hpp"

#include <algorithm>

namespace troupe::actors::rl {

namespace {

uint64_t run_seed(const job_config& cfg) {
  return static_cast<uint64_t>(cfg.run.seed);
}

int64_t rl_minibatch_rows(const job_config& c) {
  const auto& r = c.rl;
  return r.minibatches > 0 ? r.prompts_per_iteration * r.samples_per_prompt / r.minibatches : 0;
}

} // namespace

const std::vector<stage_traits>& all_stages() {
  using r = role_id;
  static const std::vector<stage_traits> table{
      {stage_id::sft, "sft",
       [](const job_config&) {
         return std::vector<role_id>{r::policy, r::rollout};
       },
       [](const job_config& c) {
         return std::pair<std::string, int64_t>{"sft.batch_size", c.sft.batch_size};
       },
       1,
       [](const job_config& c, const role_traits&) {
         return mix_seed({run_seed(c), 21, 1});
       },
       [](const job_config& c, role_id) { return c.sft.optim; }},
      {stage_id::rm, "rm", [](const job_config&) { return std::vector<role_id>{r::reward}; },
       [](const job_config& c) {
         return std::pair<std::string, int64_t>{"rm.batch_size", c.rm.batch_size};
       },
       2,
       [](const job_config& c, const role_traits&) {
         return mix_seed({run_seed(c), 21, 2});
       },
       [](const job_config& c, role_id) { return c.rm.optim; }},
      {stage_id::dpo, "dpo",
       [](const job_config&) {
         return std::vector<role_id>{r::policy, r::reference};
       },
       [](const job_config& c) {
         return std::pair<std::string, int64_t>{"dpo.batch_size", c.dpo.batch_size};
       },
       2,
       [](const job_config& c, const role_traits&) {
         return mix_seed({run_seed(c), 21, 3});
       },
       [](const job_config& c, role_id) { return c.dpo.optim; }},
      {stage_id::rl, "rl",
       [](const job_config& c) {
         // The critic for gae, the reference while the KL anchors the policy.
         std::vector<role_id> out;
         for (const auto& t : all_roles())
           if ((t.id != r::critic || uses_critic(c.rl)) &&
               (t.id != r::reference || c.rl.kl.coef > 0))
             out.push_back(t.id);
         return out;
       },
       [](const job_config& c) {
         return std::pair<std::string, int64_t>{
             "rl minibatch (prompts_per_iteration × samples_per_prompt / minibatches)",
             rl_minibatch_rows(c)};
       },
       1,
       [](const job_config& c, const role_traits& t) {
         return mix_seed({run_seed(c), t.seed_salt});
       },
       [](const job_config& c, role_id role) {
         return role == r::critic ? c.rl.critic.optim : c.rl.actor_optim;
       }},
  };
  return table;
}

const stage_traits& traits_of(stage_id id) {
  return all_stages()[static_cast<size_t>(id)];
}

const stage_traits* find_stage(std::string_view name) {
  auto id = enum_from_name<stage_id>(name);
  return id ? &traits_of(*id) : nullptr;
}

std::vector<role_id> stage_cast(stage_id stage, const job_config& cfg) {
  return traits_of(stage).cast(cfg);
}

bool in_cast(stage_id stage, role_id role, const job_config& cfg) {
  auto roles = stage_cast(stage, cfg);
  return std::find(roles.begin(), roles.end(), role) != roles.end();
}

} // namespace troupe::actors::rl
