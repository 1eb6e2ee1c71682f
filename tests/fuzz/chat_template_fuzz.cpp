// Fuzz target: the chat-template renderer (models/chat_template.hpp) — a
// Jinja template from a model's tokenizer_config.json, which anyone who
// publishes a model writes, rendered with a conversation from a dataset.
// The input is the template, then optionally (fuzz_input.hpp) the messages
// as JSON and further variables as a JSON object. Parsing and rendering
// succeed or answer an error, within the render limits: no crash, no
// unbounded output, loop or recursion.
#include "models/chat_template.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>

using namespace troupe;

namespace {

nlohmann::ordered_json json_or(const std::string& text, nlohmann::ordered_json fallback) {
  auto j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded())
    return fallback;
  return j;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto s = fuzz::sections_of(fuzz::text_of(data, size));
  auto t = models::chat_template::parse(s[0], "chat_template");
  if (!t)
    return 0;
  models::chat_render_request req;
  req.messages =
      json_or(fuzz::section(s, 1),
              nlohmann::ordered_json::array({{{"role", "system"}, {"content", "You are terse."}},
                                             {{"role", "user"}, {"content", "What is 2+2?"}},
                                             {{"role", "assistant"}, {"content", "4"}},
                                             {{"role", "user"}, {"content", "And 3+3?"}}}));
  auto extra = json_or(fuzz::section(s, 2), nlohmann::ordered_json::object());
  if (extra.is_object())
    req.extra = std::move(extra);
  req.bos_token = "<s>";
  req.eos_token = "</s>";
  models::chat_template_limits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_loop_iterations = 100'000;
  for (bool generation : {false, true}) {
    req.add_generation_prompt = generation;
    auto out = models::render_chat(*t, req, limits);
    if (out && out->size() > limits.max_output_bytes)
      fuzz::broken();
  }
  return 0;
}
