// bpe_tokenizer: byte-level BPE from Hugging Face tokenizer.json files.

#include "models/tokenizer.hpp"
#include "models/tokenizer_split.hpp"
#include "models/tokenizer_unicode.hpp"
#include "runtime/file_io.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <mutex>
#include <queue>
#include <unordered_map>

namespace troupe::models {

namespace {

using json = nlohmann::json;

// GPT-2's bytes_to_unicode: printable Latin-1 bytes ('!'..'~', '¡'..'¬',
// '®'..'ÿ') stand for themselves; every other byte b gets 256 + n, n counting
// those bytes in increasing order.
std::array<char32_t, 256> byte_to_code_point() {
  std::array<char32_t, 256> out{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    out[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return out;
}

const char* type_of(const json& j) {
  if (j.is_number_integer())
    return "integer";
  if (j.is_number_float())
    return "number";
  return j.type_name();
}

constexpr size_t cache_limit = 100'000;

} // namespace

struct bpe_tokenizer::impl {
  struct added_token {
    std::string content;
    int64_t id = 0;
    bool special = false;
    bool lstrip = false;
    bool rstrip = false;
    bool single_word = false;
  };
  struct merge_rule {
    int32_t rank;
    int64_t merged;
  };

  std::string source;
  std::unordered_map<std::string, int64_t> vocab; // model.vocab
  std::unordered_map<std::string, int64_t> added_by_content;
  std::vector<std::string> id_text;  // stored token text ("" for holes)
  std::vector<std::string> id_bytes; // decoded bytes of each id
  std::vector<uint8_t> id_kind;      // 0 = no token, 1 = vocab, 2 = added
  std::vector<uint8_t> id_special;
  std::vector<added_token> added;
  std::array<std::vector<size_t>, 256> added_by_first_byte; // longest first
  std::array<int64_t, 256> byte_id{};
  std::array<std::string, 256> byte_symbol;
  std::unordered_map<uint64_t, merge_rule> merges;
  bool ignore_merges = false;
  bool nfc = false;
  bool add_prefix_space = false;
  std::optional<split_pattern> split; // nullopt: one piece per segment

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache;

  caf::error fail(errc code, const std::string& where, const std::string& what) const {
    return make_error(code, source + ": " + where + ": " + what);
  }

  // ---- parsing ---------------------------------------------------------------

  expected<void> parse(const json& root);
  expected<void> parse_model(const json& model);
  expected<void> parse_added_tokens(const json& list);
  expected<void> parse_normalizer(const json& n, const std::string& where);
  expected<void> parse_pre_tokenizer(const json& p);
  expected<void> parse_byte_level(const json& p, const std::string& where, bool in_sequence);
  expected<void> parse_decoder(const json& d);
  expected<void> build_tables(const json& merges_json);

  // ---- encoding --------------------------------------------------------------

  void encode_segment(std::string_view text, std::vector<int64_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int64_t>& out) const;
  std::vector<int64_t> merge_piece(std::string_view piece) const;
  bool single_word_ok(std::string_view text, size_t begin, size_t end) const;

  template <class F>
  void for_each_segment(std::string_view text, F&& f) const;
};

// ---- parsing -------------------------------------------------------------------

expected<void> bpe_tokenizer::impl::parse(const json& root) {
  if (!root.is_object())
    return make_error(errc::parse_error, source + ": expected a JSON object, got " + type_of(root));
  auto model = root.find("model");
  if (model == root.end())
    return make_error(errc::parse_error, source + ": missing key 'model'");
  if (auto ok = parse_model(*model); !ok)
    return ok;
  if (auto it = root.find("added_tokens"); it != root.end() && !it->is_null())
    if (auto ok = parse_added_tokens(*it); !ok)
      return ok;
  if (auto it = root.find("normalizer"); it != root.end())
    if (auto ok = parse_normalizer(*it, "normalizer"); !ok)
      return ok;
  auto pre = root.find("pre_tokenizer");
  if (pre == root.end())
    return make_error(errc::parse_error, source + ": missing key 'pre_tokenizer'");
  if (auto ok = parse_pre_tokenizer(*pre); !ok)
    return ok;
  if (auto it = root.find("decoder"); it != root.end())
    if (auto ok = parse_decoder(*it); !ok)
      return ok;
  return build_tables(model->at("merges"));
}

expected<void> bpe_tokenizer::impl::parse_model(const json& m) {
  if (!m.is_object())
    return fail(errc::parse_error, "model", std::string{"expected an object, got "} + type_of(m));
  if (auto t = m.find("type"); t != m.end()) {
    if (!t->is_string())
      return fail(errc::parse_error, "model.type",
                  std::string{"expected a string, got "} + type_of(*t));
    if (*t != "BPE")
      return fail(errc::unsupported, "model.type",
                  "'" + t->get<std::string>() + "' is not supported (supported: BPE)");
  }
  if (auto d = m.find("dropout"); d != m.end() && !d->is_null())
    return fail(errc::unsupported, "model.dropout", "BPE dropout is not supported");
  if (auto b = m.find("byte_fallback"); b != m.end() && b->is_boolean() && b->get<bool>())
    return fail(
        errc::unsupported, "model.byte_fallback",
        "SentencePiece-style BPE with byte fallback is not supported (only byte-level BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto s = m.find(key); s != m.end() && !s->is_null() &&
                              !(s->is_string() && s->get_ref<const std::string&>().empty()))
      return fail(errc::unsupported, std::string{"model."} + key,
                  "subword affixes are not supported");
  if (auto im = m.find("ignore_merges"); im != m.end() && !im->is_null()) {
    if (!im->is_boolean())
      return fail(errc::parse_error, "model.ignore_merges",
                  std::string{"expected a boolean, got "} + type_of(*im));
    ignore_merges = im->get<bool>();
  }
  auto v = m.find("vocab");
  if (v == m.end())
    return fail(errc::parse_error, "model", "missing key 'vocab'");
  if (!v->is_object())
    return fail(errc::parse_error, "model.vocab",
                std::string{"expected an object, got "} + type_of(*v));
  vocab.reserve(v->size());
  for (const auto& [token, id] : v->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max() ||
        (id.is_number_unsigned() && id.get<uint64_t>() > uint64_t{1} << 31))
      return fail(errc::parse_error, "model.vocab." + token,
                  "expected a non-negative 32-bit integer id, got " + id.dump());
    vocab.emplace(token, id.get<int64_t>());
  }
  auto merges_it = m.find("merges");
  if (merges_it == m.end())
    return fail(errc::parse_error, "model", "missing key 'merges'");
  if (!merges_it->is_array())
    return fail(errc::parse_error, "model.merges",
                std::string{"expected an array, got "} + type_of(*merges_it));
  return caf::unit;
}

expected<void> bpe_tokenizer::impl::parse_added_tokens(const json& list) {
  if (!list.is_array())
    return fail(errc::parse_error, "added_tokens",
                std::string{"expected an array, got "} + type_of(list));
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& e = list[i];
    auto where = "added_tokens[" + std::to_string(i) + "]";
    if (!e.is_object())
      return fail(errc::parse_error, where, std::string{"expected an object, got "} + type_of(e));
    added_token t;
    auto id = e.find("id");
    if (id == e.end() || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() > std::numeric_limits<int32_t>::max())
      return fail(errc::parse_error, where + ".id",
                  "expected a non-negative 32-bit integer, got " +
                      (id == e.end() ? std::string{"nothing"} : id->dump()));
    t.id = id->get<int64_t>();
    auto content = e.find("content");
    if (content == e.end() || !content->is_string())
      return fail(errc::parse_error, where + ".content",
                  std::string{"expected a string, got "} +
                      (content == e.end() ? "nothing" : type_of(*content)));
    t.content = content->get<std::string>();
    if (t.content.empty())
      return fail(errc::parse_error, where + ".content", "must not be empty");
    for (auto [key, slot] :
         {std::pair{"special", &t.special}, std::pair{"lstrip", &t.lstrip},
          std::pair{"rstrip", &t.rstrip}, std::pair{"single_word", &t.single_word}}) {
      auto it = e.find(key);
      if (it == e.end() || it->is_null())
        continue;
      if (!it->is_boolean())
        return fail(errc::parse_error, where + "." + key,
                    std::string{"expected a boolean, got "} + type_of(*it));
      *slot = it->get<bool>();
    }
    added.push_back(std::move(t));
  }
  return caf::unit;
}

expected<void> bpe_tokenizer::impl::parse_normalizer(const json& n, const std::string& where) {
  if (n.is_null())
    return caf::unit;
  if (!n.is_object() || !n.contains("type") || !n["type"].is_string())
    return fail(errc::parse_error, where, "expected null or an object with a string 'type'");
  auto type = n["type"].get<std::string>();
  if (type == "NFC") {
    nfc = true;
    return caf::unit;
  }
  if (type == "Sequence") {
    auto list = n.find("normalizers");
    if (list == n.end() || !list->is_array())
      return fail(errc::parse_error, where + ".normalizers", "expected an array");
    for (size_t i = 0; i < list->size(); ++i)
      if (auto ok = parse_normalizer((*list)[i], where + ".normalizers[" + std::to_string(i) + "]");
          !ok)
        return ok;
    return caf::unit;
  }
  return fail(errc::unsupported, where + ".type",
              "normalizer '" + type + "' is not supported (supported: NFC)");
}

expected<void> bpe_tokenizer::impl::parse_byte_level(const json& p, const std::string& where,
                                                     bool in_sequence) {
  bool use_regex = true;
  for (auto [key, slot] :
       {std::pair{"add_prefix_space", &add_prefix_space}, std::pair{"use_regex", &use_regex}}) {
    auto it = p.find(key);
    if (it == p.end() || it->is_null())
      continue;
    if (!it->is_boolean())
      return fail(errc::parse_error, where + "." + key,
                  std::string{"expected a boolean, got "} + type_of(*it));
    *slot = it->get<bool>();
  }
  if (in_sequence) {
    if (use_regex)
      return fail(errc::unsupported, where + ".use_regex",
                  "a ByteLevel regex after a Split is not supported");
    if (add_prefix_space)
      return fail(errc::unsupported, where + ".add_prefix_space",
                  "add_prefix_space after a Split is not supported");
    return caf::unit;
  }
  if (use_regex)
    split = split_pattern::gpt2;
  return caf::unit;
}

expected<void> bpe_tokenizer::impl::parse_pre_tokenizer(const json& p) {
  const std::string where = "pre_tokenizer";
  if (p.is_null())
    return fail(errc::unsupported, where, "null; byte-level BPE needs a ByteLevel pre-tokenizer");
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
    return fail(errc::parse_error, where, "expected an object with a string 'type'");
  auto type = p["type"].get<std::string>();
  if (type == "ByteLevel")
    return parse_byte_level(p, where, false);
  if (type != "Sequence")
    return fail(errc::unsupported, where + ".type",
                "pre-tokenizer '" + type +
                    "' is not supported (supported: ByteLevel, "
                    "Sequence[Split, ByteLevel])");
  auto list = p.find("pretokenizers");
  if (list == p.end() || !list->is_array())
    return fail(errc::parse_error, where + ".pretokenizers", "expected an array");
  auto item_type = [&](size_t i) -> std::string {
    const auto& e = (*list)[i];
    if (e.is_object() && e.contains("type") && e["type"].is_string())
      return e["type"].get<std::string>();
    return {};
  };
  for (size_t i = 0; i < list->size(); ++i)
    if (item_type(i).empty())
      return fail(errc::parse_error, where + ".pretokenizers[" + std::to_string(i) + "]",
                  "expected an object with a string 'type'");
  if (list->size() == 1 && item_type(0) == "ByteLevel")
    return parse_byte_level((*list)[0], where + ".pretokenizers[0]", false);
  if (list->size() != 2 || item_type(0) != "Split" || item_type(1) != "ByteLevel")
    return fail(errc::unsupported, where + ".pretokenizers",
                "only [ByteLevel] or [Split, ByteLevel] sequences are supported");
  const auto& s = (*list)[0];
  auto sw = where + ".pretokenizers[0]";
  auto pattern = s.find("pattern");
  if (pattern == s.end() || !pattern->is_object())
    return fail(errc::parse_error, sw + ".pattern", "expected an object {\"Regex\": ...}");
  auto regex = pattern->find("Regex");
  if (regex == pattern->end() || !regex->is_string())
    return fail(errc::unsupported, sw + ".pattern",
                "only {\"Regex\": string} patterns are supported");
  auto known = recognise_split_pattern(regex->get<std::string>());
  if (!known)
    return fail(errc::unsupported, sw + ".pattern.Regex",
                "unknown split pattern '" + regex->get<std::string>() +
                    "' (supported: the GPT-2, Llama 3 and Qwen2 patterns)");
  auto behavior = s.find("behavior");
  if (behavior != s.end() && *behavior != "Isolated")
    return fail(errc::unsupported, sw + ".behavior",
                "only 'Isolated' is supported, got " + behavior->dump());
  auto invert = s.find("invert");
  if (invert != s.end() && *invert != false)
    return fail(errc::unsupported, sw + ".invert", "only false is supported");
  split = *known;
  return parse_byte_level((*list)[1], where + ".pretokenizers[1]", true);
}

expected<void> bpe_tokenizer::impl::parse_decoder(const json& d) {
  if (d.is_null())
    return caf::unit;
  if (!d.is_object() || !d.contains("type") || !d["type"].is_string())
    return fail(errc::parse_error, "decoder", "expected null or an object with a string 'type'");
  auto type = d["type"].get<std::string>();
  if (type != "ByteLevel")
    return fail(errc::unsupported, "decoder.type",
                "decoder '" + type + "' is not supported (supported: ByteLevel)");
  return caf::unit;
}

expected<void> bpe_tokenizer::impl::build_tables(const json& merges_json) {
  // Id space; reject absurdly sparse ids so a hostile file cannot make us
  // allocate gigabytes.
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab)
    max_id = std::max(max_id, id);
  for (const auto& t : added)
    max_id = std::max(max_id, t.id);
  auto entries = static_cast<int64_t>(vocab.size() + added.size());
  if (max_id >= 2 * entries + 1024)
    return fail(errc::parse_error, "model.vocab",
                "id " + std::to_string(max_id) + " is far beyond the " + std::to_string(entries) +
                    " tokens (sparse vocabularies are not supported)");
  auto size = static_cast<size_t>(max_id + 1);
  id_text.assign(size, {});
  id_bytes.assign(size, {});
  id_kind.assign(size, 0);
  id_special.assign(size, 0);

