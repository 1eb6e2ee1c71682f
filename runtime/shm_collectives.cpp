#include "runtime/shm_collectives.hpp"

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace troupe::runtime {

namespace {

constexpr int64_t line = 64;

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

  static int64_t size_for(int ranks, int64_t slot) { return ranks * line + 2 * ranks * slot; }
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

class shm_backend final : public collective_backend {
public:
  shm_backend(std::unique_ptr<collective_backend> inner, std::unique_ptr<shm_segment> seg,
              int64_t slot, std::chrono::milliseconds timeout)
      : inner_(std::move(inner)), seg_(std::move(seg)), slot_(slot), timeout_(timeout) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

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
  expected<std::unique_ptr<collective_backend>> subgroup(const std::string& name,
                                                         const std::vector<int>& ranks) override {
    return inner_->subgroup(name, ranks); // a sub-group sums over the wrapped one's transport
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

  std::unique_ptr<collective_backend> inner_;
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

expected<process_group> with_shm_collectives(process_group group, store& rendezvous,
                                             const std::string& name, int64_t slot_bytes,
                                             int64_t timeout_ms) {
  if (slot_bytes < line || slot_bytes % line != 0)
    return make_error(errc::invalid_argument,
                      "shm collectives: slot_bytes must be a positive multiple of 64");
  const int ranks = group.size(), me = group.rank();
  const auto bytes = shm_segment::size_for(ranks, slot_bytes);
  const std::string key = "shm-collectives/" + name;
  std::string segment;
  if (me == 0) {
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
      return with_prefix(got.error(), "shm collectives: the segment's name");
    segment = *got;
  }
  auto mapped = map_segment(segment, bytes, false);
  // Every rank has mapped it (or failed) before rank 0 unlinks the name.
  auto met = group.barrier();
  if (me == 0)
    ::shm_unlink(segment.c_str());
  if (!mapped)
    return mapped.error();
  auto seg = std::make_unique<shm_segment>(*mapped, bytes, ranks, slot_bytes);
  if (!met)
    return met.error();
  auto inner = std::move(group).release_backend();
  return process_group{std::make_unique<shm_backend>(std::move(inner), std::move(seg), slot_bytes,
                                                     std::chrono::milliseconds{timeout_ms})};
}

} // namespace troupe::runtime
