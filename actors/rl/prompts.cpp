#include "actors/rl/data.hpp"

#include "actors/rl/datasets.hpp"
#include "models/chat_template.hpp"
#include "models/tokenizer.hpp"

#include <algorithm>
#include <optional>

// Rows to token ids: the prompt encoder (plain text, or a conversation
// through the model's chat template) and the data checks that need the
// tokenizer. The rows themselves are read in data.cpp; collate.cpp packs
// the ids into tensors.
namespace troupe::actors::rl {

std::vector<int64_t> encode_prompt(const models::tokenizer& tok, const std::string& prompt) {
  std::vector<int64_t> out;
  if (auto bos = tok.bos_id())
    out.push_back(*bos);
  auto ids = tok.encode(prompt);
  out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

prompt_encoder::prompt_encoder(std::shared_ptr<const models::tokenizer> tok,
                               bool template_plain_prompts)
    : tok_(std::move(tok)), template_plain_(template_plain_prompts) {}

expected<std::string> prompt_encoder::render(const std::string& messages,
                                             bool add_generation_prompt) const {
  auto parsed = nlohmann::ordered_json::parse(messages, nullptr, false);
  if (parsed.is_discarded())
    return make_error(errc::parse_error, "a conversation's messages are not valid JSON");
  return render(parsed, add_generation_prompt, nullptr);
}

expected<std::string> prompt_encoder::render(const nlohmann::ordered_json& messages,
                                             bool add_generation_prompt,
                                             const nlohmann::ordered_json& tools) const {
  auto chat = tok_->chat();
  if (!chat)
    return with_prefix(chat.error(), "a conversation needs the model's chat template");
  models::chat_render_request req;
  req.messages = messages;
  if (!tools.is_null() && !tools.empty())
    req.tools = tools;
  req.add_generation_prompt = add_generation_prompt;
  req.bos_token = tok_->bos_text();
  req.eos_token = tok_->eos_text();
  return models::render_chat(**chat, req);
}

expected<std::vector<int64_t>> prompt_encoder::prompt(const std::string& text,
                                                      const std::string& messages) const {
  if (messages.empty() && !template_plain_)
    return encode_prompt(*tok_, text);
  std::string conversation = messages;
  if (conversation.empty())
    conversation = nlohmann::ordered_json::array({{{"role", "user"}, {"content", text}}}).dump();
  auto rendered = render(conversation, true);
  if (!rendered)
    return rendered.error();
  return tok_->encode(*rendered);
}

expected<std::optional<prompt_encoder::divergence>>
prompt_encoder::divergence_of(const std::string& messages) const {
  auto all = nlohmann::ordered_json::parse(messages, nullptr, false);
  if (all.is_discarded() || !all.is_array())
    return make_error(errc::parse_error, "a conversation's messages are not a JSON list");
  auto first_n = [&](size_t n) {
    return nlohmann::ordered_json(
               std::vector<nlohmann::ordered_json>(all.begin(), all.begin() + static_cast<long>(n)))
        .dump();
  };
  auto excerpt = [](const std::string& s, size_t at) { return s.substr(at, 24); };
  // The last step's longer render, the next one's shorter unless the
  // next message is the assistant's (then rendered with the generation prompt).
  std::optional<std::string> last;
  for (size_t k = 1; k < all.size(); ++k) {
    const bool answer = all[k].is_object() && all[k].value("role", "") == "assistant";
    auto before = last && !answer ? expected<std::string>{*last} : render(first_n(k), answer);
    if (!before)
      return before.error();
    auto after = render(first_n(k + 1), false);
    if (!after)
      return after.error();
    if (after->compare(0, before->size(), *before) == 0) {
      last = std::move(*after);
      continue;
    }
    size_t byte = 0;
    while (byte < before->size() && byte < after->size() && (*before)[byte] == (*after)[byte])
      ++byte;
    return std::optional<divergence>{
        divergence{k, byte, excerpt(*before, byte), excerpt(*after, byte)}};
  }
  return std::optional<divergence>{};
}

namespace {

// The first kPrefixCheckRows rows of a table.
template <class Row>
expected<std::vector<Row>> leading_rows(const row_table<Row>& t) {
  std::vector<int64_t> idx(static_cast<size_t>(std::min<int64_t>(t.size(), kPrefixCheckRows)));
  std::iota(idx.begin(), idx.end(), int64_t{0});
  return t.rows(idx);
}

std::string conversation_of(const example& r) {
  return r.messages;
}
std::string conversation_of(const demonstration& r) {
  if (r.messages.empty())
    return {};
  auto all = nlohmann::ordered_json::parse(r.messages, nullptr, false);
  if (all.is_discarded() || !all.is_array())
    return r.messages;
  all.push_back({{"role", "assistant"}, {"content", r.response}});
  return all.dump();
}

template <class Row>
expected<void> check_rows(const prompt_encoder& enc, const std::string& key,
                          const std::vector<Row>& rows, prefix_report& out) {
  for (size_t i = 0; i < rows.size(); ++i) {
    auto conversation = conversation_of(rows[i]);
    if (conversation.empty())
      continue;
    ++out.checked;
    auto d = enc.divergence_of(conversation);
    if (!d)
      return with_prefix(d.error(), key + " row " + std::to_string(i + 1));
    if (!*d)
      continue;
    if (out.divergent++ == 0) {
      auto all = nlohmann::ordered_json::parse(conversation);
      out.first = key + " row " + std::to_string(i + 1) + ": turn " + std::to_string((*d)->turn) +
                  " (" + all[(*d)->turn].value("role", "?") + ") rewrites earlier text from byte " +
                  std::to_string((*d)->byte) + ": " + nlohmann::json((*d)->before).dump() +
                  " became " + nlohmann::json((*d)->after).dump();
    }
  }
  return {};
}

} // namespace

expected<prefix_report> check_prefixes(const prompt_encoder& enc, const data_config& c,
                                       const job_data& d) {
  prefix_report out;
  auto train = leading_rows(d.train);
  if (!train)
    return train.error();
  if (auto ok = check_rows(enc, c.train_file.empty() ? "data" : "data.train_file", *train, out);
      !ok)
    return ok.error();
  std::vector<example> eval(d.eval.begin(),
                            d.eval.begin() +
                                std::min<long>(static_cast<long>(d.eval.size()), kPrefixCheckRows));
  if (auto ok = check_rows(enc, "data.eval_file", eval, out); !ok)
    return ok.error();
  if (!c.sft_file.empty()) {
    auto sft = leading_rows(d.sft);
    if (!sft)
      return sft.error();
    if (auto ok = check_rows(enc, "data.sft_file", *sft, out); !ok)
      return ok.error();
  }
  return out;
}

std::vector<int64_t> prompt_encoder::response(const std::string& text) const {
  return encode_response(*tok_, text);
}

std::vector<int64_t> encode_response(const models::tokenizer& tok, const std::string& response) {
  auto out = tok.encode(response);
  if (auto eos = tok.eos_id())
    out.push_back(*eos);
  return out;
}

} // namespace troupe::actors::rl
