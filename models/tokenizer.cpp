#include "models/tokenizer.hpp"

#include "models/tokenizer_unicode.hpp"
#include "runtime/file_io.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>

namespace troupe::models {

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

std::vector<int64_t> byte_tokenizer::encode(std::string_view text) const {
  std::vector<int64_t> out;
  out.reserve(text.size());
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

// ---- load_tokenizer ---------------------------------------------------------

namespace {

// Reads "bos_token" / "eos_token" / "pad_token" of tokenizer_config.json: a
// string, {"content": string, ...} or null.
expected<special_token_ids> read_tokenizer_config(const std::string& path, const tokenizer& tok) {
  auto text = runtime::read_file(path, uint64_t{64} << 20);
  if (!text)
    return text.error();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    return make_error(errc::parse_error, path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object())
    return make_error(errc::parse_error, path + ": expected a JSON object");
  special_token_ids ids;
  for (auto [key, slot] : {std::pair{"bos_token", &ids.bos}, std::pair{"eos_token", &ids.eos},
                           std::pair{"pad_token", &ids.pad}}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null())
      continue;
    const nlohmann::json* content = &*it;
    if (it->is_object()) {
      auto c = it->find("content");
      if (c == it->end())
        return make_error(errc::parse_error,
                          path + ": " + key + ": expected a string or an object with 'content'");
      content = &*c;
    }
    if (!content->is_string())
      return make_error(errc::parse_error,
                        path + ": " + key + ": expected a string, got " + content->type_name());
    auto token = content->get<std::string>();
    auto id = tok.token_to_id(token);
    if (!id)
      return make_error(errc::invalid_config,
                        path + ": " + key + ": token '" + token + "' is not in the vocabulary");
    *slot = *id;
  }
  return ids;
}

} // namespace

expected<std::unique_ptr<tokenizer>> load_tokenizer(const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file{dir_or_file};
  if (fs::is_directory(file, ec))
    file /= "tokenizer.json";
  if (!fs::exists(file, ec))
    return make_error(errc::not_found, "no tokenizer.json at " + dir_or_file);
  auto bpe = bpe_tokenizer::from_file(file.string());
  if (!bpe)
    return bpe.error();
  auto tok = std::make_unique<bpe_tokenizer>(std::move(*bpe));
  auto config = file.parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(config, ec)) {
    auto ids = read_tokenizer_config(config.string(), *tok);
    if (!ids)
      return ids.error();
    if (auto ok = tok->set_special_ids(*ids); !ok)
      return with_prefix(ok.error(), config.string());
  }
  return std::unique_ptr<tokenizer>{std::move(tok)};
}

} // namespace troupe::models
