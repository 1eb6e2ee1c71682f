#include "actors/train/strategy_memory.hpp"

#include <algorithm>

namespace troupe::actors::train {

namespace {

// A TP rank's widths (NOTE [tensor parallelism] in models/tensor_parallel.hpp):
// heads, kv heads (split when TP divides them, else replicated), the MLP's
// intermediate and the vocabulary are split; the hidden size is whole.
struct rank_dims {
  int64_t H, V, I, hd, heads, q, kv;
};

rank_dims dims_of(const models::llama_config& c, int64_t tp) {
  tp = std::max<int64_t>(tp, 1);
  rank_dims d{};
  d.H = c.hidden_size;
  d.V = (c.vocab_size + tp - 1) / tp;
  d.I = c.intermediate_size / tp;
  d.hd = c.resolved_head_dim();
  d.heads = c.num_attention_heads / tp;
  d.q = d.heads * d.hd;
  d.kv =
      (c.num_key_value_heads % tp == 0 ? c.num_key_value_heads / tp : c.num_key_value_heads) * d.hd;
  return d;
}

} // namespace

parameter_split split_parameters(const models::llama_config& c, bool lm_head, int64_t tp) {
  const auto d = dims_of(c, tp);
  const auto H = d.H, V = d.V, I = d.I, q = d.q, kv = d.kv;
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
                                  int64_t tokens, precision p) {
  const double B = static_cast<double>(rows), T = static_cast<double>(tokens), N = B * T;
  const double H = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double D = static_cast<double>(c.resolved_head_dim());
  const double q = static_cast<double>(c.num_attention_heads) * D;
  const double kv = static_cast<double>(c.num_key_value_heads) * D;
  const double heads = static_cast<double>(c.num_attention_heads);
  const double V = static_cast<double>(c.vocab_size);
  const double shifted = rows > 1 ? B * (T - 1) : 0; // tokens of the shifted copies
  activation_split a;
  a.layers = c.num_hidden_layers;
  if (p == precision::fp32) {
    a.layer = 4 * N * (7 * H + 3 * q + 2 * kv + 4 * I + 2) + 4 * B * heads * T * T + B * T * T;
    a.layer_input = 4 * N * H;
    a.layer_backward = 4 * B * heads * T * T + 4 * N * H + 4 * H * I;
    a.rest = 4 * N * (4 * H + 2 * D + 5);
    if (lm_head)
      a.logits = 4 * N * V + 4 * shifted * V;
  } else {
    a.layer = 2 * N * (7 * H + 3 * q + 2 * kv + 4 * I) + 8 * N * H + 8 * N + 6 * B * heads * T * T +
              B * T * T;
    a.layer_input = 2 * N * H;
    a.layer_backward = 4 * B * heads * T * T + 2 * N * H + 2 * H * I;
    a.rest = 2 * N * (4 * H + 2 * D) + 4 * N * H + 16 * N + 8 * shifted;
    if (lm_head)
      a.logits = 2 * N * V + 2 * shifted * V;
  }
  a.rest += a.logits;
  return a;
}

namespace {

struct moment {
  std::string_view name;
  double activations = 0, buffers = 0;
  double total() const { return activations + buffers; }
};

// What the moments of a step hold besides the states (NOTE [rank memory]);
// `w` bytes a weight or gradient element.
std::vector<moment> moments_of(dp_strategy kind, double n, double bucket_mb, double w, bool exports,
                               double exported, const parameter_split& params,
                               const activation_split& a) {
  const double phi = static_cast<double>(params.total());
  const double rest = static_cast<double>(params.rest), layer = static_cast<double>(params.layer);
  const double arriving = w * static_cast<double>(params.largest);
  auto ring = [n, w](double elements) { return w * elements + w * elements / n; };
  const double stepped = kind == dp_strategy::ddp ? phi : phi / n; // elements AdamW steps
  const double chunk = std::min(stepped, double{1 << 20});
  // fp32: AdamW's denominator, or the norm's double chunk; bf16 steps a
  // chunk at a time (the widened gradient and the denominator).
  const double step = w == 4 ? std::max(4 * stepped, 8 * chunk) : 8 * chunk;
  std::vector<moment> out{{"the optimizer step", 0, step}};
  if (exports) // the copy, and zero3's largest unit whole (NOTE [export units])
    out.push_back({"the weight export", 0,
                   w * (exported > 0 ? exported : phi) +
                       (kind == dp_strategy::zero3 ? w * std::max(layer, rest) : 0)});
  switch (kind) {
  case dp_strategy::ddp:
    out.push_back({"the top of backward", a.total(), arriving});
    break;
  case dp_strategy::zero1:
    out.push_back({"the top of backward", a.total(), arriving});
    out.push_back({"the gradient reduce-scatter", 0, ring(phi)});
    break;
  case dp_strategy::zero2:
    out.push_back(
        {"the top of backward", a.total(),
         arriving + std::max(0.0, std::min(bucket_mb * 1024 * 1024, w * phi) - a.logits)});
    break;
  case dp_strategy::zero3: {
    const double inputs = static_cast<double>(a.layers) * a.layer_input;
    out.push_back({"the top of backward", inputs + a.rest, w * rest + arriving});
    out.push_back({"a layer's backward", inputs + a.layer + a.layer_backward,
                   w * rest + arriving + w * layer});
    out.push_back({"a layer's reduce-scatter", inputs + 2 * a.layer_input,
                   w * rest + arriving + 3 * w * layer + w * layer / n + ring(layer)});
    out.push_back({"the rest's reduce-scatter", 0, 3 * w * rest + w * rest / n + ring(rest)});
    break;
  }
  }
  return out;
}

} // namespace

rank_memory training_rank_memory(dp_strategy s, int64_t dp, double bucket_mb,
                                 const parameter_split& params, const activation_split& activations,
                                 precision p, bool exports, double exported) {
  const double phi = static_cast<double>(params.total());
  const bool sharded = dp > 1; // a zero strategy at dp 1 trains as ddp
  const double n = sharded ? static_cast<double>(dp) : 1.0;
  const auto kind = sharded ? s : dp_strategy::ddp;
  const double w = bytes_per_element(p);
  const double o = p == precision::fp32 ? 8 : 12; // AdamW's moments (+ the fp32 masters)
  rank_memory m;
  m.weights = kind == dp_strategy::zero3 ? w * phi / n : w * phi;
  m.gradients = kind == dp_strategy::ddp     ? w * phi
                : kind == dp_strategy::zero1 ? w * phi + w * phi / n
                                             : w * phi / n;
  m.optimizer = kind == dp_strategy::ddp ? o * phi : o * phi / n;
  const auto all = moments_of(kind, n, bucket_mb, w, exports, exported, params, activations);
  const auto& peak =
      *std::max_element(all.begin(), all.end(),
                        [](const moment& x, const moment& y) { return x.total() < y.total(); });
  m.moment = peak.name;
  m.activations = peak.activations;
  m.buffers = peak.buffers;
  return m;
}

std::vector<memory_term> rank_memory::terms() const {
  std::vector<memory_term> out;
  for (auto [name, bytes] : {std::pair<std::string, double>{"weights", weights},
                             {"gradients", gradients},
                             {"optimizer state", optimizer},
                             {"activations", activations},
                             {"buffers at " + std::string{moment}, buffers}})
    if (bytes > 0)
      out.push_back({std::move(name), bytes});
  std::stable_sort(out.begin(), out.end(),
                   [](const memory_term& a, const memory_term& b) { return a.bytes > b.bytes; });
  return out;
}

} // namespace troupe::actors::train
