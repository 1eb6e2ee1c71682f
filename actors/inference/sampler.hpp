#pragma once
// Token sampling for the inference engine: greedy, temperature, top-k, top-p,
// with a per-sequence random stream so a sequence draws the same tokens
// whatever else shares its batch, and the log-prob of each sampled token under
// the temperature-scaled distribution before truncation (PPO's old log-prob).

#include "runtime/error.hpp"
#include "runtime/wire_float.hpp"

#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace at {
class Tensor;
} // namespace at

namespace troupe::actors::inference {

/// Per-request sampling settings (field names follow vLLM's SamplingParams).
struct sampling_params {
  /// 0 = greedy (argmax; log-probs then use temperature 1).
  double temperature = 1.0;
  /// Keep the k most likely tokens; 0 = off.
  int64_t top_k = 0;
  /// Keep the smallest set of most likely tokens whose mass reaches top_p; 1 = off.
  double top_p = 1.0;
  /// Samples per prompt (a GRPO group).
  int32_t n = 1;
  /// Generated tokens per sample at most.
  int64_t max_tokens = 16;
  /// Generation stops after any of these (the stop token is kept in the output).
  std::vector<int64_t> stop_token_ids;
  /// Do not stop at the model's EOS tokens.
  bool ignore_eos = false;
  /// Seed of the sample streams; sample i of the request uses stream (seed, i).
  /// Unset: the engine draws one from its own seed sequence.
  std::optional<uint64_t> seed;
};

/// CAF serialisation (requests may cross processes); every field.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampling_params& x) {
  bool has_seed = x.seed.has_value();
  uint64_t seed = x.seed.value_or(0);
  auto load = caf::meta::load_callback([&]() -> caf::error {
    x.seed = has_seed ? std::optional<uint64_t>{seed} : std::nullopt;
    return caf::error{};
  });
  return f(caf::meta::type_name("sampling_params"), runtime::wire(x.temperature), x.top_k,
           runtime::wire(x.top_p), x.n, x.max_tokens, x.stop_token_ids, x.ignore_eos, has_seed,
           seed, load);
}

/// Checks ranges; the message names the field ("sampling.top_p: expected a
/// number in (0, 1], got 1.5"). `vocab_size` bounds stop token ids.
expected<void> validate(const sampling_params& p, int64_t vocab_size);

/// A small, fast, splittable random stream (xoroshiro128+ seeded by
/// splitmix64). Plain data: copy it to checkpoint it.
struct rng_stream {
  uint64_t s0 = 0;
  uint64_t s1 = 0;
  /// Stream `index` of `seed` (independent streams for the n samples).
  static rng_stream make(uint64_t seed, uint64_t index);
  /// Uniform double in [0, 1).
  double uniform();
};

struct sampled_token {
  int64_t token = 0;
  /// log softmax(logits / T)[token] (T = 1 for greedy), before top-k/top-p.
  float logprob = 0;
};

/// Samples one token per row of `logits` [R, V] (float32, CPU, contiguous),
/// row r with params[r] and stream streams[r] (advanced in place). Rows are
/// independent: the same row, params and stream give the same token in any
/// batch. Rows run in parallel, so each needs its own stream (a stream given
/// to two rows is refused).
expected<std::vector<sampled_token>> sample(const at::Tensor& logits,
                                            const std::vector<const sampling_params*>& params,
                                            const std::vector<rng_stream*>& streams);

} // namespace troupe::actors::inference
