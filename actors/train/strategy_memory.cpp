#include "actors/train/strategy_memory.hpp"

#include <algorithm>

namespace troupe::actors::train {

parameter_split split_parameters(const models::llama_config& c, bool lm_head) {
  auto H = c.hidden_size, V = c.vocab_size, I = c.intermediate_size;
  auto hd = c.resolved_head_dim();
  auto q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  parameter_split s;
  s.layer = H * q + 2 * H * kv + q * H + 3 * H * I + 2 * H;
  if (c.qkv_bias)
    s.layer += q + 2 * kv;
  if (c.o_bias)
    s.layer += H;
  if (c.mlp_bias)
    s.layer += 2 * I + H;
  s.layers = c.num_hidden_layers;
  s.largest = std::max({V * H, H * I, H * q});
  s.rest = V * H + H;
  if (lm_head && !c.tie_word_embeddings)
    s.rest += V * H;
  if (!lm_head)
    s.rest += H + 1;
  return s;
}

// NOTE [activation memory].
activation_split activation_bytes(const models::llama_config& c, bool lm_head, int64_t rows,
                                  int64_t tokens) {
  const double B = static_cast<double>(rows), T = static_cast<double>(tokens), N = B * T;
  const double H = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double D = static_cast<double>(c.resolved_head_dim());
  const double q = static_cast<double>(c.num_attention_heads) * D;
  const double kv = static_cast<double>(c.num_key_value_heads) * D;
  const double heads = static_cast<double>(c.num_attention_heads);
  const double V = static_cast<double>(c.vocab_size);
  activation_split a;
  a.layers = c.num_hidden_layers;
  a.layer = 4 * N * (7 * H + 3 * q + 2 * kv + 4 * I + 2) + 4 * B * heads * T * T + B * T * T;
  a.layer_input = 4 * N * H;
  a.rest = 4 * N * (4 * H + 2 * D + 5);
  if (lm_head)
    a.logits = 4 * N * V + (rows > 1 ? 4 * B * (T - 1) * V : 0);
  a.rest += a.logits;
  return a;
}

rank_memory training_rank_memory(dp_strategy s, int64_t dp, double bucket_mb,
                                 const parameter_split& params,
                                 const activation_split& activations) {
  const double phi = static_cast<double>(params.total());
  const bool sharded = dp > 1; // a zero strategy at dp 1 trains as ddp
  const double n = sharded ? static_cast<double>(dp) : 1.0;
  const auto kind = sharded ? s : dp_strategy::ddp;
  rank_memory m;
  m.weights = kind == dp_strategy::zero3 ? 4 * phi / n : 4 * phi;
  m.gradients = kind == dp_strategy::ddp     ? 4 * phi
                : kind == dp_strategy::zero1 ? 4 * phi + 4 * phi / n
                                             : 4 * phi / n;
  m.optimizer = kind == dp_strategy::ddp ? 8 * phi : 8 * phi / n;
  const double stepped = kind == dp_strategy::ddp ? phi : phi / n; // elements AdamW steps
  m.step_temporaries = std::max(4 * stepped, 8 * std::min(stepped, double{1 << 20}));
  m.activations = activations.total();
  m.transient = 4 * static_cast<double>(params.largest);
  switch (kind) {
  case dp_strategy::zero2:
    m.transient += std::max(0.0, std::min(bucket_mb * 1024 * 1024, 4 * phi) - activations.logits);
    break;
  case dp_strategy::zero3: {
    const double rest = static_cast<double>(params.rest);
    const double layer = static_cast<double>(params.layer);
    m.transient = 8 * rest + 12 * layer;
    // Checkpointed layers: their inputs, and one layer recomputed at a time.
    m.activations = static_cast<double>(activations.layers) * activations.layer_input +
                    activations.layer + activations.rest;
    break;
  }
  default:
    break;
  }
  return m;
}

double rank_memory::total() const {
  return weights + gradients + optimizer + std::max(activations + transient, step_temporaries);
}

std::vector<memory_term> rank_memory::terms() const {
  std::vector<memory_term> out{{"weights", weights},
                               {"gradients", gradients},
                               {"optimizer state", optimizer}};
  if (activations + transient >= step_temporaries) {
    out.push_back({"activations", activations});
    out.push_back({"strategy transients", transient});
  } else
    out.push_back({"optimizer-step temporaries", step_temporaries});
  std::stable_sort(out.begin(), out.end(),
                   [](const memory_term& a, const memory_term& b) { return a.bytes > b.bytes; });
  return out;
}

} // namespace troupe::actors::train
