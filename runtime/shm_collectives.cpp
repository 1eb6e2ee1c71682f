#include "runtime/shm_collectives.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace troupe::runtime {

namespace {

constexpr int64_t line = shm_line_bytes;

// The mapped segment: a flag a rank (a cache line each), then two buffers
// of a slot a rank.
class shm_segment {
public:
  shm_segment(void* base, int64_t bytes, int ranks, int64_t slot)
      : base_(static_cast<char*>(base)), bytes_(bytes), ranks_(ranks), slot_(slot) {}
  ~shm_segment() {
    if (base_)
      ::munmap(base_, static_cast<size_t>(bytes_));
  }
  shm_segment(const shm_segment&) = delete;
  shm_segment& operator=(const shm_segment&) = delete;

  std::atomic<uint64_t>& flag(int rank) {
    return *reinterpret_cast<std::atomic<uint64_t>*>(base_ + rank * line);
  }
  char* slot(uint64_t call, int rank) {
    return base_ + ranks_ * line + (static_cast<int64_t>(call & 1) * ranks_ + rank) * slot_;
  }

private:
  char* base_;
  int64_t bytes_;
  int ranks_;
  int64_t slot_;
};

// A backend that hands every call to the group it wraps; the shared-memory
// backends below override the calls they take over.
class forwarding_backend : public collective_backend {
public:
  explicit forwarding_backend(std::unique_ptr<collective_backend> inner)
      : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  uint64_t identity() const override { return inner_->identity(); }
  expected<void> all_reduce(at::Tensor& t, reduce_op op) override {
    return inner_->all_reduce(t, op);
  }
  expected<void> all_gather(at::Tensor& in, at::Tensor& out) override {
    return inner_->all_gather(in, out);
  }
  expected<void> broadcast(at::Tensor& t, int root) override { return inner_->broadcast(t, root); }
  expected<void> reduce(at::Tensor& t, int root, reduce_op op) override {
    return inner_->reduce(t, root, op);
  }
  expected<void> gather(at::Tensor& in, std::vector<at::Tensor>& out, int root) override {
    return inner_->gather(in, out, root);
  }
  expected<void> scatter(std::vector<at::Tensor>& in, at::Tensor& out, int root) override {
    return inner_->scatter(in, out, root);
  }
  expected<void> all_to_all(at::Tensor& in, at::Tensor& out) override {
    return inner_->all_to_all(in, out);
  }
  expected<void> barrier() override { return inner_->barrier(); }
  expected<void> reduce_scatter(at::Tensor& in, at::Tensor& out, reduce_op op) override {
    return inner_->reduce_scatter(in, out, op);
  }
  expected<std::unique_ptr<pending_transfer>> start_send(at::Tensor& t, int dst, int tag) override {
    return inner_->start_send(t, dst, tag);
  }
  expected<std::unique_ptr<pending_transfer>> start_recv(at::Tensor& t, int src, int tag) override {
    return inner_->start_recv(t, src, tag);
  }
  // A sub-group communicates over the wrapped one's transport.
  expected<std::unique_ptr<collective_backend>> subgroup(const std::string& name,
                                                         const std::vector<int>& ranks) override {
    return inner_->subgroup(name, ranks);
  }

protected:
  std::unique_ptr<collective_backend> inner_;
};

class shm_backend final : public forwarding_backend {
public:
  shm_backend(std::unique_ptr<collective_backend> inner, std::unique_ptr<shm_segment> seg,
              int64_t slot, std::chrono::milliseconds timeout)
      : forwarding_backend(std::move(inner)), seg_(std::move(seg)), slot_(slot),
        timeout_(timeout) {}

  expected<void> all_reduce(at::Tensor& t, reduce_op op) override {
    if (op != reduce_op::sum || t.scalar_type() != at::kFloat || !t.is_contiguous() ||
        !t.device().is_cpu() || static_cast<int64_t>(t.nbytes()) > slot_)
      return inner_->all_reduce(t, op);
    const auto call = publish(t);
    if (auto ok = wait_for_all(call, "all_reduce"); !ok)
      return ok;
    auto* out = t.data_ptr<float>();
    const auto n = t.numel();
    std::memcpy(out, seg_->slot(call, 0), static_cast<size_t>(n) * sizeof(float));
    for (int r = 1; r < size(); ++r) {
      const auto* in = reinterpret_cast<const float*>(seg_->slot(call, r));
      for (int64_t i = 0; i < n; ++i)
        out[i] += in[i];
    }
    return {};
  }

