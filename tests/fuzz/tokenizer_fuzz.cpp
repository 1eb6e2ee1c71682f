// Fuzz target: a Hugging Face tokenizer as a job loads it from the model's
// folder (models/tokenizer.hpp) — tokenizer.json, then tokenizer_config.json
// — and then the text it encodes: prompts and responses come from datasets
// and from the model itself. The input is three sections (fuzz_input.hpp):
// tokenizer.json, tokenizer_config.json (empty: none) and the text.
// Loading succeeds or answers an error; a loaded tokenizer encodes any text
// to ids inside its vocabulary, and decodes any ids (in range or not) to
// text or an error.
#include "models/chat_template.hpp"
#include "models/tokenizer.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>

using namespace troupe;

namespace {

void encode_and_decode(const models::hf_tokenizer& tok, const std::string& text) {
  const auto vocab = tok.vocab_size();
  for (bool special : {false, true}) {
    const auto ids = tok.encode(text, {.add_special_tokens = special});
    for (auto id : ids)
      if (id < 0 || id >= vocab)
        fuzz::broken();
    for (bool skip : {false, true})
      (void)tok.decode(ids, {.skip_special_tokens = skip});
  }
  (void)tok.pre_tokenize(text);
  // Ids as a peer could send them: every 4 bytes of the text, any value.
  std::vector<int64_t> raw;
  for (size_t i = 0; i + 4 <= text.size() && raw.size() < 256; i += 4) {
    int32_t v;
    std::memcpy(&v, text.data() + i, 4);
    raw.push_back(v % 2 == 0 ? v : v % (vocab + 2));
  }
  (void)tok.decode(raw);
  for (auto id : raw) {
    (void)tok.id_to_token(id);
    (void)tok.is_special(id);
  }
  (void)tok.token_to_id(text);
}

void render_chat(const models::hf_tokenizer& tok, const std::string& text) {
  auto chat = tok.chat();
  if (!chat)
    return;
  models::chat_render_request req;
  req.messages = nlohmann::ordered_json::array(
      {{{"role", "system"}, {"content", "Be brief."}},
       {{"role", "user"}, {"content", text}},
       {{"role", "assistant"}, {"content", text.substr(0, text.size() / 2)}}});
  req.add_generation_prompt = true;
  req.bos_token = tok.bos_text();
  req.eos_token = tok.eos_text();
  models::chat_template_limits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_loop_iterations = 100'000;
  (void)models::render_chat(**chat, req, limits);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto s = fuzz::sections_of(fuzz::text_of(data, size));
  auto tok = models::hf_tokenizer::from_json(s[0], "tokenizer.json");
  if (!tok)
    return 0;
  if (!fuzz::section(s, 1).empty() && !tok->apply_config(s[1], "tokenizer_config.json"))
    return 0;
  const auto& text = fuzz::section(s, 2);
  encode_and_decode(*tok, text);
  render_chat(*tok, text);
  return 0;
}
