#pragma once
// Tokenizers: text <-> token ids.
//
// `encode` adds special tokens (BOS, EOS) only when asked; text matching an
// added token (e.g. "<|endoftext|>") becomes that token. `decode` returns
// valid UTF-8: byte sequences that do not form UTF-8 (a multi-byte character
// cut between tokens) become U+FFFD, as HF does. A loaded tokenizer is
// immutable and safe to use from several threads.

#include "runtime/error.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::models {

class chat_template;

/// Options of tokenizer::encode.
struct encode_options {
  /// Add the special tokens the tokenizer puts around a text (its
  /// post-processor, or tokenizer_config.json's add_bos_token /
  /// add_eos_token), as Hugging Face's add_special_tokens does.
  bool add_special_tokens = false;
};

/// Options of tokenizer::decode.
struct decode_options {
  /// Leave out special tokens (BOS, EOS, pad, chat markers).
  bool skip_special_tokens = false;
};

/// Ids of the tokens with a role; each may be absent.
struct special_token_ids {
  std::optional<int64_t> bos;
  std::optional<int64_t> eos;
  std::optional<int64_t> pad;
};

/// Interface of every tokenizer.
class tokenizer {
public:
  virtual ~tokenizer() = default;

  /// Token ids of `text`.
  virtual std::vector<int64_t> encode(std::string_view text, const encode_options& opts) const = 0;

  /// Token ids of `text`, without special tokens.
  std::vector<int64_t> encode(std::string_view text) const { return encode(text, {}); }

  /// Text of `ids`; an id outside [0, vocab_size()) or without a token is an
  /// out_of_range error naming it and its position.
  virtual expected<std::string> decode(const std::vector<int64_t>& ids,
                                       const decode_options& opts) const = 0;

  /// decode(ids) with default options.
  expected<std::string> decode(const std::vector<int64_t>& ids) const { return decode(ids, {}); }

  /// One past the largest token id.
  virtual int64_t vocab_size() const = 0;

  /// The id of a token given by its text as stored in the vocabulary.
  virtual std::optional<int64_t> token_to_id(std::string_view token) const = 0;

  /// Whether `id` is a special token (skipped by skip_special_tokens).
  virtual bool is_special(int64_t id) const = 0;

  /// The stored text of token `id` (e.g. "Ġthe", "▁the", "<0x0A>").
  virtual std::optional<std::string> id_to_token(int64_t id) const = 0;

  /// The longest input the model takes, from tokenizer_config.json
  /// (model_max_length; nullopt when absent or a placeholder like 1e30).
  std::optional<int64_t> model_max_length() const { return model_max_length_; }

  /// The BOS token id, if the tokenizer has one.
  std::optional<int64_t> bos_id() const { return special_.bos; }
  /// The EOS token id, if the tokenizer has one.
  std::optional<int64_t> eos_id() const { return special_.eos; }
  /// The padding token id, if the tokenizer has one.
  std::optional<int64_t> pad_id() const { return special_.pad; }

  /// Sets the role ids (e.g. from tokenizer_config.json); each must be a
  /// valid id, else invalid_argument. Call before sharing the tokenizer.
  expected<void> set_special_ids(const special_token_ids& ids);

  /// The chat template of tokenizer_config.json, parsed (NOTE [chat
  /// template engine]); an error saying why there is none (no template, or
  /// one the engine refuses: the file, the line and the construct).
  expected<std::shared_ptr<const chat_template>> chat() const;
  /// The texts of the BOS and EOS tokens as tokenizer_config.json names
  /// them ("" when it names none): what a chat template receives.
  const std::string& bos_text() const { return bos_text_; }
  const std::string& eos_text() const { return eos_text_; }

protected:
  special_token_ids special_;
  std::optional<int64_t> model_max_length_;
  std::shared_ptr<const chat_template> chat_;
  std::string chat_missing_ = "the tokenizer has no chat template";
  std::string bos_text_, eos_text_;
};

