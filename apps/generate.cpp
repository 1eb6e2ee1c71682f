#include "apps/generate.hpp"

#include "models/llama.hpp"
#include "models/tokenizer.hpp"
#include "runtime/compute.hpp"
#include "runtime/file_io.hpp"
#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>

namespace troupe::apps {

namespace {

using actors::inference::generate_request;

int fail(const caf::error& err) {
  std::fprintf(stderr, "troupe generate: %s\n", describe(err).c_str());
  return 1;
}

/// Tokenizer of the model directory: tokenizer.json when present, else bytes.
expected<std::unique_ptr<models::tokenizer>> model_tokenizer(const std::string& dir) {
  if (std::filesystem::exists(std::filesystem::path{dir} / "tokenizer.json"))
    return models::load_tokenizer(dir);
  return std::unique_ptr<models::tokenizer>(std::make_unique<models::byte_tokenizer>());
}

// The engine's counters on stderr after a run.
void print_metrics(const actors::inference::engine_metrics& m,
                   const actors::inference::engine_config& engine_config,
                   const models::llama_config& model, int64_t element_size) {
  std::fprintf(stderr,
               "generated %lld tokens for %lld requests in %.3f s: %.1f tokens/s, TTFT %.1f ms, "
               "ITL %.2f ms, prefill tokens %lld of %lld (prefix hit rate %.2f), "
               "preemptions %lld, KV blocks %lld (%.1f MiB), peak RSS %.1f MiB\n",
               static_cast<long long>(m.generated_tokens),
               static_cast<long long>(m.finished_requests), m.busy_seconds, m.tokens_per_second(),
               m.mean_ttft_ms(), m.mean_itl_ms(), static_cast<long long>(m.prefill_tokens_computed),
               static_cast<long long>(m.prompt_tokens), m.prefix_hit_rate,
               static_cast<long long>(m.preemptions), static_cast<long long>(m.num_blocks),
               static_cast<double>(m.num_blocks * actors::inference::kv_block_bytes(
                                                      engine_config, model, element_size)) /
                   (1 << 20),
               static_cast<double>(runtime::resident_set().peak) / (1 << 20));
  if (m.aten_decode_steps > 0) // NOTE [decode path report]
    std::fprintf(stderr, "decode steps: %lld fused, %lld on the ATen path (latest: %s)\n",
                 static_cast<long long>(m.fused_decode_steps),
                 static_cast<long long>(m.aten_decode_steps), m.aten_decode_reason.c_str());
}

} // namespace

int run_generate(const generate_options& o) {
  if (o.prompt.empty() == o.prompts_path.empty())
    return fail(make_error(errc::invalid_argument, "give exactly one of --prompt and --prompts"));
  auto model = models::load_pretrained(o.model_dir, models::head_kind::lm);
  if (!model)
    return fail(model.error());
  auto tok = model_tokenizer(o.model_dir);
  if (!tok)
    return fail(tok.error());
  if ((*tok)->vocab_size() > (*model)->config().vocab_size)
    return fail(make_error(errc::invalid_config,
                           o.model_dir + ": tokenizer has " + std::to_string((*tok)->vocab_size()) +
                             " tokens, the model only " +
                             std::to_string((*model)->config().vocab_size)));
  std::vector<generate_request> requests;
  std::set<std::string> ids;
  // Text prompts get the tokenizer's special tokens (its post-processor, or
  // add_bos_token / add_eos_token of tokenizer_config.json, as HF's
  // add_special_tokens does); prompt_ids are used exactly as given.
  auto encode = [&](const std::string& text) { return (*tok)->encode(text, {true}); };
  auto add = [&](std::string id, std::vector<int64_t> prompt) -> expected<void> {
    if (!ids.insert(id).second)
      return make_error(errc::invalid_argument, "duplicate id '" + id + "'");
    requests.push_back({std::move(id), std::move(prompt), o.sampling});
    return caf::unit;
  };
  if (!o.prompt.empty()) {
    add("0", encode(o.prompt));
  } else {
    auto n = runtime::read_jsonl(o.prompts_path, [&](const nlohmann::json& j) -> expected<void> {
      std::string id = std::to_string(requests.size());
      if (auto it = j.find("id"); it != j.end()) {
        if (!it->is_string() && !it->is_number_integer())
          return make_error(errc::invalid_argument, "field 'id': expected a string or integer");
        id = it->is_string() ? it->get<std::string>() : std::to_string(it->get<int64_t>());
      }
      if (auto it = j.find("prompt"); it != j.end()) {
        if (!it->is_string())
          return make_error(errc::invalid_argument, "field 'prompt': expected a string, got " +
                                                      std::string{it->type_name()});
        return add(id, encode(it->get<std::string>()));
      }
      if (auto it = j.find("prompt_ids"); it != j.end()) {
        std::vector<int64_t> p;
        if (!it->is_array())
          return make_error(errc::invalid_argument, "field 'prompt_ids': expected an array");
        for (const auto& x : *it) {
          if (!x.is_number_integer())
            return make_error(errc::invalid_argument,
                              "field 'prompt_ids': expected integers, got " + std::string{x.type_name()});
          p.push_back(x.get<int64_t>());
        }
        return add(id, std::move(p));
      }
      return make_error(errc::invalid_argument, "missing field 'prompt' (or 'prompt_ids')");
    });
    if (!n)
      return fail(n.error());
  }
  // The KV pool holds what these requests need at once (NOTE [kv pool size]).
  auto engine_config = o.engine;
  for (const auto& r : requests) {
    engine_config.expected_sequences += r.sampling.n;
    engine_config.expected_tokens = std::max(
        engine_config.expected_tokens, static_cast<int64_t>(r.prompt.size()) + r.sampling.max_tokens);
  }
  auto eng = actors::inference::engine::make(*model, engine_config);
  if (!eng)
    return fail(eng.error());
  // Validate every request up front so a bad one names itself before any work.
  for (auto& r : requests)
    if (auto ok = (*eng)->add_request(r); !ok)
      return fail(ok.error());
  auto outs = (*eng)->run_until_idle();
  if (!outs)
    return fail(outs.error());
  std::map<std::string, actors::inference::request_output> by_id;
  for (auto& out : *outs)
    by_id.emplace(out.id, std::move(out));
  std::string text;
  for (const auto& r : requests) {
    const auto& out = by_id.at(r.id);
    for (size_t i = 0; i < out.samples.size(); ++i) {
      const auto& s = out.samples[i];
      auto decoded = (*tok)->decode(s.tokens);
      nlohmann::json j;
      j["id"] = out.id;
      j["sample"] = i;
      j["text"] = decoded ? *decoded : std::string{};
      j["token_ids"] = s.tokens;
      j["logprobs"] = s.logprobs;
      j["finish_reason"] = s.finish_reason;
      j["weight_version"] = out.weight_version;
      text += j.dump() + "\n";
    }
  }
  if (o.output_path.empty()) {
    std::cout << text;
  } else if (auto ok = runtime::write_file_atomic(o.output_path, text); !ok) {
    return fail(ok.error());
  }
  if (o.print_metrics)
    print_metrics((*eng)->metrics(), engine_config, (*model)->config(),
                  (*model)->parameters().begin()->element_size());
  return 0;
}

} // namespace troupe::apps
