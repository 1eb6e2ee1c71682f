#pragma once
// Loads a job spec from YAML text (named job.yaml in messages) with --set
// overrides, for the job tests.

#include "actors/rl/job_config.hpp"

#include <string>
#include <vector>

namespace troupe::actors::rl::testing {

inline expected<job_config> parse_job(const std::string& yaml, std::vector<std::string> sets = {}) {
  auto doc = runtime::yaml_document::from_text(yaml, "job.yaml");
  if (!doc)
    return doc.error();
  for (const auto& s : sets)
    if (auto ok = doc->set(s); !ok)
      return ok.error();
  return runtime::load_config<job_config>(*doc);
}

} // namespace troupe::actors::rl::testing
