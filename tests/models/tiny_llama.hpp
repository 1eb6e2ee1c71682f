#pragma once
// The tiny decoder shape shared by the model tests: GQA (4 heads over 2 kv
// heads), 2 layers, a small vocabulary, rope_theta 500.

#include "models/config.hpp"

namespace troupe::models::testing {

inline llama_config tiny_config() {
  llama_config c;
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2; // grouped-query attention, 2 query heads per kv head
  c.max_position_embeddings = 64;
  c.rope_theta = 500.0;
  return c;
}

} // namespace troupe::models::testing
