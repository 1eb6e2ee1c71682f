#include "models/pipeline_parallel.hpp"
#include "models/tensor_parallel.hpp"

#include <numeric>

// Which part of the model a rank holds under tensor and pipeline
// parallelism: arithmetic on the config only (no LibTorch, no group), so
// `troupe plan`, the job loader and its fuzz target use it as the engines
// do. The group overloads live with the layers (tensor_parallel.cpp,
// pipeline_parallel.cpp).
namespace troupe::models {

std::pair<int64_t, int64_t> tp_range(int64_t n, int rank, int size) {
  return {n * rank / size, n * (rank + 1) / size};
}

expected<tp_partition> partition_llama(const llama_config& c, int rank, int size) {
  auto refuse = [&](const std::string& what, int64_t n) {
    return make_error(errc::invalid_argument, "tensor parallelism: tp " + std::to_string(size) +
                                                  " does not divide " + what + " (" +
                                                  std::to_string(n) + ")");
  };
  if (size < 1 || rank < 0 || rank >= size)
    return make_error(errc::invalid_argument, "tensor parallelism: rank " + std::to_string(rank) +
                                                  " of tp " + std::to_string(size));
  if (c.num_attention_heads % size != 0)
    return refuse("the attention heads", c.num_attention_heads);
  if (c.intermediate_size % size != 0)
    return refuse("the intermediate size", c.intermediate_size);
  if (c.vocab_size < size)
    return refuse("the vocabulary into non-empty parts", c.vocab_size);
  tp_partition p;
  p.rank = rank;
  p.size = size;
  p.heads = c.num_attention_heads / size;
  p.head0 = rank * p.heads;
  p.kv_split = c.num_key_value_heads % size == 0;
  p.kv_heads = p.kv_split ? c.num_key_value_heads / size : c.num_key_value_heads;
  p.kv0 = p.kv_split ? rank * p.kv_heads : 0;
  p.intermediate = c.intermediate_size / size;
  p.inter0 = rank * p.intermediate;
  auto [v0, v1] = tp_range(c.vocab_size, rank, size);
  p.vocab0 = v0;
  p.vocab = v1 - v0;
  return p;
}

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
