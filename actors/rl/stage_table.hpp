#pragma once
// The one table of a job's stages.
//
// NOTE [stage table]: a stage is a row: its name, its cast (the roles it
// uses, in spawn order, given the job), what each DP rank of a role it
// trains splits, and the seed and optimizer its roles' models start with.
// The planner, the role builder and the job's stage loop read the table;
// adding a stage (dpo was) is adding a row here and its driver to the
// switch in job.cpp (`drive`; the compiler names a missing case). The
// table itself needs no LibTorch, so the job loader's checks link without
// the drivers.

#include "actors/rl/job_config.hpp"
#include "actors/rl/role_traits.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::actors::rl {

struct stage_traits {
  stage_id id;
  std::string_view name;
  /// The roles the stage uses in `cfg`, in spawn order.
  std::vector<role_id> (*cast)(const job_config& cfg);
  /// What each DP rank of a role trained here splits: (what, rows).
  std::pair<std::string, int64_t> (*dp_rows)(const job_config& cfg);
  /// Sequences a row holds (preference pairs: 2), for memory and traffic.
  int64_t sequences_per_row;
  /// The seed `role`'s model is loaded with (fresh heads equal everywhere).
  uint64_t (*seed)(const job_config& cfg, const role_traits& role);
  /// The optimizer of a role trained here.
  train::optimizer_options (*optim)(const job_config& cfg, role_id role);
};

/// Every stage, in the order a job runs them (index = stage_id).
const std::vector<stage_traits>& all_stages();
const stage_traits& traits_of(stage_id id);
/// The traits of `name`; null for an unknown stage.
const stage_traits* find_stage(std::string_view name);
/// The roles of `stage` in `cfg`, in spawn order.
std::vector<role_id> stage_cast(stage_id stage, const job_config& cfg);
/// Whether `role` takes part in `stage` of `cfg`.
bool in_cast(stage_id stage, role_id role, const job_config& cfg);

} // namespace troupe::actors::rl