  auto to_cp = byte_to_code_point();
  std::unordered_map<char32_t, uint8_t> cp_to_byte;
  for (int b = 0; b < 256; ++b) {
    unicode::append_utf8(byte_symbol[b], to_cp[b]);
    cp_to_byte.emplace(to_cp[b], static_cast<uint8_t>(b));
  }
  for (const auto& [token, id] : vocab) {
    if (id_kind[id] != 0)
      return fail(errc::parse_error, "model.vocab." + token,
                  "id " + std::to_string(id) + " is also the id of '" + id_text[id] + "'");
    id_kind[id] = 1;
    id_text[id] = token;
    // ByteLevel decoding; a token with a character outside the byte map
    // decodes to its own UTF-8 text (as HF does).
    std::string bytes;
    bool mapped = true;
    for (const auto& u : unicode::decode_utf8(token)) {
      auto it = u.valid ? cp_to_byte.find(u.cp) : cp_to_byte.end();
      if (it == cp_to_byte.end()) {
        mapped = false;
        break;
      }
      bytes += static_cast<char>(it->second);
    }
    id_bytes[id] = mapped ? std::move(bytes) : token;
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const auto& t = added[i];
    id_kind[t.id] = 2;
    id_text[t.id] = t.content;
    id_bytes[t.id] = t.content;
    id_special[t.id] = t.special ? 1 : 0;
    added_by_content[t.content] = t.id;
    added_by_first_byte[static_cast<unsigned char>(t.content[0])].push_back(i);
  }
  for (auto& list : added_by_first_byte)
    std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
      return added[a].content.size() > added[b].content.size();
    });
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(byte_symbol[b]);
    if (it == vocab.end()) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", b);
      return fail(errc::parse_error, "model.vocab",
                  "missing the byte-level symbol '" + byte_symbol[b] + "' of byte " + hex +
                      " (not a byte-level BPE vocabulary?)");
    }
    byte_id[b] = it->second;
  }

  merges.reserve(merges_json.size());
  for (size_t i = 0; i < merges_json.size(); ++i) {
    const auto& e = merges_json[i];
    auto where = "model.merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (e.is_string()) {
      const auto& s = e.get_ref<const std::string&>();
      auto sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return fail(errc::parse_error, where,
                    "expected two tokens separated by one space, got '" + s + "'");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return fail(errc::parse_error, where, "expected a string or a pair, got " + e.dump());
    }
    auto ia = vocab.find(a), ib = vocab.find(b), ic = vocab.find(a + b);
    for (auto [it, tok] : {std::pair{ia, &a}, std::pair{ib, &b}})
      if (it == vocab.end())
        return fail(errc::parse_error, where, "token '" + *tok + "' is not in model.vocab");
    if (ic == vocab.end())
      return fail(errc::parse_error, where, "merged token '" + a + b + "' is not in model.vocab");
    auto key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint64_t>(ib->second);
    merges.emplace(key, merge_rule{static_cast<int32_t>(i), ic->second}); // first rank wins
  }
  return caf::unit;
}

