// The disk weight transport: safetensors and a manifest in a shared folder.
#include "runtime/transport_detail.hpp"

#include "runtime/file_io.hpp"
#include "runtime/hash.hpp"
#include "runtime/torch_guard.hpp"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace troupe::runtime {

namespace transport_detail {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- disk ------------------------------------------------------------------------

// NOTE [disk transport]: version v of channel c is the folder
// <dir>/<c>/v<v>/ holding model.safetensors and manifest.json (format,
// version, the file's size, and the table with each tensor's hash). It is
// written as v<v>.tmp (files fsynced), renamed into place and the parent
// fsynced; only the newest `keep` versions stay.
constexpr const char* disk_weights_file = "model.safetensors";
constexpr const char* disk_manifest_file = "manifest.json";

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Reads exactly `n` bytes of `path` from `offset` into `dst`.
expected<void> read_range(const std::string& path, uint64_t offset, uint8_t* dst, uint64_t n) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return os_error("cannot open " + path);
  fd_holder guard{fd};
  uint64_t done = 0;
  while (done < n) {
    auto chunk = std::min<uint64_t>(n - done, uint64_t{1} << 30);
    auto r = ::pread(fd, dst + done, chunk, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return os_error("cannot read " + path);
    if (r == 0)
      return make_error(errc::corrupted, path + ": ends at byte " + std::to_string(offset + done) +
                                             " (truncated while reading)");
    done += static_cast<uint64_t>(r);
  }
  return caf::unit;
}

class disk_transport final : public weight_transport {
public:
  explicit disk_transport(transport_options o)
    : opts_(std::move(o)), root_(fs::path{opts_.dir} / opts_.channel) {}
  transport_kind kind() const override { return transport_kind::disk; }

  expected<void> publish(int64_t version, const tensor_map& tensors) override {
    auto where = "disk channel '" + opts_.channel + "'";
    if (auto err = check_new_version(version, last_, where))
      return err;
    auto ps = prepare(tensors, where);
    if (!ps)
      return ps.error();
    for (auto& p : *ps)
      p.e.hash = hash64(p.cpu.data_ptr(), p.e.bytes);
    auto final_dir = root_ / ("v" + std::to_string(version));
    auto tmp = root_ / ("v" + std::to_string(version) + ".tmp");
    std::error_code ec;
    fs::create_directories(root_, ec);
    if (ec)
      return make_error(errc::io_error, where + ": cannot create " + root_.string() + ": " +
                                            ec.message());
    fs::remove_all(tmp, ec);
    fs::remove_all(final_dir, ec);
    fs::create_directories(tmp, ec);
    if (ec)
      return make_error(errc::io_error, where + ": cannot create " + tmp.string() + ": " +
                                            ec.message());
    tensor_map cpu;
    for (const auto& p : *ps)
      cpu.emplace(p.e.name, p.cpu);
    auto file = tmp / disk_weights_file;
    if (auto ok = save_safetensors(file.string(), cpu, {{"troupe.version", std::to_string(version)}});
        !ok)
      return with_prefix(ok.error(), where);
    auto size = file_size(file.string());
    if (!size)
      return size.error();
    auto manifest = json::parse(encode_table(version, *ps));
    manifest["file"] = disk_weights_file;
    manifest["file_bytes"] = *size;
    if (auto ok = write_file_atomic((tmp / disk_manifest_file).string(), manifest.dump(1)); !ok)
      return with_prefix(ok.error(), where);
    fsync_path(tmp);
    fs::rename(tmp, final_dir, ec);
    if (ec)
      return make_error(errc::io_error, where + ": cannot rename " + tmp.string() + " to " +
                                            final_dir.string() + ": " + ec.message());
    fsync_path(root_);
    last_ = version;
    prune();
    return caf::unit;
  }