  expected<void> all_gather(at::Tensor& input, at::Tensor& output) override {
    if (!input.is_contiguous() || !output.is_contiguous() || !input.device().is_cpu() ||
        static_cast<int64_t>(input.nbytes()) > slot_)
      return inner_->all_gather(input, output);
    const auto call = publish(input);
    if (auto ok = wait_for_all(call, "all_gather"); !ok)
      return ok;
    const auto bytes = input.nbytes();
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<char*>(output.data_ptr()) + static_cast<size_t>(r) * bytes,
                  seg_->slot(call, r), bytes);
    return {};
  }


private:
  // Writes `t` into this rank's slot of the next call and publishes it.
  uint64_t publish(const at::Tensor& t) {
    const auto call = ++calls_;
    std::memcpy(seg_->slot(call, rank()), t.data_ptr(), t.nbytes());
    seg_->flag(rank()).store(call, std::memory_order_release);
    return call;
  }

  // Until every rank has published `call`: spins, then yields the core.
  expected<void> wait_for_all(uint64_t call, const char* op) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (int r = 0; r < size(); ++r)
      for (int64_t spins = 0; seg_->flag(r).load(std::memory_order_acquire) < call; ++spins) {
        if (spins < 4096)
          continue;
        std::this_thread::yield();
        if ((spins & 1023) == 0 && std::chrono::steady_clock::now() > deadline)
          return make_error(errc::timeout, std::string{"shm "} + op + ": rank " +
                                               std::to_string(r) + " did not come within " +
                                               std::to_string(timeout_.count()) + " ms");
      }
    return {};
  }

  std::unique_ptr<shm_segment> seg_;
  int64_t slot_;
  std::chrono::milliseconds timeout_;
  uint64_t calls_ = 0;
};

// Maps the segment named `name` (created when `create`); its bytes.
expected<void*> map_segment(const std::string& name, int64_t bytes, bool create) {
  const int fd = ::shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0)
    return make_error(errc::unavailable,
                      "shm collectives: shm_open " + name + ": " + std::strerror(errno));
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const auto why = std::string{std::strerror(errno)};
    ::close(fd);
    ::shm_unlink(name.c_str());
    return make_error(errc::unavailable, "shm collectives: sizing " + name + ": " + why);
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED)
    return make_error(errc::unavailable,
                      "shm collectives: mapping " + name + ": " + std::strerror(errno));
  return p;
}

} // namespace

namespace {

// Every rank of `group` maps one new zeroed segment of `bytes`: rank 0
// creates it under a fresh name and sets the name under `key` on
// `rendezvous`; the others map it; the name is unlinked once every rank has
// mapped it (or failed), so a crashed rank leaves nothing behind.
expected<void*> map_shared(process_group& group, store& rendezvous, const std::string& key,
                           int64_t bytes) {
  std::string segment;
  if (group.rank() == 0) {
    static std::atomic<int> made{0};
    segment = "/troupe.collectives." + std::to_string(::getpid()) + "." + std::to_string(made++);
    auto p = map_segment(segment, bytes, true);
    if (!p)
      return p.error();
    std::memset(*p, 0, static_cast<size_t>(bytes));
    ::munmap(*p, static_cast<size_t>(bytes));
    if (auto ok = rendezvous.set(key, segment); !ok) {
      ::shm_unlink(segment.c_str());
      return ok.error();
    }
  } else {
    auto got = rendezvous.get(key);
    if (!got)
      return with_prefix(got.error(), "shm: the segment's name");
    segment = *got;
  }
  auto mapped = map_segment(segment, bytes, false);
  auto met = group.barrier();
  if (group.rank() == 0)
    ::shm_unlink(segment.c_str());
  if (mapped && !met)
    ::munmap(*mapped, static_cast<size_t>(bytes));
  if (!mapped)
    return mapped.error();
  if (!met)
    return met.error();
  return *mapped;
}

// NOTE [shm point-to-point]: a mailbox of `slots` slots for each ordered
// pair of neighbours (src, src ± 1); a slot is a header line and its
// payload.
struct slot_header {
  std::atomic<uint64_t> seq; // 0: free; else the sender's sequence number
  int64_t tag;
  int64_t bytes;
};
static_assert(sizeof(slot_header) <= line);

class shm_p2p_backend final : public forwarding_backend {
public:
  shm_p2p_backend(std::unique_ptr<collective_backend> inner, void* base, int64_t bytes,
                  int64_t slot, int slots, std::chrono::milliseconds timeout)
      : forwarding_backend(std::move(inner)), base_(static_cast<char*>(base)), bytes_(bytes),
        slot_(slot),
        slots_(slots), timeout_(timeout), sent_(static_cast<size_t>(inner_->size()), 0) {}
  ~shm_p2p_backend() override { ::munmap(base_, static_cast<size_t>(bytes_)); }


