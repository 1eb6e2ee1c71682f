// hf_tokenizer: a Hugging Face tokenizer.json pipeline
// (NOTE [tokenizer pipeline] in tokenizer_pipeline.hpp).

#include "models/tokenizer.hpp"

#include "models/chat_template.hpp"
#include "models/tokenizer_pipeline.hpp"
#include "models/tokenizer_unicode.hpp"
#include "runtime/file_io.hpp"
#include "runtime/jsonl.hpp"

namespace troupe::models {

using tok::json;
using tok::json_at;

struct hf_tokenizer::impl {
  std::string source;
  std::unique_ptr<tok::normalizer> normalizer;
  std::unique_ptr<tok::pre_tokenizer> pre_tokenizer;
  std::unique_ptr<tok::token_model> model;
  std::unique_ptr<tok::post_processor> post_processor;
  std::unique_ptr<tok::decoder> decoder;
  tok::added_vocabulary added;

  void parse(const json& root) {
    json_at top{root, ""};
    top.object();
    for (const char* key : {"truncation", "padding"})
      if (auto j = top.get(key, true); j && !j->value.is_null())
        j->fail("not supported (set it to null: troupe truncates and pads itself)",
                errc::unsupported);
    // Absent components are null, as in the reference.
    if (auto j = top.get("normalizer", true))
      normalizer = tok::normalizer_from_json(*j);
    if (auto j = top.get("pre_tokenizer", true))
      pre_tokenizer = tok::pre_tokenizer_from_json(*j);
    model = tok::model_from_json(*top.get("model"));
    if (auto j = top.get("post_processor", true))
      post_processor = tok::post_processor_from_json(*j);
    if (auto j = top.get("decoder", true))
      decoder = tok::decoder_from_json(*j);
    if (auto j = top.get("added_tokens", true); j && !j->value.is_null())
      added.parse(*j, *model, normalizer.get());
  }

  // Calls word(split) for every word of a text piece between added tokens,
  // added(id) for every added token, in order.
  template <class Word, class Added>
  void walk(std::string_view text, Word&& word, Added&& added_token) const {
    std::string valid;
    if (!unicode::is_valid_utf8(text)) {
      valid = unicode::to_valid_utf8(text);
      text = valid;
    }
    std::vector<tok::split> splits;
    for (const auto& p : added.cut(text, false)) {
      if (p.added != nullptr) {
        added_token(p.added->id);
        continue;
      }
      std::string piece{text.substr(p.begin, p.end - p.begin)};
      if (normalizer)
        normalizer->apply(piece);
      for (const auto& q : added.cut(piece, true)) {
        if (q.added != nullptr) {
          added_token(q.added->id);
          continue;
        }
        splits.clear();
        splits.push_back(tok::split{piece.substr(q.begin, q.end - q.begin), false,
                                    p.begin == 0 && q.begin == 0});
        if (pre_tokenizer)
          pre_tokenizer->apply(splits);
        for (const auto& s : splits)
          if (!s.text.empty())
            word(s);
      }
    }
  }

  int64_t vocab_size() const { return std::max(model->size(), added.max_id() + 1); }

  // The string decoding starts from: an added token's content (its
  // normalized form for a normalized token, as the reference does), else
  // the vocabulary's.
  const std::string* token_text(int64_t id) const {
    if (const auto* t = added.by_id(id))
      return t->normalized ? &t->normalized_content : &t->content;
    return model->id_to_token(id);
  }
};

namespace {

expected<json> parse_json_text(const std::string& text, const std::string& source_name) {
  if (auto at = runtime::json_too_deep_at(text); at != std::string_view::npos)
    return runtime::json_too_deep(source_name, at);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    return make_error(errc::parse_error, source_name + ": not valid JSON: " + e.what());
  }
}

// The token a tokenizer_config.json key names: "<s>", {"content": "<s>"}
// or null.
std::optional<std::string> config_token(const json_at& root, const char* key) {
  auto j = root.get(key, true);
  if (!j || j->value.is_null())
    return std::nullopt;
  if (j->value.is_object())
    return j->get("content")->string();
  return j->string();
}

} // namespace

