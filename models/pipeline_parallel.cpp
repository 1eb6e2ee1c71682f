#include "models/pipeline_parallel.hpp"

#include "runtime/collectives.hpp"

#include <numeric>

namespace troupe::models {

expected<std::vector<int64_t>> split_layers(int64_t layers, int stages,
                                            const std::vector<int64_t>& listed) {
  auto refuse = [&](const std::string& why) {
    return make_error(errc::invalid_argument, "pipeline parallelism: pp " + std::to_string(stages) +
                                                  " over " + std::to_string(layers) +
                                                  " layers: " + why);
  };
  if (stages < 1)
    return refuse("pp must be >= 1");
  if (stages > layers)
    return refuse("more stages than layers");
  if (!listed.empty()) {
    if (listed.size() != static_cast<size_t>(stages))
      return refuse("pp_layers lists " + std::to_string(listed.size()) + " stages");
    for (size_t s = 0; s < listed.size(); ++s)
      if (listed[s] < 1)
        return refuse("pp_layers[" + std::to_string(s) + "] is " + std::to_string(listed[s]) +
                      " (every stage holds a layer at least)");
    const auto sum = std::accumulate(listed.begin(), listed.end(), int64_t{0});
    if (sum != layers)
      return refuse("pp_layers sum to " + std::to_string(sum));
    return listed;
  }
  std::vector<int64_t> out(static_cast<size_t>(stages), layers / stages);
  for (int64_t s = 0; s < layers % stages; ++s)
    ++out[static_cast<size_t>(s)];
  return out;
}

expected<pp_stage> stage_of(const llama_config& c, int rank, int size,
                            const std::vector<int64_t>& listed) {
  if (size < 1 || rank < 0 || rank >= size)
    return make_error(errc::invalid_argument, "pipeline parallelism: rank " + std::to_string(rank) +
                                                  " of pp " + std::to_string(size));
  auto counts = split_layers(c.num_hidden_layers, size, listed);
  if (!counts)
    return counts.error();
  pp_stage s;
  s.rank = rank;
  s.size = size;
  s.layer0 = std::accumulate(counts->begin(), counts->begin() + rank, int64_t{0});
  s.layers = (*counts)[static_cast<size_t>(rank)];
  return s;
}

expected<pp_stage> stage_of(const llama_config& c, runtime::process_group& group,
                            const std::vector<int64_t>& listed) {
  auto s = stage_of(c, group.rank(), group.size(), listed);
  if (s && s->size > 1)
    s->group = &group;
  return s;
}

bool on_stage(const std::string& name, const pp_stage& s, const llama_config& c) {
  if (!s.active())
    return true;
  if (name.rfind("layers.", 0) == 0) {
    const auto dot = name.find('.', 7);
    const auto layer = std::stoll(name.substr(7, dot - 7));
    return s.holds_layer(layer, c.num_hidden_layers);
  }
  if (name.rfind("tok_embeddings.", 0) == 0) // NOTE [tied embedding under PP]
    return s.first() || (s.last() && c.tie_word_embeddings);
  return s.last(); // norm, output, value_head, reward_head
}

} // namespace troupe::models