  expected<std::unique_ptr<pending_transfer>> start_send(at::Tensor& t, int dst, int tag) override {
    if (!fits(t) || mailbox(rank(), dst) < 0)
      return inner_->start_send(t, dst, tag);
    if (auto ok = put(t, dst, tag); !ok)
      return ok.error();
    return std::unique_ptr<pending_transfer>(new done_transfer());
  }
  expected<std::unique_ptr<pending_transfer>> start_recv(at::Tensor& t, int src, int tag) override {
    if (!fits(t) || mailbox(src, rank()) < 0)
      return inner_->start_recv(t, src, tag);
    return std::unique_ptr<pending_transfer>(new shm_receive(*this, t, src, tag));
  }


private:
  struct done_transfer final : pending_transfer {
    expected<void> wait() override { return {}; }
  };
  struct shm_receive final : pending_transfer {
    shm_receive(shm_p2p_backend& b, const at::Tensor& t, int src, int tag)
        : b(b), t(t), src(src), tag(tag) {}
    expected<void> wait() override { return b.take(t, src, tag); }
    shm_p2p_backend& b;
    at::Tensor t; // shares the caller's storage
    int src, tag;
  };

  bool fits(const at::Tensor& t) const {
    return t.is_contiguous() && t.device().is_cpu() && static_cast<int64_t>(t.nbytes()) <= slot_;
  }
  slot_header& header(int src, int dst, int k) {
    return *reinterpret_cast<slot_header*>(address(src, dst, k));
  }
  char* payload(int src, int dst, int k) { return address(src, dst, k) + line; }
  char* address(int src, int dst, int k) {
    return base_ + (static_cast<int64_t>(mailbox(src, dst)) * slots_ + k) * (line + slot_);
  }
  // The pair's mailbox: 2s for s -> s + 1, 2s + 1 for s + 1 -> s; -1 for
  // ranks that are not neighbours (their transfers go to the wrapped group).
  int mailbox(int src, int dst) const {
    if (src < 0 || dst < 0 || src >= size() || dst >= size())
      return -1;
    if (dst == src + 1)
      return 2 * src;
    if (src == dst + 1)
      return 2 * dst + 1;
    return -1;
  }

  // Waits a round: spins, then yields the core, then sleeps 20 us at a
  // time (a long wait: the neighbour is computing); false past the timeout.
  class backoff {
  public:
    explicit backoff(std::chrono::milliseconds timeout)
        : start_(std::chrono::steady_clock::now()), timeout_(timeout) {}
    bool next() {
      if (++spins_ < 4096)
        return true;
      const auto waited = std::chrono::steady_clock::now() - start_;
      if (waited > timeout_)
        return false;
      if (waited < std::chrono::milliseconds(2))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      return true;
    }

  private:
    std::chrono::steady_clock::time_point start_;
    std::chrono::milliseconds timeout_;
    int64_t spins_ = 0;
  };

