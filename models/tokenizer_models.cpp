// Models of tokenizer.json: BPE (byte-level, or over characters with byte
// fallback), WordPiece and WordLevel (NOTE [tokenizer pipeline]).

#include "models/tokenizer_pipeline.hpp"
#include "models/tokenizer_unicode.hpp"
#include "runtime/jsonl.hpp"

#include <cstdio>
#include <limits>
#include <mutex>
#include <queue>
#include <unordered_map>

namespace troupe::models::tok {

namespace {

constexpr int64_t max_token_id = std::numeric_limits<int32_t>::max();

// "vocab": {token: id} with ids that are unique and not absurdly sparse (a
// hostile file must not make us allocate gigabytes).
struct vocabulary {
  std::unordered_map<std::string, int64_t> ids;
  std::vector<const std::string*> strings; // by id (nullptr for holes)

  void parse(const json_at& v) {
    const auto& obj = v.object();
    ids.reserve(obj.size());
    int64_t max_id = -1;
    for (const auto& [token, id] : obj.items()) {
      auto value = json_at{id, v.path + "." + token}.integer(0, max_token_id);
      ids.emplace(token, value);
      max_id = std::max(max_id, value);
    }
    if (max_id >= 2 * static_cast<int64_t>(ids.size()) + 1024)
      v.fail("id " + std::to_string(max_id) + " is far beyond the " + std::to_string(ids.size()) +
             " tokens (sparse vocabularies are not supported)");
    strings.assign(static_cast<size_t>(max_id + 1), nullptr);
    for (const auto& [token, id] : ids) {
      if (strings[id] != nullptr)
        v.fail("id " + std::to_string(id) + " is both '" + *strings[id] + "' and '" + token + "'");
      strings[id] = &token;
    }
  }

  std::optional<int64_t> find(std::string_view token) const {
    auto it = ids.find(std::string{token});
    return it == ids.end() ? std::nullopt : std::optional<int64_t>{it->second};
  }
  const std::string* text(int64_t id) const {
    return id >= 0 && id < static_cast<int64_t>(strings.size()) ? strings[id] : nullptr;
  }
};

// A model over a "vocab" object: lookups both ways and the id space.
class vocab_model : public token_model {
public:
  std::optional<int64_t> token_to_id(std::string_view token) const override {
    return vocab_.find(token);
  }
  const std::string* id_to_token(int64_t id) const override { return vocab_.text(id); }
  int64_t size() const override { return static_cast<int64_t>(vocab_.strings.size()); }

protected:
  vocabulary vocab_;
};

// NOTE [bpe merge order]: the reference's merge loop. Symbols form a linked
// list; a min-heap holds candidate pairs ordered by (rank, position); a
// popped pair is stale when its left symbol is gone, has no right
// neighbour, or the pair now merges into another token (only the merged id
// is compared, as in the reference). A merge queues the new pairs with its
// left and right neighbours. O(n log n) per word.
class bpe final : public vocab_model {
public:
  explicit bpe(const json_at& j) {
    parse_options(j);
    vocab_.parse(*j.get("vocab"));
    parse_merges(*j.get("merges"));
    build_symbol_tables(j);
  }

