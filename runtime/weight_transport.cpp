#include "runtime/weight_transport.hpp"

#include "runtime/collectives.hpp"
#include "runtime/file_io.hpp"
#include "runtime/hash.hpp"
#include "runtime/torch_guard.hpp"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace troupe::runtime {

#ifdef TROUPE_RUNTIME_CUDA_IPC
// cuda_ipc_transport.cpp (NOTE [cuda ipc transfers]).
expected<std::unique_ptr<weight_transport>> make_cuda_ipc_transport(const transport_options& options);
#endif

namespace {

// The shared-memory name of a channel's slot (NOTE [shm slots]).
std::string shm_segment_name(const std::string& channel, int64_t slot) {
  return "/troupe." + channel + "." + std::to_string(slot);
}

} // namespace

int remove_orphaned_shm_segments(const std::string& channel_prefix) {
  int removed = 0;
  std::error_code ec;
  // "troupe.<prefix>": a segment's name in /dev/shm up to its channel's pid.
  auto head = shm_segment_name(channel_prefix, 0).substr(1);
  head.resize(head.rfind('.'));
  for (auto it = std::filesystem::directory_iterator("/dev/shm", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    auto name = it->path().filename().string();
    if (name.rfind(head, 0) != 0)
      continue;
    auto pid = std::strtol(name.c_str() + head.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH &&
        ::shm_unlink(("/" + name).c_str()) == 0)
      ++removed;
  }
  return removed;
}

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

constexpr uint64_t data_alignment = 64;

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

// ---- the table every transfer carries ------------------------------------------

struct entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0; // within the payload
  uint64_t bytes = 0;
  uint64_t hash = 0;
};

struct table {
  int64_t version = -1;
  uint64_t payload_bytes = 0;
  std::vector<entry> entries;
};

// A tensor ready to be copied out: CPU, contiguous, with its table entry.
struct prepared {
  entry e;
  at::Tensor cpu;
};

expected<std::vector<prepared>> prepare(const tensor_map& tensors, const std::string& where) {
  std::vector<prepared> out;
  out.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (!t.defined())
      return make_error(errc::invalid_argument, where + ": tensor '" + name + "' is undefined");
    auto dtype = safetensors_dtype_name(t.scalar_type());
    if (dtype.empty())
      return make_error(errc::unsupported, where + ": tensor '" + name + "' has dtype " +
                                               std::string{c10::toString(t.scalar_type())} +
                                               ", which has no safetensors name");
    auto cpu = guarded(where + ": tensor '" + name + "'",
                       [&] { return t.detach().to(at::kCPU).contiguous(); });
    if (!cpu)
      return cpu.error();
    prepared p;
    p.e.name = name;
    p.e.dtype = dtype;
    p.e.shape.assign(t.sizes().begin(), t.sizes().end());
    p.e.bytes = static_cast<uint64_t>(cpu->numel()) * cpu->element_size();
    offset = align_up(offset, data_alignment);
    p.e.offset = offset;
    offset += p.e.bytes;
    p.cpu = std::move(*cpu);
    out.push_back(std::move(p));
  }
  return out;
}

uint64_t payload_size(const std::vector<prepared>& ps) {
  return ps.empty() ? 0 : ps.back().e.offset + ps.back().e.bytes;
}

// Copies every tensor into `payload` at its offset, filling in the hashes.
void copy_in(std::vector<prepared>& ps, uint8_t* payload) {
  for (auto& p : ps)
    p.e.hash = hash64_copy(payload + p.e.offset, p.cpu.data_ptr(), p.e.bytes);
}

std::string encode_table(int64_t version, const std::vector<prepared>& ps) {
  json j;
  j["format"] = "troupe-weights/1";
  j["version"] = version;
  j["payload_bytes"] = payload_size(ps);
  auto arr = json::array();
  for (const auto& p : ps)
    arr.push_back({{"name", p.e.name},
                   {"dtype", p.e.dtype},
                   {"shape", p.e.shape},
                   {"offset", p.e.offset},
                   {"bytes", p.e.bytes},
                   {"hash", hex64(p.e.hash)}});
  j["tensors"] = std::move(arr);
  return j.dump();
}

