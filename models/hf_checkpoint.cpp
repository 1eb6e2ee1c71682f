#include "models/hf_checkpoint.hpp"

#include "runtime/file_io.hpp"
#include "runtime/torch_guard.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

namespace troupe::models {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path{dir} / name).string();
}

bool is_regular_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

std::string shard_name(size_t index, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", index, count);
  return buf;
}

bool looks_like_shard(const std::string& name) {
  // model-DDDDD-of-DDDDD.safetensors
  static constexpr std::string_view prefix = "model-";
  static constexpr std::string_view suffix = ".safetensors";
  if (name.size() != prefix.size() + 5 + 4 + 5 + suffix.size())
    return false;
  if (name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  auto digits = [&](size_t pos) {
    for (size_t i = 0; i < 5; ++i)
      if (name[pos + i] < '0' || name[pos + i] > '9')
        return false;
    return true;
  };
  return digits(prefix.size()) && name.compare(prefix.size() + 5, 4, "-of-") == 0 &&
         digits(prefix.size() + 9);
}

expected<tensor_map> load_sharded(const std::string& dir, const std::string& index_path,
                                  const runtime::tensor_target& target) {
  auto text = runtime::read_file(index_path, uint64_t{64} << 20);
  if (!text)
    return text.error();
  auto index = runtime::parse_safetensors_index(*text, index_path);
  if (!index)
    return index.error();
  auto& [shard_of, listed] = *index;
  for (const auto& [file, names] : listed)
    if (!is_regular_file(join(dir, file)))
      return make_error(errc::not_found, index_path + ": shard '" + file + "' (holding '" +
                                             *names.begin() + "') does not exist in " + dir);
  tensor_map out;
  for (auto& [file, names] : listed) {
    auto path = join(dir, file);
    auto shard = load_safetensors(path, target);
    if (!shard)
      return shard.error();
    for (auto& [name, t] : *shard) {
      auto it = shard_of.find(name);
      if (it == shard_of.end())
        return make_error(errc::corrupted,
                          path + ": tensor '" + name + "' is not listed in " + index_path);
      if (it->second != file)
        return make_error(errc::corrupted, path + ": tensor '" + name + "' is listed in " +
                                               index_path + " under shard '" + it->second + "'");
      names.erase(name);
      out.emplace(name, std::move(t));
    }
    if (!names.empty())
      return make_error(errc::corrupted, index_path + ": tensor '" + *names.begin() +
                                             "' is mapped to '" + file +
                                             "', which does not contain it");
  }
  return out;
}

expected<void> remove_file(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
  if (ec)
    return make_error(errc::io_error, "cannot remove " + path + ": " + ec.message());
  return caf::unit;
}

// Removes shard files of an earlier save that the new layout does not use.
expected<void> remove_stale_shards(const std::string& dir, const std::set<std::string>& keep) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    auto name = entry.path().filename().string();
    if (looks_like_shard(name) && keep.count(name) == 0)
      if (auto ok = remove_file(entry.path().string()); !ok)
        return ok;
  }
  if (ec)
    return make_error(errc::io_error, "cannot list " + dir + ": " + ec.message());
  return caf::unit;
}

} // namespace

expected<tensor_map> load_hf_weights(const std::string& dir, const runtime::tensor_target& target) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return make_error(errc::not_found, "no such checkpoint directory: " + dir);
  auto single = join(dir, hf_weights_file);
  if (is_regular_file(single))
    return load_safetensors(single, target);
  auto index = join(dir, hf_index_file);
  if (is_regular_file(index))
    return load_sharded(dir, index, target);
  for (const char* legacy : {"pytorch_model.bin", "pytorch_model.bin.index.json"})
    if (is_regular_file(join(dir, legacy)))
      return make_error(errc::unsupported, dir + ": found " + legacy +
                                               "; only safetensors checkpoints are supported "
                                               "(convert it to model.safetensors)");
  return make_error(errc::not_found, dir + ": neither " + std::string{hf_weights_file} + " nor " +
                                         hf_index_file + " exists");
}

expected<hf_checkpoint> load_hf_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return make_error(errc::not_found, "no such checkpoint directory: " + dir);
  auto config = load_hf_config(join(dir, hf_config_file));
  if (!config)
    return config.error();
  auto tensors = load_hf_weights(dir);
  if (!tensors)
    return tensors.error();
  return hf_checkpoint{std::move(*config), std::move(*tensors)};
}

expected<void> save_hf_weights(const std::string& dir, const tensor_map& tensors,
                               uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return make_error(errc::io_error, "cannot create directory " + dir + ": " + ec.message());
  const string_map metadata{{"format", "pt"}};

  // Greedy packing in name order.
  std::vector<tensor_map> shards(1);
  uint64_t current = 0;
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) {
    if (!t.defined())
      return make_error(errc::invalid_argument, dir + ": tensor '" + name + "' is undefined");
    auto bytes = guarded("sizing tensor '" + name + "'", [&] {
      return static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_size());
    });
    if (!bytes)
      return bytes.error();
    if (max_shard_bytes > 0 && !shards.back().empty() && current + *bytes > max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().emplace(name, t);
    current += *bytes;
    total += *bytes;
  }

  auto index_path = join(dir, hf_index_file);
  auto single_path = join(dir, hf_weights_file);
  if (shards.size() == 1) {
    if (auto ok = save_safetensors(single_path, shards.front(), metadata); !ok)
      return ok;
    if (auto ok = remove_file(index_path); !ok)
      return ok;
    return remove_stale_shards(dir, {});
  }
  nlohmann::ordered_json index = nlohmann::ordered_json::object();
  index["metadata"] = {{"total_size", total}};
  auto& weight_map = index["weight_map"];
  weight_map = nlohmann::ordered_json::object();
  std::set<std::string> names;
  for (size_t i = 0; i < shards.size(); ++i) {
    auto file = shard_name(i + 1, shards.size());
    names.insert(file);
    if (auto ok = save_safetensors(join(dir, file), shards[i], metadata); !ok)
      return ok;
    for (const auto& [name, t] : shards[i])
      weight_map[name] = file;
  }
  std::string text;
  try {
    text = index.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    return make_error(errc::invalid_argument,
                      index_path + ": tensor names must be UTF-8: " + e.what());
  }
  if (auto ok = runtime::write_file_atomic(index_path, text); !ok)
    return ok;
  if (auto ok = remove_file(single_path); !ok)
    return ok;
  return remove_stale_shards(dir, names);
}

expected<void> save_hf_checkpoint_dir(const std::string& dir, const llama_config& config,
                                      const tensor_map& tensors, uint64_t max_shard_bytes) {
  if (auto ok = validate(config); !ok)
    return with_prefix(ok.error(), "cannot save " + dir);
  if (auto ok = save_hf_weights(dir, tensors, max_shard_bytes); !ok)
    return ok;
  return runtime::write_file_atomic(join(dir, hf_config_file), to_hf_config_json(config));
}

} // namespace troupe::models