  expected<received_weights> receive(int64_t version) override {
    auto where = "disk channel '" + opts_.channel + "'";
    auto dir = root_ / ("v" + std::to_string(version));
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      auto have = versions();
      std::string listed;
      for (auto v : have)
        listed += (listed.empty() ? "" : ", ") + std::to_string(v);
      if (!have.empty() && have.back() > version)
        return make_error(errc::version_mismatch,
                          where + ": version " + std::to_string(version) +
                              " is no longer kept (already overwritten; present: " + listed + ")");
      return make_error(errc::not_found, where + ": version " + std::to_string(version) +
                                             " not published in " + root_.string() +
                                             (listed.empty() ? "" : " (present: " + listed + ")"));
    }
    auto mtext = read_file((dir / disk_manifest_file).string());
    if (!mtext)
      return make_error(errc::corrupted, where + ": version " + std::to_string(version) +
                                             ": no readable manifest (" +
                                             context_of(mtext.error()) + ")");
    auto t = decode_table(*mtext, (dir / disk_manifest_file).string());
    if (!t)
      return t.error();
    if (auto err = check_version(*t, version, where))
      return err;
    uint64_t want_size = 0;
    try {
      want_size = json::parse(*mtext).at("file_bytes").get<uint64_t>();
    } catch (const json::exception&) {
      return make_error(errc::corrupted, where + ": manifest has no file_bytes");
    }
    auto file = (dir / disk_weights_file).string();
    auto size = file_size(file);
    if (!size)
      return make_error(errc::corrupted, where + ": " + context_of(size.error()));
    if (*size != want_size)
      return make_error(errc::corrupted, where + ": " + file + " has " + std::to_string(*size) +
                                             " bytes, the manifest says " +
                                             std::to_string(want_size) + " (truncated or replaced)");
    auto header = read_safetensors_header(file);
    if (!header)
      return make_error(errc::corrupted, where + ": " + context_of(header.error()));
    if (header->tensors.size() != t->entries.size())
      return make_error(errc::corrupted, where + ": " + file + " has " +
                                             std::to_string(header->tensors.size()) +
                                             " tensors, the manifest " +
                                             std::to_string(t->entries.size()));
    // The data section goes into one buffer, reused while nothing received
    // from it lives on (fresh pages cost as much as the read).
    auto data_bytes = static_cast<int64_t>(*size - header->data_start);
    if (!recv_buf_.defined() || recv_buf_.numel() != data_bytes ||
        recv_buf_.storage().use_count() != 1) {
      auto fresh = guarded(where, [&] { return at::empty({data_bytes}, at::kByte); });
      if (!fresh)
        return fresh.error();
      recv_buf_ = std::move(*fresh);
    }
    auto buf = recv_buf_;
    if (auto ok = read_range(file, header->data_start, buf.data_ptr<uint8_t>(),
                             static_cast<uint64_t>(data_bytes));
        !ok)
      return make_error(errc::corrupted, where + ": " + context_of(ok.error()));
    std::map<std::string, const tensor_info*> by_name;
    for (const auto& info : header->tensors)
      by_name[info.name] = &info;
    auto keep = std::make_shared<at::Tensor>(buf);
    const auto* base = buf.data_ptr<uint8_t>();
    received_weights out;
    out.version = version;
    for (const auto& e : t->entries) {
      auto it = by_name.find(e.name);
      if (it == by_name.end())
        return make_error(errc::corrupted, where + ": " + file + " lacks tensor '" + e.name + "'");
      const auto& info = *it->second;
      if (info.dtype != e.dtype || info.shape != e.shape || info.data_end - info.data_begin != e.bytes)
        return make_error(errc::corrupted,
                          where + ": tensor '" + e.name + "' differs from the manifest in dtype or shape");
      const auto* p = base + info.data_begin;
      if (hash64(p, e.bytes) != e.hash)
        return make_error(errc::corrupted, where + ": version " + std::to_string(version) +
                                               ": tensor '" + e.name +
                                               "' does not match its checksum");
      auto type = *safetensors_scalar_type(e.dtype);
      auto view = guarded(where + ": tensor '" + e.name + "'", [&] {
        return at::from_blob(const_cast<uint8_t*>(p), e.shape, [keep](void*) {},
                             at::TensorOptions().dtype(type));
      });
      if (!view)
        return view.error();
      out.bytes += e.bytes;
      out.tensors.emplace(e.name, std::move(*view));
    }
    return out;
  }

private:
  std::vector<int64_t> versions() const {
    std::vector<int64_t> out;
    std::error_code ec;
    for (auto it = fs::directory_iterator(root_, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      auto n = it->path().filename().string();
      if (n.size() < 2 || n[0] != 'v' ||
          !std::all_of(n.begin() + 1, n.end(), [](char c) { return c >= '0' && c <= '9'; }))
        continue;
      out.push_back(std::stoll(n.substr(1)));
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  void prune() {
    auto have = versions();
    std::error_code ec;
    for (size_t i = 0; i + static_cast<size_t>(opts_.keep) < have.size(); ++i)
      fs::remove_all(root_ / ("v" + std::to_string(have[i])), ec);
  }

  transport_options opts_;
  fs::path root_;
  int64_t last_ = -1;
  at::Tensor recv_buf_;
};

} // namespace

std::unique_ptr<weight_transport> make_disk_transport(const transport_options& options) {
  return std::make_unique<disk_transport>(options);
}

} // namespace transport_detail
} // namespace troupe::runtime