// Parses and checks a table: known dtypes, sizes that match the shapes,
// ranges inside the payload, no overlaps.
expected<table> decode_table(std::string_view text, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return make_error(errc::corrupted, where + ": weight table: " + what);
  };
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return bad(std::string{"not JSON ("} + e.what() + ")");
  }
  table t;
  try {
    if (!j.is_object() || j.value("format", "") != "troupe-weights/1")
      return bad("missing format \"troupe-weights/1\"");
    t.version = j.at("version").get<int64_t>();
    t.payload_bytes = j.at("payload_bytes").get<uint64_t>();
    uint64_t end_of_previous = 0;
    for (const auto& e : j.at("tensors")) {
      entry x;
      x.name = e.at("name").get<std::string>();
      x.dtype = e.at("dtype").get<std::string>();
      x.shape = e.at("shape").get<std::vector<int64_t>>();
      x.offset = e.at("offset").get<uint64_t>();
      x.bytes = e.at("bytes").get<uint64_t>();
      if (!parse_hex64(e.at("hash").get<std::string>(), x.hash))
        return bad("tensor '" + x.name + "': hash is not 16 hex digits");
      auto type = safetensors_scalar_type(x.dtype);
      if (!type)
        return bad("tensor '" + x.name + "': unknown dtype '" + x.dtype + "'");
      uint64_t numel = 1;
      for (auto d : x.shape) {
        if (d < 0)
          return bad("tensor '" + x.name + "': negative dimension");
        numel *= static_cast<uint64_t>(d);
      }
      if (numel * safetensors_dtype_size(x.dtype) != x.bytes)
        return bad("tensor '" + x.name + "': " + std::to_string(x.bytes) +
                   " bytes do not match its shape and dtype");
      if (x.offset < end_of_previous || x.offset > t.payload_bytes ||
          x.bytes > t.payload_bytes - x.offset)
        return bad("tensor '" + x.name + "': bytes [" + std::to_string(x.offset) + ", " +
                   std::to_string(x.offset + x.bytes) + ") overlap another tensor or lie outside the " +
                   std::to_string(t.payload_bytes) + "-byte payload");
      end_of_previous = x.offset + x.bytes;
      t.entries.push_back(std::move(x));
    }
  } catch (const json::exception& e) {
    return bad(std::string{"malformed ("} + e.what() + ")");
  }
  return t;
}

caf::error check_version(const table& t, int64_t expected_version, const std::string& where) {
  if (t.version == expected_version)
    return {};
  return make_error(errc::version_mismatch,
                    where + ": holds version " + std::to_string(t.version) + ", expected " +
                        std::to_string(expected_version) +
                        (t.version < expected_version ? " (stale)" : " (already overwritten)"));
}

// Verifies each tensor's hash over `payload` (payload_bytes long) and makes
// views of it; `keepalive` lives as long as any view.
expected<received_weights> verify_and_view(const table& t, const uint8_t* payload,
                                           std::shared_ptr<void> keepalive,
                                           const std::string& where) {
  received_weights out;
  out.version = t.version;
  for (const auto& e : t.entries) {
    if (hash64(payload + e.offset, e.bytes) != e.hash)
      return make_error(errc::corrupted, where + ": version " + std::to_string(t.version) +
                                             ": tensor '" + e.name +
                                             "' does not match its checksum");
    auto type = *safetensors_scalar_type(e.dtype);
    auto keep = keepalive;
    auto view = guarded(where + ": tensor '" + e.name + "'", [&] {
      return at::from_blob(const_cast<uint8_t*>(payload + e.offset), e.shape,
                           [keep](void*) mutable { keep.reset(); },
                           at::TensorOptions().dtype(type).device(at::kCPU));
    });
    if (!view)
      return view.error();
    out.bytes += e.bytes;
    out.tensors.emplace(e.name, std::move(*view));
  }
  return out;
}

caf::error check_new_version(int64_t version, int64_t last, const std::string& where) {
  if (version < 0)
    return make_error(errc::invalid_argument,
                      where + ": version " + std::to_string(version) + " is negative");
  if (version <= last)
    return make_error(errc::version_mismatch, where + ": version " + std::to_string(version) +
                                                  " is not above the last published version " +
                                                  std::to_string(last));
  return {};
}