/// Raw bytes as tokens: ids 0..255 are the bytes, then 256 = "<pad>",
/// 257 = "<bos>", 258 = "<eos>" (vocab_size 259). encode never produces the
/// special ids (the text "<eos>" is five bytes); decode writes them as their
/// names unless skipped. Round-trips any UTF-8 text. For built-in tasks.
class byte_tokenizer final : public tokenizer {
public:
  static constexpr int64_t pad_token = 256;
  static constexpr int64_t bos_token = 257;
  static constexpr int64_t eos_token = 258;
  static constexpr int64_t size = 259;

  byte_tokenizer();

  using tokenizer::encode;
  /// add_special_tokens puts <bos> in front.
  std::vector<int64_t> encode(std::string_view text, const encode_options& opts) const override;
  using tokenizer::decode;
  expected<std::string> decode(const std::vector<int64_t>& ids,
                               const decode_options& opts) const override;
  int64_t vocab_size() const override { return size; }
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  bool is_special(int64_t id) const override { return id >= pad_token && id < size; }
  std::optional<std::string> id_to_token(int64_t id) const override;
};

/// A Hugging Face tokenizer.json pipeline (NOTE [tokenizer pipeline] in
/// tokenizer_pipeline.hpp): normalizers NFC / NFD / NFKC / NFKD, Lowercase,
/// Strip, StripAccents, Prepend, Replace, BertNormalizer, Nmt, Sequence;
/// pre-tokenizers ByteLevel, Split (any Oniguruma regex or string),
/// Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit,
/// CharDelimiterSplit, BertPreTokenizer, Sequence; models BPE (byte-level,
/// or over characters with byte_fallback, unk_token / fuse_unk,
/// ignore_merges, subword affixes), WordPiece and WordLevel; post-processors
/// TemplateProcessing, ByteLevel, Bert / Roberta processing, Sequence;
/// decoders ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace,
/// WordPiece, BPEDecoder, CTC, Sequence; added tokens with special,
/// normalized, lstrip / rstrip and single_word. Anything else is refused
/// naming the component and its JSON path. Ids equal the reference
/// implementation's (tests/models/tokenizer_reference_test.cpp).
class hf_tokenizer final : public tokenizer {
public:
  /// Parses tokenizer.json text; errors start with `source_name` and give
  /// the JSON path ("model.merges[12]: expected a string or a pair").
  static expected<hf_tokenizer> from_json(const std::string& json_text,
                                          const std::string& source_name);

  /// Reads and parses a tokenizer.json file.
  static expected<hf_tokenizer> from_file(const std::string& path);

  /// Applies a tokenizer_config.json: bos_token / eos_token / pad_token (a
  /// string or {"content": ...}), add_bos_token / add_eos_token (when
  /// either is present they decide the special tokens of
  /// add_special_tokens, as transformers does for Llama-style tokenizers),
  /// model_max_length. Errors name `source_name` and the key. Call before
  /// sharing the tokenizer.
  expected<void> apply_config(const std::string& json_text, const std::string& source_name);

  hf_tokenizer(hf_tokenizer&&) noexcept;
  hf_tokenizer& operator=(hf_tokenizer&&) noexcept;
  ~hf_tokenizer() override;

  using tokenizer::encode;
  std::vector<int64_t> encode(std::string_view text, const encode_options& opts) const override;
  using tokenizer::decode;
  expected<std::string> decode(const std::vector<int64_t>& ids,
                               const decode_options& opts) const override;
  int64_t vocab_size() const override;
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  bool is_special(int64_t id) const override;
  std::optional<std::string> id_to_token(int64_t id) const override;

  /// The words of `text` the model receives (between added tokens, after
  /// the normalizer and the pre-tokenizer, ByteLevel characters shown as
  /// such); for tests and debugging.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

private:
  struct impl;

  explicit hf_tokenizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// Loads a tokenizer from a tokenizer.json file or a directory holding one,
/// with the tokenizer_config.json beside it when present
/// (hf_tokenizer::apply_config).
expected<std::unique_ptr<tokenizer>> load_tokenizer(const std::string& dir_or_file);

} // namespace troupe::models
