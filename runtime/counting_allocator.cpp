#include "runtime/counting_allocator.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

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

// What a counted storage keeps: the wrapped allocator's pointer (freed with
// it) and what it was counted as.
struct counted {
  c10::DataPtr inner;
  int tag;
  int64_t bytes;
};

void free_counted(void* ctx) {
  auto* c = static_cast<counted*>(ctx);
  count(c->tag, -c->bytes);
  delete c;
}

class counting_cpu_allocator final : public c10::Allocator {
public:
  explicit counting_cpu_allocator(c10::Allocator* inner) : inner_(inner) {}

  // LibTorch 1.13 declares allocate const, 2.x (2.3 on) not: one of these
  // two overrides it.
  c10::DataPtr allocate(size_t n) const { return counted_allocation(n); }
  c10::DataPtr allocate(size_t n) { return counted_allocation(n); }
  // Pure in LibTorch 2.x; unused by 1.13.
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }

private:
  c10::DataPtr counted_allocation(size_t n) const {
    auto inner = inner_->allocate(n);
    void* data = inner.get();
    auto bytes = static_cast<int64_t>(n);
    count(thread_tag, bytes);
    auto* c = new counted{std::move(inner), thread_tag, bytes};
    return {data, c, &free_counted, c10::Device(c10::DeviceType::CPU)};
  }

  c10::Allocator* inner_;
};

} // namespace

counting_allocator& counting_allocator::install() {
  static counting_allocator counter;
  static std::once_flag once;
  std::call_once(once, [] {
    static counting_cpu_allocator allocator{c10::GetCPUAllocator()};
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