  expected<void> put(const at::Tensor& t, int dst, int tag) {
    const int me = rank();
    for (backoff wait{timeout_};;) {
      for (int k = 0; k < slots_; ++k) {
        auto& h = header(me, dst, k);
        if (h.seq.load(std::memory_order_acquire) != 0)
          continue;
        std::memcpy(payload(me, dst, k), t.data_ptr(), t.nbytes());
        h.tag = tag;
        h.bytes = static_cast<int64_t>(t.nbytes());
        h.seq.store(++sent_[static_cast<size_t>(dst)], std::memory_order_release);
        return {};
      }
      if (!wait.next())
        return make_error(errc::timeout, "shm send to rank " + std::to_string(dst) + " (tag " +
                                             std::to_string(tag) + "): its " +
                                             std::to_string(slots_) + " slots stayed full for " +
                                             std::to_string(timeout_.count()) + " ms");
    }
  }

  expected<void> take(at::Tensor& t, int src, int tag) {
    const int me = rank();
    for (backoff wait{timeout_};;) {
      int best = -1;
      uint64_t oldest = 0;
      for (int k = 0; k < slots_; ++k) {
        auto& h = header(src, me, k);
        const auto seq = h.seq.load(std::memory_order_acquire);
        if (seq != 0 && h.tag == tag && (best < 0 || seq < oldest)) {
          best = k;
          oldest = seq;
        }
      }
      if (best >= 0) {
        auto& h = header(src, me, best);
        if (h.bytes != static_cast<int64_t>(t.nbytes()))
          return make_error(errc::invalid_argument,
                            "shm receive from rank " + std::to_string(src) + " (tag " +
                                std::to_string(tag) + "): " + std::to_string(h.bytes) +
                                " bytes sent, " + std::to_string(t.nbytes()) + " expected");
        std::memcpy(t.data_ptr(), payload(src, me, best), t.nbytes());
        h.seq.store(0, std::memory_order_release);
        return {};
      }
      if (!wait.next())
        return make_error(errc::timeout, "shm receive from rank " + std::to_string(src) + " (tag " +
                                             std::to_string(tag) + "): nothing came within " +
                                             std::to_string(timeout_.count()) + " ms");
    }
  }

  char* base_;
  int64_t bytes_;
  int64_t slot_;
  int slots_;
  std::chrono::milliseconds timeout_;
  std::vector<uint64_t> sent_; // per destination
};

} // namespace

expected<process_group> with_shm_point_to_point(process_group group, store& rendezvous,
                                                const std::string& name, int64_t slot_bytes,
                                                int slots, int64_t timeout_ms) {
  if (slot_bytes < line || slot_bytes % line != 0 || slots < 1)
    return make_error(errc::invalid_argument,
                      "shm point-to-point: slot_bytes must be a positive multiple of 64 and "
                      "slots >= 1");
  const auto bytes = shm_point_to_point_bytes(group.size(), slot_bytes, slots);
  auto mapped = map_shared(group, rendezvous, "shm-p2p/" + name, bytes);
  if (!mapped)
    return mapped.error();
  auto inner = std::move(group).release_backend();
  return process_group{std::make_unique<shm_p2p_backend>(
      std::move(inner), *mapped, bytes, slot_bytes, slots, std::chrono::milliseconds{timeout_ms})};
}

expected<process_group> with_shm_collectives(process_group group, store& rendezvous,
                                             const std::string& name, int64_t slot_bytes,
                                             int64_t timeout_ms) {
  if (slot_bytes < line || slot_bytes % line != 0)
    return make_error(errc::invalid_argument,
                      "shm collectives: slot_bytes must be a positive multiple of 64");
  const int ranks = group.size();
  const auto bytes = shm_collectives_bytes(ranks, slot_bytes);
  auto mapped = map_shared(group, rendezvous, "shm-collectives/" + name, bytes);
  if (!mapped)
    return mapped.error();
  auto seg = std::make_unique<shm_segment>(*mapped, bytes, ranks, slot_bytes);
  auto inner = std::move(group).release_backend();
  return process_group{std::make_unique<shm_backend>(std::move(inner), std::move(seg), slot_bytes,
                                                     std::chrono::milliseconds{timeout_ms})};
}

} // namespace troupe::runtime
