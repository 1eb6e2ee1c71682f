#pragma once
// The Llama shapes the benchmarks run: llama2.c's stories15M (dim 288, 6
// layers, 6 heads, hidden 768, vocab 32000, context 256, tied embeddings;
// 15.2M parameters) and the 24M one, the same with an untied LM head.
#include "models/config.hpp"

namespace troupe::bench {

inline models::llama_config llama_shape(bool tied) {
  models::llama_config c;
  c.vocab_size = 32000;
  c.hidden_size = 288;
  c.intermediate_size = 768;
  c.num_hidden_layers = 6;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 6;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = tied;
  return c;
}

inline models::llama_config shape_15m() {
  return llama_shape(true);
}
inline models::llama_config shape_24m() {
  return llama_shape(false);
}

} // namespace troupe::bench