  void tokenize(const split& word, std::vector<int64_t>& out) const override {
    std::string key;
    const bool cacheable = word.text.size() < cache_word_limit;
    if (cacheable) {
      key.reserve(word.text.size() + 1);
      key += word.byte_level ? '\1' : '\0';
      key += word.text;
      std::lock_guard<std::mutex> guard{cache_mutex_};
      if (auto it = cache_.find(key); it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    auto ids = merge_word(word);
    out.insert(out.end(), ids.begin(), ids.end());
    if (!cacheable)
      return;
    std::lock_guard<std::mutex> guard{cache_mutex_};
    if (cache_.size() >= cache_limit)
      cache_.clear();
    cache_.emplace(std::move(key), std::move(ids));
  }

private:
  static constexpr size_t cache_word_limit = 256;
  static constexpr size_t cache_limit = 100'000;

  struct merge_rule {
    int32_t rank;
    int64_t merged;
  };

  void parse_options(const json_at& j) {
    if (auto d = j.get("dropout", true); d && !d->value.is_null()) {
      if (!d->value.is_number())
        d->fail(std::string{"expected null or a number, got "} + runtime::json_type_name(d->value));
      if (d->value.get<double>() > 0)
        d->fail("BPE dropout is not supported (tokens would be random)", errc::unsupported);
    }
    byte_fallback_ = j.flag("byte_fallback", false);
    fuse_unk_ = j.flag("fuse_unk", false);
    ignore_merges_ = j.flag("ignore_merges", false);
    prefix_ = j.text("continuing_subword_prefix", "");
    suffix_ = j.text("end_of_word_suffix", "");
    unk_token_ = j.optional_text("unk_token");
  }

  void parse_merges(const json_at& list) {
    const auto& arr = list.array();
    merges_.reserve(arr.size());
    int32_t rank = 0;
    for (size_t i = 0; i < arr.size(); ++i) {
      auto e = list.at(i);
      std::string a, b;
      if (e.value.is_string()) {
        const auto& s = e.value.get_ref<const std::string&>();
        if (s.rfind("#version", 0) == 0)
          continue;
        auto sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          e.fail("expected two tokens separated by one space, got '" + s + "'");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (e.value.is_array() && e.value.size() == 2 && e.value[0].is_string() &&
                 e.value[1].is_string()) {
        a = e.value[0].get<std::string>();
        b = e.value[1].get<std::string>();
      } else {
        e.fail("expected a string or a pair of strings, got " + e.value.dump());
      }
      auto ia = vocab_.find(a), ib = vocab_.find(b);
      for (auto [id, tok] : {std::pair{ia, &a}, std::pair{ib, &b}})
        if (!id)
          e.fail("token '" + *tok + "' is not in model.vocab");
      // The merged token is a + b without b's first prefix_.size() bytes
      // (the continuing-subword prefix), as in the reference.
      if (b.size() < prefix_.size())
        e.fail("token '" + b + "' is shorter than continuing_subword_prefix '" + prefix_ + "'");
      auto merged = a + b.substr(prefix_.size());
      auto ic = vocab_.find(merged);
      if (!ic)
        e.fail("merged token '" + merged + "' is not in model.vocab");
      // A pair listed twice: the later entry wins, as in the reference.
      merges_[pair_key(*ia, *ib)] = merge_rule{rank++, *ic};
    }
  }

  void build_symbol_tables(const json_at& j) {
    const auto& chars = byte_level_chars();
    for (int b = 0; b < 256; ++b) {
      byte_char_id_[b] = vocab_.find(chars[b]).value_or(-1);
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", b);
      byte_fallback_id_[b] = vocab_.find(hex).value_or(-1);
    }
    for (const auto& [token, id] : vocab_.ids) {
      auto units = unicode::decode_utf8(token);
      if (units.size() == 1 && units[0].valid)
        char_id_.emplace(units[0].cp, id);
    }
    if (unk_token_) {
      unk_id_ = vocab_.find(*unk_token_);
      if (!unk_id_)
        j.get("unk_token")->fail("'" + *unk_token_ + "' is not in model.vocab");
    }
  }

  static uint64_t pair_key(int64_t a, int64_t b) {
    return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b);
  }

  // The id of one initial symbol's string `s` (a character, with the
  // affixes), or nullopt.
  std::optional<int64_t> symbol_id(std::string_view s) const { return vocab_.find(s); }

  // The word's initial symbols: one per character (in the vocabulary),
  // else its bytes as <0xXX> tokens (byte_fallback), else unk (fused when
  // fuse_unk), else nothing.
  std::vector<int64_t> initial_symbols(const split& word) const {
    std::vector<int64_t> syms;
    syms.reserve(word.text.size());
    std::optional<int64_t> pending_unk;
    auto flush = [&] {
      if (pending_unk)
        syms.push_back(*pending_unk);
      pending_unk.reset();
    };
    const bool affixes = !prefix_.empty() || !suffix_.empty();
    const auto& chars = byte_level_chars();
    const size_t n = word.text.size();
    for (size_t i = 0; i < n;) {
      std::string_view ch;
      std::optional<int64_t> id;
      size_t len = 1;
      if (word.byte_level) {
        auto b = static_cast<unsigned char>(word.text[i]);
        ch = chars[b];
        if (byte_char_id_[b] >= 0)
          id = byte_char_id_[b];
      } else {
        auto u = unicode::decode_one(word.text, i);
        len = u.length;
        ch = std::string_view{word.text}.substr(i, len);
        if (auto it = char_id_.find(u.cp); u.valid && it != char_id_.end())
          id = it->second;
      }
      std::string affixed;
      if (affixes) {
        affixed = (i > 0 ? prefix_ : "") + std::string{ch} + (i + len == n ? suffix_ : "");
        id = symbol_id(affixed);
        ch = affixed;
      }
      i += len;
      if (id) {
        flush();
        syms.push_back(*id);
        continue;
      }
      if (byte_fallback_ && push_bytes(ch, syms))
        continue;
      if (unk_id_) {
        if (!fuse_unk_)
          flush();
        pending_unk = unk_id_;
      }
    }
    flush();
    return syms;
  }

  // <0xXX> for every byte of `s` when all exist.
  bool push_bytes(std::string_view s, std::vector<int64_t>& syms) const {
    for (unsigned char b : s)
      if (byte_fallback_id_[b] < 0)
        return false;
    for (unsigned char b : s)
      syms.push_back(byte_fallback_id_[b]);
    return true;
  }

  std::vector<int64_t> merge_word(const split& word) const {
    if (ignore_merges_) {
      split whole = word;
      materialise(whole);
      if (auto id = vocab_.find(whole.text))
        return {*id};
    }
    auto ids = initial_symbols(word);
    const int n = static_cast<int>(ids.size());
    std::vector<int> next(n), prev(n);
    std::vector<bool> alive(n, true);
    for (int i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct candidate {
      int32_t rank;
      int pos;
      int64_t merged;
      bool operator>(const candidate& o) const {
        return rank != o.rank ? rank > o.rank : pos > o.pos;
      }
    };
    std::priority_queue<candidate, std::vector<candidate>, std::greater<>> heap;
    auto rule_at = [&](int left) -> const merge_rule* {
      if (left < 0 || next[left] < 0)
        return nullptr;
      auto it = merges_.find(pair_key(ids[left], ids[next[left]]));
      return it == merges_.end() ? nullptr : &it->second;
    };
    auto push = [&](int left) {
      if (const auto* r = rule_at(left))
        heap.push({r->rank, left, r->merged});
    };
    for (int i = 0; i + 1 < n; ++i)
      push(i);
    while (!heap.empty()) {
      auto top = heap.top();
      heap.pop();
      if (!alive[top.pos])
        continue;
      const auto* r = rule_at(top.pos);
      if (r == nullptr || r->merged != top.merged)
        continue; // stale: a neighbour merged since this pair was queued
      int right = next[top.pos];
      ids[top.pos] = r->merged;
      next[top.pos] = next[right];
      alive[right] = false;
      if (next[right] >= 0)
        prev[next[right]] = top.pos;
      push(prev[top.pos]);
      push(top.pos);
    }
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(n));
    for (int i = n > 0 ? 0 : -1; i >= 0; i = next[i])
      out.push_back(ids[i]);
    return out;
  }

  std::unordered_map<uint64_t, merge_rule> merges_;
  std::unordered_map<char32_t, int64_t> char_id_;
  std::array<int64_t, 256> byte_char_id_{};
  std::array<int64_t, 256> byte_fallback_id_{};
  std::optional<std::string> unk_token_;
  std::optional<int64_t> unk_id_;
  std::string prefix_, suffix_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

// WordPiece: greedy longest match from the left; non-initial pieces carry
// the prefix ("##"); a word with an unmatchable position, or longer than
// max_input_chars_per_word, is one unk.
class word_piece final : public vocab_model {
public:
  explicit word_piece(const json_at& j) {
    vocab_.parse(*j.get("vocab"));
    prefix_ = j.text("continuing_subword_prefix", "##");
    max_chars_ = j.get("max_input_chars_per_word", true)
                     ? j.get("max_input_chars_per_word")->integer(0, max_token_id)
                     : 100;
    auto unk = j.text("unk_token", "[UNK]");
    auto id = vocab_.find(unk);
    if (!id)
      j.fail("unk_token '" + unk + "' is not in model.vocab");
    unk_id_ = *id;
  }

  void tokenize(const split& word, std::vector<int64_t>& out) const override {
    split w = word;
    materialise(w);
    const auto& s = w.text;
    auto units = unicode::decode_utf8(s);
    if (static_cast<int64_t>(units.size()) > max_chars_) {
      out.push_back(unk_id_);
      return;
    }
    std::vector<int64_t> pieces;
    size_t start = 0, u_start = 0;
    while (start < s.size()) {
      size_t u_end = units.size();
      std::optional<int64_t> found;
      while (u_start < u_end) {
        size_t end = u_end < units.size() ? units[u_end].offset : s.size();
        auto sub = (start > 0 ? prefix_ : "") + s.substr(start, end - start);
        if ((found = vocab_.find(sub)))
          break;
        --u_end;
      }
      if (!found) {
        out.push_back(unk_id_);
        return;
      }
      pieces.push_back(*found);
      u_start = u_end;
      start = u_end < units.size() ? units[u_end].offset : s.size();
    }
    out.insert(out.end(), pieces.begin(), pieces.end());
  }

private:
  std::string prefix_;
  int64_t max_chars_ = 100;
  int64_t unk_id_ = 0;
};

// WordLevel: the whole word from the vocabulary, else unk.
class word_level final : public vocab_model {
public:
  explicit word_level(const json_at& j) {
    vocab_.parse(*j.get("vocab"));
    if (auto unk = j.optional_text("unk_token")) {
      unk_id_ = vocab_.find(*unk);
      if (!unk_id_)
        j.get("unk_token")->fail("'" + *unk + "' is not in model.vocab");
    }
  }

  void tokenize(const split& word, std::vector<int64_t>& out) const override {
    split w = word;
    materialise(w);
    if (auto id = vocab_.find(w.text))
      out.push_back(*id);
    else if (unk_id_)
      out.push_back(*unk_id_);
  }

private:
  std::optional<int64_t> unk_id_;
};

} // namespace

std::unique_ptr<token_model> model_from_json(const json_at& j) {
  j.object();
  auto t = j.get("type", true);
  // Old files leave out the model's type; the reference then tries BPE.
  auto type = t ? t->string() : std::string{"BPE"};
  if (type == "BPE")
    return std::make_unique<bpe>(j);
  if (type == "WordPiece")
    return std::make_unique<word_piece>(j);
  if (type == "WordLevel")
    return std::make_unique<word_level>(j);
  j.unsupported_type("model", {"BPE", "WordPiece", "WordLevel"});
}

} // namespace troupe::models::tok
