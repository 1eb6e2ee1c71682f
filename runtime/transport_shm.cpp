// The shm weight transport: POSIX shared memory on one host.
#include "runtime/transport_detail.hpp"

#include "runtime/hash.hpp"
#include "runtime/torch_guard.hpp"

#include <ATen/ATen.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace troupe::runtime {

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

namespace transport_detail {
namespace {

// ---- shared memory ---------------------------------------------------------------

// NOTE [shm layout]: slot s of channel c is the POSIX shared-memory object
// "/troupe.<c>.<s>", s = version mod keep. It holds a 4 KiB header page, then
// the tensor bytes (each at a 64-byte boundary), then the table (JSON). The
// publisher holds an exclusive flock on the object while it writes and sets
// `state` to complete last (release); a receiver takes a shared flock,
// checks magic, state, version, sizes and every hash, and keeps its lock
// while its views live, so a slot is never rewritten under a reader.
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
  transport_kind kind() const override { return transport_kind::shm; }

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
    if (size < shm_header_bytes) // (read_shm_segment says so with the details)
      return read_shm_segment(nullptr, size, version, where, seg).error();
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
    auto read = read_shm_segment(base, size, version, where, seg);
    if (!read)
      return read.error();
    auto keep = std::make_shared<std::pair<std::shared_ptr<fd_holder>, std::shared_ptr<mapping>>>(
        lock, m);
    return verify_and_view(read->t, base + read->data_offset, keep, where);
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

} // namespace

std::unique_ptr<weight_transport> make_shm_transport(const transport_options& options) {
  return std::make_unique<shm_transport>(options);
}

} // namespace transport_detail
} // namespace troupe::runtime