caf::error os_error(const std::string& what) {
  return make_error(errc::io_error, what + ": " + std::strerror(errno));
}

// Takes flock(op) on `fd`, retrying until `timeout_ms`.
bool lock_within(int fd, int op, int64_t timeout_ms) {
  auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
  auto pause = std::chrono::microseconds(50);
  while (true) {
    if (::flock(fd, op | LOCK_NB) == 0)
      return true;
    if (errno != EWOULDBLOCK && errno != EINTR)
      return false;
    if (clock_type::now() >= deadline)
      return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
}

// ---- alias -----------------------------------------------------------------------

struct alias_slot {
  const void* owner = nullptr;
  int64_t version = -1;
  tensor_map tensors;
};

std::mutex& alias_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, alias_slot>& alias_registry() {
  static std::map<std::string, alias_slot> r;
  return r;
}

class alias_transport final : public weight_transport {
public:
  explicit alias_transport(transport_options o) : opts_(std::move(o)) {}
  ~alias_transport() override {
    std::lock_guard guard{alias_mutex()};
    auto& reg = alias_registry();
    auto it = reg.find(opts_.channel);
    if (it != reg.end() && it->second.owner == this)
      reg.erase(it);
  }
  std::string kind() const override { return "alias"; }

  expected<void> publish(int64_t version, const tensor_map& tensors) override {
    auto where = "alias channel '" + opts_.channel + "'";
    if (auto err = check_new_version(version, last_, where))
      return err;
    std::lock_guard guard{alias_mutex()};
    auto& slot = alias_registry()[opts_.channel];
    if (slot.owner != nullptr && slot.owner != this)
      return make_error(errc::invalid_argument, where + " already has another publisher");
    slot.owner = this;
    slot.version = version;
    slot.tensors = tensors; // shares storage: zero copy
    last_ = version;
    return caf::unit;
  }

  expected<received_weights> receive(int64_t version) override {
    auto where = "alias channel '" + opts_.channel + "'";
    std::lock_guard guard{alias_mutex()};
    auto& reg = alias_registry();
    auto it = reg.find(opts_.channel);
    if (it == reg.end())
      return make_error(errc::not_found, where + ": nothing published");
    table t;
    t.version = it->second.version;
    if (auto err = check_version(t, version, where))
      return err;
    received_weights out;
    out.version = version;
    out.tensors = it->second.tensors;
    for (const auto& [name, x] : out.tensors)
      out.bytes += static_cast<uint64_t>(x.numel()) * x.element_size();
    return out;
  }

private:
  transport_options opts_;
  int64_t last_ = -1;
};

// ---- shared memory ---------------------------------------------------------------

// NOTE [shm layout]: slot s of channel c is the POSIX shared-memory object
// "/troupe.<c>.<s>", s = version mod keep. It holds a 4 KiB header page, then
// the tensor bytes (each at a 64-byte boundary), then the table (JSON). The
// publisher holds an exclusive flock on the object while it writes and sets
// `state` to complete last (release); a receiver takes a shared flock,
// checks magic, state, version, sizes and every hash, and keeps its lock
// while its views live, so a slot is never rewritten under a reader.
struct shm_header {
  char magic[8];
  std::atomic<uint64_t> state; // 0 being written, 1 complete
  int64_t version;
  uint64_t total_bytes;
  uint64_t data_offset;
  uint64_t data_bytes;
  uint64_t table_offset;
  uint64_t table_bytes;
  uint64_t table_hash;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
constexpr uint64_t shm_header_bytes = 4096;
static_assert(sizeof(shm_header) <= shm_header_bytes);
constexpr char shm_magic[8] = {'T', 'R', 'P', 'W', 'S', 'H', 'M', '1'};

struct mapping {
  void* addr = MAP_FAILED;
  size_t size = 0;
  mapping() = default;
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
  ~mapping() {
    if (addr != MAP_FAILED)
      ::munmap(addr, size);
  }
};

struct fd_holder {
  int fd = -1;
  explicit fd_holder(int f) : fd(f) {}
  fd_holder(const fd_holder&) = delete;
  fd_holder& operator=(const fd_holder&) = delete;
  ~fd_holder() {
    if (fd >= 0)
      ::close(fd); // also drops its flock
  }
};

class shm_transport final : public weight_transport {
public:
  explicit shm_transport(transport_options o) : opts_(std::move(o)) {
    slots_.resize(static_cast<size_t>(opts_.keep));
    maps_.resize(static_cast<size_t>(opts_.keep));
  }
  ~shm_transport() override {
    for (size_t s = 0; s < slots_.size(); ++s)
      if (slots_[s].created)
        ::shm_unlink(name(static_cast<int64_t>(s)).c_str());
  }
  std::string kind() const override { return "shm"; }

  expected<void> publish(int64_t version, const tensor_map& tensors) override {
    auto where = "shm channel '" + opts_.channel + "'";
    if (auto err = check_new_version(version, last_, where))
      return err;
    auto ps = prepare(tensors, where);
    if (!ps)
      return ps.error();
    auto data_bytes = payload_size(*ps);
    // The table's length does not depend on the hashes (fixed-width hex).
    auto table_len = encode_table(version, *ps).size();
    auto data_offset = shm_header_bytes;
    auto table_offset = align_up(data_offset + data_bytes, data_alignment);
    auto total = table_offset + table_len;

    auto s = static_cast<size_t>(version % opts_.keep);
    auto& slot = slots_[s];
    auto seg = name(static_cast<int64_t>(s));
    if (!slot.fd) {
      int fd = ::shm_open(seg.c_str(), O_RDWR | O_CREAT, 0600);
      if (fd < 0)
        return os_error(where + ": cannot create " + seg);
      slot.fd = std::make_unique<fd_holder>(fd);
      slot.created = true;
    }
    int fd = slot.fd->fd;
    if (!lock_within(fd, LOCK_EX, opts_.timeout_ms))
      return make_error(errc::timeout, where + ": a receiver still holds slot " +
                                           std::to_string(s) + " after " +
                                           std::to_string(opts_.timeout_ms) +
                                           " ms (receivers must drop received weights)");
    struct unlock {
      int fd;
      ~unlock() { ::flock(fd, LOCK_UN); }
    } unlock_guard{fd};
    // Re-size when the layout changed, or when someone else changed the
    // object's size (writing past its end would raise SIGBUS).
    struct stat st {};
    if (::fstat(fd, &st) != 0)
      return os_error(where + ": cannot stat " + seg);
    if (!slot.map || slot.map->size != total || static_cast<uint64_t>(st.st_size) != total) {
      slot.map.reset();
      if (::ftruncate(fd, static_cast<off_t>(total)) != 0)
        return os_error(where + ": cannot size " + seg + " to " + std::to_string(total) + " bytes");
      auto m = std::make_unique<mapping>();
      m->addr = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
      if (m->addr == MAP_FAILED)
        return os_error(where + ": cannot map " + seg);
      m->size = total;
      slot.map = std::move(m);
    }
    auto* base = static_cast<uint8_t*>(slot.map->addr);
    auto* h = reinterpret_cast<shm_header*>(base);
    h->state.store(0, std::memory_order_release);
    copy_in(*ps, base + data_offset);
    auto text = encode_table(version, *ps);
    std::memcpy(base + table_offset, text.data(), text.size());
    std::memcpy(h->magic, shm_magic, sizeof shm_magic);
    h->version = version;
    h->total_bytes = total;
    h->data_offset = data_offset;
    h->data_bytes = data_bytes;
    h->table_offset = table_offset;
    h->table_bytes = text.size();
    h->table_hash = hash64(text.data(), text.size());
    h->state.store(1, std::memory_order_release);
    last_ = version;
    return caf::unit;
  }

  expected<received_weights> receive(int64_t version) override {
    auto where = "shm channel '" + opts_.channel + "'";
    if (version < 0)
      return make_error(errc::invalid_argument, where + ": version " + std::to_string(version));
    auto s = version % opts_.keep;
    auto seg = name(s);
    int raw = ::shm_open(seg.c_str(), O_RDONLY, 0);
    if (raw < 0) {
      if (errno == ENOENT)
        return make_error(errc::not_found, where + ": nothing published in slot " +
                                               std::to_string(s) + " (for version " +
                                               std::to_string(version) + ")");
      return os_error(where + ": cannot open " + seg);
    }
    // The lock lives with the views: a fresh descriptor per receive.
    auto lock = std::make_shared<fd_holder>(raw);
    if (!lock_within(raw, LOCK_SH, opts_.timeout_ms))
      return make_error(errc::timeout, where + ": the publisher is still writing slot " +
                                           std::to_string(s) + " after " +
                                           std::to_string(opts_.timeout_ms) + " ms");
    struct stat st {};
    if (::fstat(raw, &st) != 0)
      return os_error(where + ": cannot stat " + seg);
    auto size = static_cast<uint64_t>(st.st_size);
    if (size < shm_header_bytes)
      return make_error(errc::corrupted, where + ": segment " + seg + " has " +
                                             std::to_string(size) +
                                             " bytes, less than its header (truncated)");
    // Mapping 400 MB costs as much as verifying it: keep one mapping per
    // slot while the object (same inode) keeps its size.
    auto& cached = maps_[static_cast<size_t>(s)];
    if (!cached.map || cached.dev != st.st_dev || cached.ino != st.st_ino || cached.map->size != size) {
      // Mapped through its own descriptor: a mapping keeps its open file
      // alive, and with it any flock taken on that descriptor.
      int map_fd = ::shm_open(seg.c_str(), O_RDONLY, 0);
      if (map_fd < 0)
        return os_error(where + ": cannot open " + seg);
      fd_holder map_fd_guard{map_fd};
      auto fresh = std::make_shared<mapping>();
      fresh->addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_POPULATE, map_fd, 0);
      if (fresh->addr == MAP_FAILED)
        return os_error(where + ": cannot map " + seg);
      fresh->size = size;
      cached = {st.st_dev, st.st_ino, std::move(fresh)};
    }
    auto m = cached.map;
    const auto* base = static_cast<const uint8_t*>(m->addr);
    const auto* h = reinterpret_cast<const shm_header*>(base);
    if (std::memcmp(h->magic, shm_magic, sizeof shm_magic) != 0)
      return make_error(errc::corrupted, where + ": segment " + seg + " has no troupe header");
    if (h->state.load(std::memory_order_acquire) != 1)
      return make_error(errc::corrupted, where + ": version " + std::to_string(h->version) +
                                             " in slot " + std::to_string(s) +
                                             " is partial (its publisher did not finish)");
    table t;
    t.version = h->version;
    if (auto err = check_version(t, version, where))
      return err;
    if (h->total_bytes > size)
      return make_error(errc::corrupted, where + ": version " + std::to_string(version) +
                                             " is truncated: " + std::to_string(size) +
                                             " bytes of " + std::to_string(h->total_bytes));
    if (h->data_offset < shm_header_bytes || h->data_offset > h->total_bytes ||
        h->data_bytes > h->total_bytes - h->data_offset || h->table_offset > h->total_bytes ||
        h->table_bytes > h->total_bytes - h->table_offset)
      return make_error(errc::corrupted, where + ": version " + std::to_string(version) +
                                             ": header ranges lie outside the segment");
    std::string_view text(reinterpret_cast<const char*>(base + h->table_offset), h->table_bytes);
    if (hash64(text.data(), text.size()) != h->table_hash)
      return make_error(errc::corrupted,
                        where + ": version " + std::to_string(version) + ": table checksum differs");
    auto decoded = decode_table(text, where);
    if (!decoded)
      return decoded.error();
    if (auto err = check_version(*decoded, version, where))
      return err;
    if (decoded->payload_bytes != h->data_bytes)
      return make_error(errc::corrupted, where + ": version " + std::to_string(version) +
                                             ": table and header disagree on the payload size");
    auto keep = std::make_shared<std::pair<std::shared_ptr<fd_holder>, std::shared_ptr<mapping>>>(
        lock, m);
    return verify_and_view(*decoded, base + h->data_offset, keep, where);
  }

private:
  std::string name(int64_t slot) const {
    return shm_segment_name(opts_.channel, slot);
  }

  struct slot_state {
    std::unique_ptr<fd_holder> fd;
    std::unique_ptr<mapping> map;
    bool created = false;
  };

  struct cached_map {
    dev_t dev = 0;
    ino_t ino = 0;
    std::shared_ptr<mapping> map;
  };

  transport_options opts_;
  int64_t last_ = -1;
  std::vector<slot_state> slots_; // publishing side
  std::vector<cached_map> maps_;  // receiving side
};

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
  std::string kind() const override { return "disk"; }

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

// ---- broadcast -------------------------------------------------------------------

// NOTE [broadcast wire]: the root broadcasts, in order, (1) an int64 tensor
// {magic, version, table length, payload bytes}, (2) the table as uint8,
// (3) the payload in consecutive slices of at most bucket_bytes. Receivers
// take part in every step before judging what they got, so a rejected
// version never leaves the group out of step.
constexpr int64_t wire_magic = 0x5452505742434131; // "TRPWBCA1"

class broadcast_transport final : public weight_transport {
public:
  explicit broadcast_transport(transport_options o) : opts_(std::move(o)) {}
  std::string kind() const override { return "broadcast"; }

  expected<void> publish(int64_t version, const tensor_map& tensors) override {
    auto where = where_str();
    if (opts_.group->rank() != opts_.root)
      return make_error(errc::invalid_argument, where + ": publish on rank " +
                                                    std::to_string(opts_.group->rank()) +
                                                    ", but the root is " + std::to_string(opts_.root));
    if (auto err = check_new_version(version, last_, where))
      return err;
    auto ps = prepare(tensors, where);
    if (!ps)
      return ps.error();
    auto total = static_cast<int64_t>(payload_size(*ps));
    // The send buffer is reused: fresh pages would cost as much as the copy.
    if (!send_buf_.defined() || send_buf_.numel() != total) {
      auto fresh = guarded(where, [&] { return at::empty({total}, at::kByte); });
      if (!fresh)
        return fresh.error();
      send_buf_ = std::move(*fresh);
    }
    copy_in(*ps, send_buf_.data_ptr<uint8_t>());
    auto text = encode_table(version, *ps);
    if (auto ok = send(version, text, send_buf_); !ok)
      return ok.error();
    last_ = version;
    return caf::unit;
  }

  expected<received_weights> receive(int64_t version) override {
    auto where = where_str();
    if (opts_.group->rank() == opts_.root)
      return make_error(errc::invalid_argument,
                        where + ": receive on the root rank " + std::to_string(opts_.root));
    auto head = guarded(where, [] { return at::zeros({4}, at::kLong); });
    if (!head)
      return head.error();
    if (auto ok = opts_.group->broadcast(*head, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": table header");
    const auto* hp = head->data_ptr<int64_t>();
    if (hp[0] != wire_magic || hp[2] < 0 || hp[3] < 0)
      return make_error(errc::corrupted, where + ": the root sent no troupe weight header "
                                                 "(the group is out of step)");
    auto text = guarded(where, [&] { return at::empty({hp[2]}, at::kByte); });
    if (!text)
      return text.error();
    if (auto ok = opts_.group->broadcast(*text, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": table");
    // Reuse the last receive buffer when nothing received from it lives on.
    if (!recv_buf_.defined() || recv_buf_.numel() != hp[3] ||
        recv_buf_.storage().use_count() != 1) {
      auto fresh = guarded(where, [&] { return at::empty({hp[3]}, at::kByte); });
      if (!fresh)
        return fresh.error();
      recv_buf_ = std::move(*fresh);
    }
    auto flat = recv_buf_;
    if (auto ok = for_buckets(flat); !ok)
      return ok.error();
    // Everything is in: now judge it.
    auto decoded = decode_table(
        std::string_view(reinterpret_cast<const char*>(text->data_ptr<uint8_t>()),
                         static_cast<size_t>(hp[2])),
        where);
    if (!decoded)
      return decoded.error();
    if (hp[1] != decoded->version)
      return make_error(errc::corrupted, where + ": header and table disagree on the version");
    if (auto err = check_version(*decoded, version, where))
      return err;
    if (decoded->payload_bytes != static_cast<uint64_t>(hp[3]))
      return make_error(errc::corrupted,
                        where + ": version " + std::to_string(version) + ": the table describes " +
                            std::to_string(decoded->payload_bytes) + " payload bytes, " +
                            std::to_string(hp[3]) + " arrived (truncated)");
    auto keep = std::make_shared<at::Tensor>(flat);
    return verify_and_view(*decoded, flat.data_ptr<uint8_t>(), keep, where);
  }

private:
  expected<void> send(int64_t version, const std::string& text, at::Tensor& flat) {
    auto where = where_str();
    auto head = guarded(where, [&] {
      return at::tensor(std::vector<int64_t>{wire_magic, version,
                                             static_cast<int64_t>(text.size()), flat.numel()},
                        at::kLong);
    });
    if (!head)
      return head.error();
    if (auto ok = opts_.group->broadcast(*head, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": table header");
    auto t = guarded(where, [&] {
      return at::from_blob(const_cast<char*>(text.data()), {static_cast<int64_t>(text.size())},
                           at::kByte)
          .clone();
    });
    if (!t)
      return t.error();
    if (auto ok = opts_.group->broadcast(*t, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": table");
    return for_buckets(flat);
  }

  std::string where_str() const {
    return "broadcast channel '" + opts_.channel + "' (rank " +
           std::to_string(opts_.group->rank()) + ")";
  }

  expected<void> for_buckets(at::Tensor& flat) {
    auto n = flat.numel();
    for (int64_t off = 0; off < n; off += opts_.bucket_bytes) {
      auto len = std::min<int64_t>(opts_.bucket_bytes, n - off);
      auto slice = flat.narrow(0, off, len);
      if (auto ok = opts_.group->broadcast(slice, opts_.root); !ok)
        return with_prefix(ok.error(), where_str() + ": bucket at byte " + std::to_string(off));
    }
    return caf::unit;
  }

  transport_options opts_;
  int64_t last_ = -1;
  at::Tensor send_buf_;
  at::Tensor recv_buf_;
};

bool valid_channel(const std::string& c) {
  return !c.empty() && c.size() <= 200 && std::all_of(c.begin(), c.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-';
  }) && c != "." && c != "..";
}

} // namespace

std::vector<std::string> weight_transport_kinds() {
  return {"alias", "shm", "broadcast", "disk"};
}

expected<std::unique_ptr<weight_transport>>
make_weight_transport(const transport_options& options) {
  if (!valid_channel(options.channel))
    return make_error(errc::invalid_argument,
                      "weight transport: channel '" + options.channel +
                          "' must be 1-200 letters, digits, '.', '_' or '-'");
  if (options.keep < 1)
    return make_error(errc::invalid_argument, "weight transport: keep must be at least 1");
  if (options.timeout_ms <= 0)
    return make_error(errc::invalid_argument, "weight transport: timeout_ms must be positive");
  if (options.kind == "alias")
    return std::unique_ptr<weight_transport>(new alias_transport(options));
  if (options.kind == "cuda_ipc") {
#ifdef TROUPE_RUNTIME_CUDA_IPC
    return make_cuda_ipc_transport(options);
#else
    return make_error(errc::invalid_argument,
                      "weight transport cuda_ipc: this build has no CUDA (nvcc was not found)");
#endif
  }
  if (options.kind == "shm")
    return std::unique_ptr<weight_transport>(new shm_transport(options));
  if (options.kind == "disk") {
    if (options.dir.empty())
      return make_error(errc::invalid_argument, "weight transport disk: dir is empty");
    return std::unique_ptr<weight_transport>(new disk_transport(options));
  }
  if (options.kind == "broadcast") {
    if (options.group == nullptr)
      return make_error(errc::invalid_argument, "weight transport broadcast: no process group");
    if (options.root < 0 || options.root >= options.group->size())
      return make_error(errc::invalid_argument,
                        "weight transport broadcast: root " + std::to_string(options.root) +
                            " is not a rank of a group of " + std::to_string(options.group->size()));
    if (options.bucket_bytes < 1)
      return make_error(errc::invalid_argument,
                        "weight transport broadcast: bucket_bytes must be positive");
    return std::unique_ptr<weight_transport>(new broadcast_transport(options));
  }
  return make_error(errc::invalid_argument, "weight transport: unknown kind '" + options.kind +
                                                "' (known: alias, shm, broadcast, disk, cuda_ipc)");
}

} // namespace troupe::runtime
