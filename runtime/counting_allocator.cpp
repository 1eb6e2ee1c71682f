#include "runtime/counting_allocator.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

namespace troupe::runtime {

namespace {

thread_local int thread_tag = -1;

// Slot kTags counts what has no tag.
std::array<std::atomic<int64_t>, counting_allocator::kTags + 1> current_bytes{};
std::array<std::atomic<int64_t>, counting_allocator::kTags + 1> peak_bytes{};

size_t slot(int tag) {
  return tag >= 0 && tag < counting_allocator::kTags
             ? static_cast<size_t>(tag)
             : static_cast<size_t>(counting_allocator::kTags);
}

// Bytes allocated (or freed: negative) under `tag`.
void count(int tag, int64_t bytes) {
  auto s = slot(tag);
  const int64_t now = current_bytes[s].fetch_add(bytes) + bytes;
  for (int64_t p = peak_bytes[s].load(); now > p && !peak_bytes[s].compare_exchange_weak(p, now);) {
  }
}

// A counted storage: a header of what it was counted as, then the data.
// The DataPtr's context is the data pointer itself, as LibTorch's
// raw_allocate requires (oneDNN's bf16 matmul allocates through it).
constexpr size_t kHeader = 64; // keeps the data 64-byte aligned
struct header {
  int tag;
  int64_t bytes;
};

void free_counted(void* data) {
  auto* base = static_cast<char*>(data) - kHeader;
  const auto* h = reinterpret_cast<header*>(base);
  count(h->tag, -h->bytes);
  std::free(base);
}

class counting_cpu_allocator final : public c10::Allocator {
public:
  // LibTorch 1.13 declares allocate const, 2.x (2.3 on) not: one of these
  // two overrides it.
  c10::DataPtr allocate(size_t n) const { return counted_allocation(n); }
  c10::DataPtr allocate(size_t n) { return counted_allocation(n); }
  // Pure in LibTorch 2.x; unused by 1.13.
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }

private:
  c10::DataPtr counted_allocation(size_t n) const {
    void* base = nullptr;
    if (posix_memalign(&base, kHeader, kHeader + std::max<size_t>(n, 1)) != 0)
      throw std::bad_alloc();
    auto* h = static_cast<header*>(base);
    h->tag = thread_tag;
    h->bytes = static_cast<int64_t>(n);
    count(h->tag, h->bytes);
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &free_counted, c10::Device(c10::DeviceType::CPU)};
  }
};

} // namespace

counting_allocator& counting_allocator::install() {
  static counting_allocator counter;
  static std::once_flag once;
  std::call_once(once, [] {
    static counting_cpu_allocator allocator;
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
  });
  return counter;
}

void counting_allocator::set_thread_tag(int tag) {
  thread_tag = tag;
}

allocation_counts counting_allocator::counts(int tag) const {
  auto s = slot(tag);
  return {current_bytes[s].load(), peak_bytes[s].load()};
}

void counting_allocator::reset_peak(int tag) {
  auto s = slot(tag);
  peak_bytes[s].store(current_bytes[s].load());
}

} // namespace troupe::runtime
