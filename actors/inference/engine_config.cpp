#include "actors/inference/engine.hpp"
#include "models/tensor_parallel.hpp"

#include <algorithm>

// The engine's settings and sizes, apart from the engine itself (no
// LibTorch here): `troupe plan`, the job loader and its fuzz target size
// the KV pool and check engine.* with these.
namespace troupe::actors::inference {

expected<void> validate(const engine_config& c) {
  std::vector<std::string> bad;
  if (c.block_size < 1 || c.block_size > 1024)
    bad.push_back("engine.block_size: expected an integer in [1, 1024], got " +
                  std::to_string(c.block_size));
  if (c.num_blocks < 0)
    bad.push_back("engine.num_blocks: expected an integer >= 0 (0 = from kv_cache_mb), got " +
                  std::to_string(c.num_blocks));
  if (c.num_blocks == 0 && !(c.kv_cache_mb > 0))
    bad.push_back("engine.kv_cache_mb: expected a positive number when num_blocks is 0");
  if (c.max_num_seqs < 1)
    bad.push_back("engine.max_num_seqs: expected an integer >= 1, got " +
                  std::to_string(c.max_num_seqs));
  if (c.max_batched_tokens < 1)
    bad.push_back("engine.max_batched_tokens: expected an integer >= 1, got " +
                  std::to_string(c.max_batched_tokens));
  if (c.max_model_len < 0)
    bad.push_back("engine.max_model_len: expected an integer >= 0 (0 = the model's), got " +
                  std::to_string(c.max_model_len));
  if (static_cast<size_t>(c.decode_panels) >= enum_count<panels_mode>())
    bad.push_back("engine.decode_panels: expected one of " + enum_name_list<panels_mode>() +
                  ", got " + std::to_string(static_cast<int>(c.decode_panels)));
  if (auto why = kernels::cpu::unsupported_why(c.decode_isa); !why.empty())
    bad.push_back("engine.decode_isa: " + why);
  if (auto err = make_error_list(errc::invalid_config, bad))
    return err;
  return caf::unit;
}

bool packs_decode_panels(const engine_config& c) {
  const auto batch =
      c.expected_sequences > 0 ? std::min(c.expected_sequences, c.max_num_seqs) : c.max_num_seqs;
  return kernels::cpu::wants_panels(c.decode_isa, batch, kernels::cpu::decode_path::automatic,
                                    c.decode_panels);
}

double engine_metrics::tokens_per_second() const {
  return busy_seconds > 0 ? static_cast<double>(generated_tokens) / busy_seconds : 0.0;
}

double engine_metrics::mean_ttft_ms() const {
  return finished_requests > 0 ? ttft_ms_sum / static_cast<double>(finished_requests) : 0.0;
}

double engine_metrics::mean_itl_ms() const {
  return itl_count > 0 ? itl_ms_sum / static_cast<double>(itl_count) : 0.0;
}

// ---- the KV pool's size ----------------------------------------------------------

int64_t kv_block_bytes(const engine_config& c, const models::llama_config& m,
                       int64_t element_size) {
  return 2 * m.num_hidden_layers * c.block_size * m.num_key_value_heads * m.resolved_head_dim() *
         element_size;
}

models::llama_config kv_pool_shape(const models::llama_config& model,
                                   const models::tp_partition& tp) {
  auto out = model;
  if (tp.active() && tp.kv_split)
    out.num_key_value_heads = tp.kv_heads;
  return out;
}

expected<int64_t> kv_pool_blocks(const engine_config& c, const models::llama_config& m,
                                 int64_t element_size) {
  if (c.num_blocks > 0)
    return c.num_blocks;
  auto block_bytes = kv_block_bytes(c, m, element_size);
  auto cap = static_cast<int64_t>(c.kv_cache_mb * 1024 * 1024) / block_bytes;
  if (cap < 1)
    return make_error(errc::invalid_config, "engine.kv_cache_mb: " + std::to_string(c.kv_cache_mb) +
                                                " MiB holds no block of " +
                                                std::to_string(block_bytes) + " bytes");
  auto context = c.max_model_len > 0 ? c.max_model_len : m.max_position_embeddings;
  auto blocks_of = [&](int64_t tokens) { return (tokens + c.block_size - 1) / c.block_size; };
  auto sequences =
      c.expected_sequences > 0 ? std::min(c.expected_sequences, c.max_num_seqs) : c.max_num_seqs;
  auto tokens = c.expected_tokens > 0 ? std::min(c.expected_tokens, context) : context;
  auto need = std::max(sequences * blocks_of(tokens), blocks_of(context));
  return std::min(need, cap);
}

} // namespace troupe::actors::inference
