#include "models/tokenizer.hpp"

#include "models/tokenizer_unicode.hpp"
#include "runtime/file_io.hpp"

#include <filesystem>

namespace troupe::models {

expected<std::shared_ptr<const chat_template>> tokenizer::chat() const {
  if (!chat_)
    return make_error(errc::not_found, chat_missing_);
  return chat_;
}

expected<void> tokenizer::set_special_ids(const special_token_ids& ids) {
  auto check = [&](const char* role, const std::optional<int64_t>& id) -> expected<void> {
    if (id && (*id < 0 || *id >= vocab_size()))
      return make_error(errc::invalid_argument, std::string{role} + " id " + std::to_string(*id) +
                                                    " is outside [0, " +
                                                    std::to_string(vocab_size()) + ")");
    return caf::unit;
  };
  for (auto [role, id] :
       {std::pair{"bos", ids.bos}, std::pair{"eos", ids.eos}, std::pair{"pad", ids.pad}})
    if (auto ok = check(role, id); !ok)
      return ok;
  special_ = ids;
  return caf::unit;
}

// ---- byte_tokenizer ---------------------------------------------------------

namespace {

constexpr const char* byte_special_names[] = {"<pad>", "<bos>", "<eos>"};

} // namespace

byte_tokenizer::byte_tokenizer() {
  special_ = {bos_token, eos_token, pad_token};
}

std::vector<int64_t> byte_tokenizer::encode(std::string_view text,
                                            const encode_options& opts) const {
  std::vector<int64_t> out;
  out.reserve(text.size() + 1);
  if (opts.add_special_tokens)
    out.push_back(bos_token);
  for (unsigned char b : text)
    out.push_back(b);
  return out;
}

expected<std::string> byte_tokenizer::decode(const std::vector<int64_t>& ids,
                                             const decode_options& opts) const {
  std::string bytes;
  bytes.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto id = ids[i];
    if (id < 0 || id >= size)
      return make_error(errc::out_of_range, "byte tokenizer: id " + std::to_string(id) +
                                                " at position " + std::to_string(i) +
                                                " is outside [0, " + std::to_string(size) + ")");
    if (id < 256)
      bytes += static_cast<char>(id);
    else if (!opts.skip_special_tokens)
      bytes += byte_special_names[id - 256];
  }
  return unicode::to_valid_utf8(bytes);
}

std::optional<int64_t> byte_tokenizer::token_to_id(std::string_view token) const {
  if (token.size() == 1)
    return static_cast<unsigned char>(token[0]);
  for (int64_t i = 0; i < 3; ++i)
    if (token == byte_special_names[i])
      return 256 + i;
  return std::nullopt;
}

std::optional<std::string> byte_tokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id >= size)
    return std::nullopt;
  if (id >= 256)
    return std::string{byte_special_names[id - 256]};
  return std::string(1, static_cast<char>(id));
}

// ---- load_tokenizer ---------------------------------------------------------

expected<std::unique_ptr<tokenizer>> load_tokenizer(const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file{dir_or_file};
  if (fs::is_directory(file, ec))
    file /= "tokenizer.json";
  if (!fs::exists(file, ec))
    return make_error(errc::not_found, "no tokenizer.json at " + dir_or_file);
  auto hf = hf_tokenizer::from_file(file.string());
  if (!hf)
    return hf.error();
  auto tok = std::make_unique<hf_tokenizer>(std::move(*hf));
  auto config = file.parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(config, ec)) {
    auto text = runtime::read_file(config.string(), uint64_t{64} << 20);
    if (!text)
      return text.error();
    if (auto ok = tok->apply_config(*text, config.string()); !ok)
      return ok.error();
  }
  return std::unique_ptr<tokenizer>{std::move(tok)};
}

} // namespace troupe::models