// ---- encoding ------------------------------------------------------------------

namespace {

bool ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

bool word_char(std::string_view s) {
  auto units = unicode::decode_utf8(s);
  if (units.empty() || !units.front().valid)
    return false;
  auto cp = units.front().cp;
  return cp == '_' || unicode::is_letter(cp) || unicode::is_number(cp);
}

} // namespace

bool bpe_tokenizer::impl::single_word_ok(std::string_view text, size_t begin, size_t end) const {
  if (end < text.size() && word_char(text.substr(end, 4)))
    return false;
  if (begin > 0) {
    size_t p = begin - 1;
    while (p > 0 && begin - p < 4 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80)
      --p;
    if (word_char(text.substr(p, begin - p)))
      return false;
  }
  return true;
}

// Calls f(segment_text, added_id): for plain text added_id is -1.
template <class F>
void bpe_tokenizer::impl::for_each_segment(std::string_view text, F&& f) const {
  size_t seg = 0;
  size_t pos = 0;
  const size_t n = text.size();
  while (pos < n) {
    const added_token* hit = nullptr;
    for (size_t idx : added_by_first_byte[static_cast<unsigned char>(text[pos])]) {
      const auto& t = added[idx];
      if (text.compare(pos, t.content.size(), t.content) == 0 &&
          (!t.single_word || single_word_ok(text, pos, pos + t.content.size()))) {
        hit = &t;
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + hit->content.size();
    if (hit->lstrip)
      while (begin > seg && ascii_space(text[begin - 1]))
        --begin;
    if (hit->rstrip)
      while (end < n && ascii_space(text[end]))
        ++end;
    if (begin > seg)
      f(text.substr(seg, begin - seg), int64_t{-1});
    f(std::string_view{}, hit->id);
    seg = pos = end;
  }
  if (seg < n)
    f(text.substr(seg), int64_t{-1});
}

void bpe_tokenizer::impl::encode_segment(std::string_view text, std::vector<int64_t>& out) const {
  std::string buf;
  if (nfc) {
    buf = unicode::nfc(text);
    text = buf;
  }
  if (add_prefix_space && !text.empty() && text.front() != ' ') {
    buf = " " + std::string{text};
    text = buf;
  }
  if (!split) {
    encode_piece(text, out);
    return;
  }
  for (auto [b, e] : split_text(text, *split))
    encode_piece(text.substr(b, e - b), out);
}

void bpe_tokenizer::impl::encode_piece(std::string_view piece, std::vector<int64_t>& out) const {
  if (piece.empty())
    return;
  std::string key{piece};
  {
    std::lock_guard<std::mutex> guard{cache_mutex};
    if (auto it = cache.find(key); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  auto ids = merge_piece(piece);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> guard{cache_mutex};
  if (cache.size() >= cache_limit)
    cache.clear();
  cache.emplace(std::move(key), std::move(ids));
}

// NOTE [bpe merge order]: repeatedly merge the adjacent pair with the lowest
// merge rank, leftmost first among equal ranks (HF tokenizers' order), using
// a heap of candidate pairs over a linked list of symbols: O(n log n).
std::vector<int64_t> bpe_tokenizer::impl::merge_piece(std::string_view piece) const {
  if (ignore_merges) {
    std::string mapped;
    for (unsigned char b : piece)
      mapped += byte_symbol[b];
    if (auto it = vocab.find(mapped); it != vocab.end())
      return {it->second};
  }
  struct symbol {
    int64_t id;
    int prev;
    int next;
    bool alive;
  };
  const int n = static_cast<int>(piece.size());
  std::vector<symbol> syms(n);
  for (int i = 0; i < n; ++i)
    syms[i] = {byte_id[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1, true};
  struct candidate {
    int32_t rank;
    int pos;
    bool operator>(const candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<candidate, std::vector<candidate>, std::greater<>> heap;
  auto rule_of = [&](int left) -> const merge_rule* {
    int right = syms[left].next;
    if (right < 0)
      return nullptr;
    auto key = (static_cast<uint64_t>(syms[left].id) << 32) | static_cast<uint64_t>(syms[right].id);
    auto it = merges.find(key);
    return it == merges.end() ? nullptr : &it->second;
  };
  auto push = [&](int left) {
    if (left < 0)
      return;
    if (const auto* r = rule_of(left))
      heap.push({r->rank, left});
  };
  for (int i = 0; i + 1 < n; ++i)
    push(i);
  while (!heap.empty()) {
    auto top = heap.top();
    heap.pop();
    if (!syms[top.pos].alive)
      continue;
    const auto* r = rule_of(top.pos);
    if (r == nullptr || r->rank != top.rank)
      continue; // stale: a neighbour merged since this pair was queued
    int right = syms[top.pos].next;
    syms[top.pos].id = r->merged;
    syms[top.pos].next = syms[right].next;
    syms[right].alive = false;
    if (syms[right].next >= 0)
      syms[syms[right].next].prev = top.pos;
    push(syms[top.pos].prev);
    push(top.pos);
  }
  std::vector<int64_t> out;
  for (int i = n > 0 ? 0 : -1; i >= 0; i = syms[i].next)
    out.push_back(syms[i].id);
  return out;
}

// ---- bpe_tokenizer ---------------------------------------------------------------

bpe_tokenizer::bpe_tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
bpe_tokenizer::bpe_tokenizer(bpe_tokenizer&&) noexcept = default;
bpe_tokenizer& bpe_tokenizer::operator=(bpe_tokenizer&&) noexcept = default;
bpe_tokenizer::~bpe_tokenizer() = default;

expected<bpe_tokenizer> bpe_tokenizer::from_json(const std::string& json_text,
                                                 const std::string& source_name) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    return make_error(errc::parse_error, source_name + ": not valid JSON: " + e.what());
  }
  auto p = std::make_unique<impl>();
  p->source = source_name;
  if (auto ok = p->parse(root); !ok)
    return ok.error();
  return bpe_tokenizer{std::move(p)};
}

expected<bpe_tokenizer> bpe_tokenizer::from_file(const std::string& path) {
  auto text = runtime::read_file(path, uint64_t{256} << 20);
  if (!text)
    return text.error();
  return from_json(*text, path);
}

std::vector<int64_t> bpe_tokenizer::encode(std::string_view text) const {
  std::vector<int64_t> out;
  impl_->for_each_segment(text, [&](std::string_view seg, int64_t added_id) {
    if (added_id >= 0)
      out.push_back(added_id);
    else
      impl_->encode_segment(seg, out);
  });
  return out;
}

std::vector<std::string> bpe_tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  impl_->for_each_segment(text, [&](std::string_view seg, int64_t added_id) {
    if (added_id >= 0)
      return;
    std::string buf{seg};
    if (impl_->nfc)
      buf = unicode::nfc(buf);
    if (impl_->add_prefix_space && !buf.empty() && buf.front() != ' ')
      buf.insert(buf.begin(), ' ');
    if (!impl_->split) {
      out.push_back(buf);
      return;
    }
    for (auto [b, e] : split_text(buf, *impl_->split))
      out.push_back(buf.substr(b, e - b));
  });
  return out;
}

expected<std::string> bpe_tokenizer::decode(const std::vector<int64_t>& ids,
                                            const decode_options& opts) const {
  std::string bytes;
  const auto size = static_cast<int64_t>(impl_->id_kind.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto id = ids[i];
    if (id < 0 || id >= size || impl_->id_kind[id] == 0)
      return make_error(errc::out_of_range, impl_->source + ": id " + std::to_string(id) +
                                                " at position " + std::to_string(i) +
                                                " is not a token (vocab size " +
                                                std::to_string(size) + ")");
    if (opts.skip_special_tokens && impl_->id_special[id])
      continue;
    bytes += impl_->id_bytes[id];
  }
  return unicode::to_valid_utf8(bytes);
}

int64_t bpe_tokenizer::vocab_size() const {
  return static_cast<int64_t>(impl_->id_kind.size());
}

std::optional<int64_t> bpe_tokenizer::token_to_id(std::string_view token) const {
  std::string key{token};
  if (auto it = impl_->added_by_content.find(key); it != impl_->added_by_content.end())
    return it->second;
  if (auto it = impl_->vocab.find(key); it != impl_->vocab.end())
    return it->second;
  return std::nullopt;
}

bool bpe_tokenizer::is_special(int64_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_special[id] != 0;
}

std::optional<std::string> bpe_tokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id >= vocab_size() || impl_->id_kind[id] == 0)
    return std::nullopt;
  return impl_->id_text[id];
}

} // namespace troupe::models
