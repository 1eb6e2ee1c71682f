#include "runtime/checkpoint.hpp"

#include "runtime/file_io.hpp"
#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace troupe::runtime {

namespace fs = std::filesystem;

namespace {

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

caf::error fs_error(const std::string& what, const std::error_code& ec) {
  return make_error(errc::io_error, what + ": " + ec.message());
}

constexpr const char* manifest_name = "manifest.json";

} // namespace

std::string fnv1a64_hex(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

expected<void> write_checkpoint(const std::string& parent, const std::string& name,
                                const checkpoint_files& files, int keep) {
  if (name.empty() || name.find('/') != std::string::npos || name == "latest")
    return make_error(errc::invalid_argument, "checkpoint name '" + name + "' is not a plain name");
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec)
    return fs_error("cannot create " + parent, ec);
  auto final_dir = fs::path{parent} / name;
  auto tmp_dir = fs::path{parent} / (name + ".tmp");
  fs::remove_all(tmp_dir, ec);
  fs::create_directory(tmp_dir, ec);
  if (ec)
    return fs_error("cannot create " + tmp_dir.string(), ec);
  nlohmann::json manifest = nlohmann::json::object();
  for (const auto& [file, bytes] : files) {
    if (file.empty() || file.find('/') != std::string::npos || file == manifest_name)
      return make_error(errc::invalid_argument, "checkpoint file name '" + file + "' is not allowed");
    if (auto ok = write_file_atomic((tmp_dir / file).string(), bytes); !ok)
      return ok;
    manifest[file] = {{"size", bytes.size()}, {"fnv1a64", fnv1a64_hex(bytes)}};
  }
  nlohmann::json doc = {{"format", "troupe-checkpoint-1"}, {"files", manifest}};
  if (auto ok = write_file_atomic((tmp_dir / manifest_name).string(), doc.dump(2) + "\n"); !ok)
    return ok;
  fsync_dir(tmp_dir);
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec)
    return fs_error("cannot rename " + tmp_dir.string() + " to " + final_dir.string(), ec);
  fsync_dir(parent);
  if (auto ok = write_file_atomic((fs::path{parent} / "latest").string(), name + "\n"); !ok)
    return ok;
  if (keep > 0) {
    // Older complete checkpoints (folders with a manifest), oldest first by name.
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(parent, ec)) {
      auto n = entry.path().filename().string();
      bool tmp = n.size() >= 4 && n.compare(n.size() - 4, 4, ".tmp") == 0;
      if (entry.is_directory() && !tmp && fs::exists(entry.path() / manifest_name))
        names.push_back(n);
    }
    names.push_back(name);
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    auto excess = static_cast<int64_t>(names.size()) - keep;
    for (int64_t i = 0; i < excess; ++i)
      if (names[static_cast<size_t>(i)] != name)
        fs::remove_all(fs::path{parent} / names[static_cast<size_t>(i)], ec);
  }
  return {};
}

expected<checkpoint_files> read_checkpoint(const std::string& dir) {
  auto text = read_file((fs::path{dir} / manifest_name).string());
  if (!text)
    return with_prefix(text.error(), "checkpoint " + dir);
  auto doc = json_too_deep_at(*text) == std::string::npos
                 ? nlohmann::json::parse(*text, nullptr, false)
                 : nlohmann::json(nlohmann::json::value_t::discarded);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("files") ||
      !doc["files"].is_object())
    return make_error(errc::corrupted, "checkpoint " + dir + ": manifest.json is malformed");
  checkpoint_files out;
  for (const auto& [file, meta] : doc["files"].items()) {
    auto bytes = read_file((fs::path{dir} / file).string());
    if (!bytes)
      return make_error(errc::corrupted, "checkpoint " + dir + ": " + describe(bytes.error()));
    if (!meta.is_object() || !meta.contains("size") || !meta.contains("fnv1a64"))
      return make_error(errc::corrupted, "checkpoint " + dir + ": manifest entry of " + file +
                                             " is malformed");
    if (meta["size"].get<uint64_t>() != bytes->size())
      return make_error(errc::corrupted, "checkpoint " + dir + ": " + file + " has " +
                                             std::to_string(bytes->size()) + " bytes, manifest says " +
                                             std::to_string(meta["size"].get<uint64_t>()));
    if (meta["fnv1a64"].get<std::string>() != fnv1a64_hex(*bytes))
      return make_error(errc::corrupted, "checkpoint " + dir + ": " + file +
                                             " fails its checksum");
    out.emplace(file, std::move(*bytes));
  }
  return out;
}

expected<std::string> latest_checkpoint(const std::string& parent) {
  auto pointer = fs::path{parent} / "latest";
  std::error_code ec;
  if (!fs::exists(pointer, ec))
    return make_error(errc::not_found, "no checkpoint in " + parent);
  auto text = read_file(pointer.string());
  if (!text)
    return text.error();
  auto name = *text;
  while (!name.empty() && (name.back() == '\n' || name.back() == ' '))
    name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos)
    return make_error(errc::corrupted, pointer.string() + ": not a checkpoint name");
  return (fs::path{parent} / name).string();
}

} // namespace troupe::runtime