hf_tokenizer::hf_tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
hf_tokenizer::hf_tokenizer(hf_tokenizer&&) noexcept = default;
hf_tokenizer& hf_tokenizer::operator=(hf_tokenizer&&) noexcept = default;
hf_tokenizer::~hf_tokenizer() = default;

expected<hf_tokenizer> hf_tokenizer::from_json(const std::string& json_text,
                                               const std::string& source_name) {
  auto root = parse_json_text(json_text, source_name);
  if (!root)
    return root.error();
  auto p = std::make_unique<impl>();
  p->source = source_name;
  try {
    p->parse(*root);
  } catch (const tok::json_failure& f) {
    return make_error(f.code, source_name + ": " + f.message);
  }
  return hf_tokenizer{std::move(p)};
}

expected<hf_tokenizer> hf_tokenizer::from_file(const std::string& path) {
  auto text = runtime::read_file(path, uint64_t{256} << 20);
  if (!text)
    return text.error();
  return from_json(*text, path);
}

namespace {

// What a tokenizer_config.json says (NOTE [tokenizer pipeline]).
struct tokenizer_config {
  special_token_ids ids;
  std::unique_ptr<tok::post_processor> affix; // set when add_bos / add_eos are given
  std::optional<int64_t> max_length;
  std::string bos_text, eos_text;
  std::optional<std::string> chat_source;
};

// chat_template: a string, or a list of {"name", "template"} (the one named
// "default").
std::optional<std::string> read_chat_template(const json_at& top) {
  auto t = top.get("chat_template", true);
  if (!t || t->value.is_null())
    return std::nullopt;
  if (t->value.is_string())
    return t->string();
  if (!t->value.is_array())
    t->fail("expected a template string or a list of {name, template}", errc::invalid_config);
  for (const auto& named : t->value)
    if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
        named["template"].is_string())
      return named["template"].get<std::string>();
  return std::nullopt;
}

// The role tokens, each of which must be a token of `tok`.
special_token_ids read_roles(const json_at& top, const tokenizer& tok) {
  auto role = [&](const char* key) -> std::optional<int64_t> {
    auto token = config_token(top, key);
    if (!token)
      return std::nullopt;
    auto id = tok.token_to_id(*token);
    if (!id)
      top.get(key)->fail("token '" + *token + "' is not in the vocabulary", errc::invalid_config);
    return id;
  };
  special_token_ids ids;
  ids.bos = role("bos_token");
  ids.eos = role("eos_token");
  ids.pad = role("pad_token");
  return ids;
}

// add_bos_token / add_eos_token decide the special tokens when either is
// given (transformers rebuilds the post-processor from them).
std::unique_ptr<tok::post_processor> read_affix(const json_at& top, const special_token_ids& ids) {
  auto add_bos = top.get("add_bos_token", true), add_eos = top.get("add_eos_token", true);
  if ((!add_bos || add_bos->value.is_null()) && (!add_eos || add_eos->value.is_null()))
    return nullptr;
  std::vector<int64_t> prefix, suffix;
  if (top.flag("add_bos_token", false)) {
    if (!ids.bos)
      add_bos->fail("true, but there is no bos_token", errc::invalid_config);
    prefix.push_back(*ids.bos);
  }
  if (top.flag("add_eos_token", false)) {
    if (!ids.eos)
      add_eos->fail("true, but there is no eos_token", errc::invalid_config);
    suffix.push_back(*ids.eos);
  }
  return tok::affix_post_processor(std::move(prefix), std::move(suffix));
}

