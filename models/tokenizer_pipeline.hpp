#pragma once
// The components of a tokenizer.json pipeline (internal to the tokenizer
// sources; the public interface is models/tokenizer.hpp).
//
// NOTE [tokenizer pipeline]: hf_tokenizer::encode follows Hugging Face
// tokenizers step by step, so that its ids equal the reference's exactly:
//  1. invalid UTF-8 becomes U+FFFD (per maximal ill-formed subsequence, as a
//     binding of the reference receives such bytes);
//  2. added tokens with normalized: false are cut out of the raw text;
//  3. each remaining piece is normalized on its own (so Prepend fires once
//     per piece), and added tokens with normalized: true are cut out of it;
//  4. the pre-tokenizer splits each piece into words (empty ones dropped);
//  5. the model turns each word into ids;
//  6. the post-processor adds special tokens when asked to.
// Decoding maps ids to token strings (added tokens first), drops special
// tokens when asked, and runs the decoder chain. Every component is parsed
// from its JSON with its path, and an unknown one is refused by name.

#include "models/tokenizer_json.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace troupe::models::tok {

/// One piece of text travelling through normalizer, pre-tokenizer and model.
struct split {
  /// The text; raw bytes when `byte_level` (see below).
  std::string text;
  /// The text stands for its ByteLevel characters (GPT-2's byte ↔ char
  /// map), which are materialised only if a later step needs them.
  bool byte_level = false;
  /// The piece starts at offset 0 of the input (Metaspace's "first").
  bool at_start = false;
};

/// GPT-2's byte → character map, each character in UTF-8.
const std::array<std::string, 256>& byte_level_chars();
/// The byte of a ByteLevel character, or -1.
int byte_level_byte(char32_t cp);
/// `s.text` as ByteLevel characters (no-op unless s.byte_level).
void materialise(split& s);
/// The reference's \w (the Rust regex crate's: alphabetic, marks, decimal
/// digits, connector punctuation, joiners), used by single_word and the
/// Whitespace pre-tokenizer.
bool reference_word_char(char32_t cp);

/// A normalizer: rewrites one piece's text.
class normalizer {
public:
  virtual ~normalizer() = default;
  virtual void apply(std::string& text) const = 0;
};

/// A pre-tokenizer: splits pieces into words.
class pre_tokenizer {
public:
  virtual ~pre_tokenizer() = default;
  virtual void apply(std::vector<split>& splits) const = 0;
};

/// A model: the ids of one word, and the vocabulary.
class token_model {
public:
  virtual ~token_model() = default;
  /// Appends the ids of `word` (non-empty) to `out`.
  virtual void tokenize(const split& word, std::vector<int64_t>& out) const = 0;
  virtual std::optional<int64_t> token_to_id(std::string_view token) const = 0;
  /// The vocabulary's string of `id`, if it has one.
  virtual const std::string* id_to_token(int64_t id) const = 0;
  /// One past the largest id of the vocabulary.
  virtual int64_t size() const = 0;
};

/// A decoder: rewrites the list of token strings.
class decoder {
public:
  virtual ~decoder() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};

/// A post-processor: adds special tokens around the ids of one text.
class post_processor {
public:
  virtual ~post_processor() = default;
  virtual void apply(std::vector<int64_t>& ids, bool add_special_tokens) const = 0;
};

/// A Sequence component: its steps applied in order.
template <class Base, class... Args>
class sequence_of final : public Base {
public:
  explicit sequence_of(std::vector<std::unique_ptr<Base>> steps) : steps_(std::move(steps)) {}
  void apply(Args... args) const override {
    for (const auto& s : steps_)
      s->apply(args...);
  }

private:
  std::vector<std::unique_ptr<Base>> steps_;
};

/// Parsers of the components (null → nullptr); each throws json_failure
/// naming the path of a malformed or unsupported component.
std::unique_ptr<normalizer> normalizer_from_json(const json_at& j);
std::unique_ptr<pre_tokenizer> pre_tokenizer_from_json(const json_at& j);
std::unique_ptr<token_model> model_from_json(const json_at& j);
std::unique_ptr<decoder> decoder_from_json(const json_at& j);
std::unique_ptr<post_processor> post_processor_from_json(const json_at& j);

/// A post-processor adding `prefix` before and `suffix` after the ids when
/// asked (tokenizer_config.json's add_bos_token / add_eos_token).
std::unique_ptr<post_processor> affix_post_processor(std::vector<int64_t> prefix,
                                                     std::vector<int64_t> suffix);

/// Added tokens ("added_tokens" of tokenizer.json) and how they are cut out
/// of text: leftmost-longest, non-overlapping; a match refused by
/// single_word is skipped whole; lstrip / rstrip take the white space next
/// to the token into its span.
class added_vocabulary {
public:
  struct token {
    std::string content;
    int64_t id = 0;
    bool special = false;
    bool lstrip = false;
    bool rstrip = false;
    bool single_word = false;
    bool normalized = false;
    /// The content after the normalizer (matched when `normalized`).
    std::string normalized_content;
  };

  /// A piece of a cut text: a byte range, and the added token it holds.
  struct piece {
    size_t begin = 0;
    size_t end = 0;
    const token* added = nullptr;
  };

  /// Reads "added_tokens"; ids follow the reference's rule (the model's id
  /// when the content is in its vocabulary, else the next free id).
  void parse(const json_at& list, const token_model& model, const normalizer* norm);

  /// Cuts `text` on the tokens with normalized == `normalized_pass`
  /// (empty pieces left out).
  std::vector<piece> cut(std::string_view text, bool normalized_pass) const;

  const token* by_id(int64_t id) const;
  const token* by_content(std::string_view content) const;
  /// Whether `text` is the content of a special token.
  bool is_special_content(std::string_view text) const;
  int64_t max_id() const { return max_id_; }
  const std::vector<token>& tokens() const { return tokens_; }

private:
  struct trie {
    std::vector<int32_t> terminal;              // per node: index into tokens_, or -1
    std::unordered_map<uint64_t, int32_t> next; // (node << 8 | byte) → node
    std::array<bool, 256> first{};
    void add(std::string_view key, int32_t token);
    /// The longest key starting at `i`: (token, end), or (-1, i).
    std::pair<int32_t, size_t> longest_at(std::string_view text, size_t i) const;
    /// The leftmost position from `from` where a key starts, with the
    /// longest key there: (token, begin, end), or token -1.
    std::tuple<int32_t, size_t, size_t> leftmost_longest(std::string_view text, size_t from) const;
  };
  std::vector<token> tokens_;
  trie raw_, normalized_;
  std::unordered_map<int64_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  int64_t max_id_ = -1;
};

} // namespace troupe::models::tok
