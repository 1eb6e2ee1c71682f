#include "models/pipeline_parallel.hpp"

#include "runtime/collectives.hpp"

namespace troupe::models {

expected<pp_stage> stage_of(const llama_config& c, runtime::process_group& group,
                            const std::vector<int64_t>& listed) {
  auto s = stage_of(c, group.rank(), group.size(), listed);
  if (s && s->size > 1)
    s->group = &group;
  return s;
}

} // namespace troupe::models