// model_max_length: transformers writes 1e30 when a model has none.
std::optional<int64_t> read_max_length(const json_at& top) {
  auto m = top.get("model_max_length", true);
  if (!m || !m->value.is_number())
    return std::nullopt;
  double v = m->value.get<double>();
  if (v < 1)
    m->fail("expected a positive length, got " + m->value.dump(), errc::invalid_config);
  if (v > static_cast<double>(int64_t{1} << 40))
    return std::nullopt;
  return static_cast<int64_t>(v);
}

} // namespace

expected<void> hf_tokenizer::apply_config(const std::string& json_text,
                                          const std::string& source_name) {
  auto root = parse_json_text(json_text, source_name);
  if (!root)
    return root.error();
  tokenizer_config c;
  try {
    json_at top{*root, ""};
    top.object();
    c.ids = read_roles(top, *this);
    c.affix = read_affix(top, c.ids);
    c.max_length = read_max_length(top);
    c.bos_text = config_token(top, "bos_token").value_or("");
    c.eos_text = config_token(top, "eos_token").value_or("");
    c.chat_source = read_chat_template(top);
  } catch (const tok::json_failure& f) {
    return make_error(f.code, source_name + ": " + f.message);
  }
  bos_text_ = c.bos_text;
  eos_text_ = c.eos_text;
  if (c.chat_source) {
    auto t = chat_template::parse(*c.chat_source, source_name + " chat_template");
    if (t)
      chat_ = std::make_shared<const chat_template>(std::move(*t));
    else
      chat_missing_ = context_of(t.error());
  } else {
    chat_missing_ = source_name + " has no chat_template";
  }
  if (auto ok = set_special_ids(c.ids); !ok)
    return with_prefix(ok.error(), source_name);
  if (c.affix)
    impl_->post_processor = std::move(c.affix);
  model_max_length_ = c.max_length;
  return caf::unit;
}

std::vector<int64_t> hf_tokenizer::encode(std::string_view text, const encode_options& opts) const {
  std::vector<int64_t> ids;
  impl_->walk(
      text, [&](const tok::split& word) { impl_->model->tokenize(word, ids); },
      [&](int64_t id) { ids.push_back(id); });
  if (impl_->post_processor)
    impl_->post_processor->apply(ids, opts.add_special_tokens);
  return ids;
}

std::vector<std::string> hf_tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  impl_->walk(
      text,
      [&](const tok::split& word) {
        auto w = word;
        tok::materialise(w);
        out.push_back(std::move(w.text));
      },
      [](int64_t) {});
  return out;
}

expected<std::string> hf_tokenizer::decode(const std::vector<int64_t>& ids,
                                           const decode_options& opts) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto* text = impl_->token_text(ids[i]);
    if (text == nullptr)
      return make_error(errc::out_of_range, impl_->source + ": id " + std::to_string(ids[i]) +
                                                " at position " + std::to_string(i) +
                                                " is not a token (vocab size " +
                                                std::to_string(vocab_size()) + ")");
    if (opts.skip_special_tokens && impl_->added.is_special_content(*text))
      continue;
    tokens.push_back(*text);
  }
  std::string out;
  if (impl_->decoder) {
    impl_->decoder->apply(tokens);
    for (const auto& t : tokens)
      out += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i)
      out += (i > 0 ? " " : "") + tokens[i];
  }
  return unicode::to_valid_utf8(out);
}

int64_t hf_tokenizer::vocab_size() const {
  return impl_->vocab_size();
}

std::optional<int64_t> hf_tokenizer::token_to_id(std::string_view token) const {
  if (const auto* t = impl_->added.by_content(token))
    return t->id;
  return impl_->model->token_to_id(token);
}

bool hf_tokenizer::is_special(int64_t id) const {
  const auto* t = impl_->added.by_id(id);
  return t != nullptr && t->special;
}

std::optional<std::string> hf_tokenizer::id_to_token(int64_t id) const {
  if (const auto* t = impl_->added.by_id(id))
    return t->content;
  if (const auto* s = impl_->model->id_to_token(id))
    return *s;
  return std::nullopt;
}

} // namespace troupe::models
