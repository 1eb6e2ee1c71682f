#pragma once
// Tokenizers: text <-> token ids.
//
// `encode` never adds BOS/EOS (callers or chat templates do, using bos_id()
// / eos_id()); text matching an added token (e.g. "<|endoftext|>") becomes
// that token. `decode` returns valid UTF-8: byte sequences that do not form
// UTF-8 (a multi-byte character cut between tokens) become U+FFFD, as HF does.
// A loaded tokenizer is immutable and safe to use from several threads.

#include "runtime/error.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::models {

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

  /// Token ids of `text` (no BOS/EOS added).
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;

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

  /// The BOS token id, if the tokenizer has one.
  std::optional<int64_t> bos_id() const { return special_.bos; }
  /// The EOS token id, if the tokenizer has one.
  std::optional<int64_t> eos_id() const { return special_.eos; }
  /// The padding token id, if the tokenizer has one.
  std::optional<int64_t> pad_id() const { return special_.pad; }

  /// Sets the role ids (e.g. from tokenizer_config.json); each must be a
  /// valid id, else invalid_argument. Call before sharing the tokenizer.
  expected<void> set_special_ids(const special_token_ids& ids);

protected:
  special_token_ids special_;
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

  std::vector<int64_t> encode(std::string_view text) const override;
  using tokenizer::decode;
  expected<std::string> decode(const std::vector<int64_t>& ids,
                               const decode_options& opts) const override;
  int64_t vocab_size() const override { return size; }
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  bool is_special(int64_t id) const override { return id >= pad_token && id < size; }
};

/// Byte-level BPE from a Hugging Face tokenizer.json (GPT-2, Llama 3, Qwen2
/// families): model BPE with vocab and merges, added tokens, normalizer null
/// or NFC, pre-tokenizer ByteLevel (GPT-2 regex) or Sequence[Split(regex of
/// Llama 3 or Qwen2), ByteLevel(use_regex=false)], decoder ByteLevel.
class bpe_tokenizer final : public tokenizer {
public:
  /// Parses tokenizer.json text; errors start with `source_name` and give
  /// the JSON path ("model.merges[12]: expected a string or a pair").
  static expected<bpe_tokenizer> from_json(const std::string& json_text,
                                           const std::string& source_name);

  /// Reads and parses a tokenizer.json file.
  static expected<bpe_tokenizer> from_file(const std::string& path);

  bpe_tokenizer(bpe_tokenizer&&) noexcept;
  bpe_tokenizer& operator=(bpe_tokenizer&&) noexcept;
  ~bpe_tokenizer() override;

  std::vector<int64_t> encode(std::string_view text) const override;
  using tokenizer::decode;
  expected<std::string> decode(const std::vector<int64_t>& ids,
                               const decode_options& opts) const override;
  int64_t vocab_size() const override;
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  bool is_special(int64_t id) const override;

  /// The pre-tokenizer split of `text` (between added tokens, after the
  /// normalizer), as byte strings of the input; for tests and debugging.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  /// The stored text of token `id` (byte-level symbols, e.g. "Ġthe").
  std::optional<std::string> id_to_token(int64_t id) const;

private:
  struct impl;

  explicit bpe_tokenizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// Loads a tokenizer from a tokenizer.json file or a directory holding one;
/// BOS / EOS / pad come from tokenizer_config.json beside it when present
/// ("bos_token": "<s>" or {"content": "<s>"}).
expected<std::unique_ptr<tokenizer>> load_tokenizer(const std::string& dir_or_file);

} // namespace troupe::models
