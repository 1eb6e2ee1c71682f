#include "actors/inference/block_allocator.hpp"

#include <algorithm>
#include <cassert>
#include <string>
#include <unordered_map>

namespace troupe::actors::inference {

namespace {

std::string id_text(int32_t id) {
  return "kv block " + std::to_string(id);
}

} // namespace

expected<block_allocator> block_allocator::make(int32_t num_blocks, int32_t block_size) {
  if (num_blocks < 0)
    return make_error(errc::invalid_argument,
                      "kv cache num_blocks: expected an integer >= 0, got " +
                          std::to_string(num_blocks));
  if (block_size < 1)
    return make_error(errc::invalid_argument,
                      "kv cache block_size: expected an integer >= 1, got " +
                          std::to_string(block_size));
  return block_allocator{num_blocks, block_size};
}

block_allocator::block_allocator(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size < 1 ? 1 : block_size),
      ref_count_(static_cast<size_t>(num_blocks < 0 ? 0 : num_blocks), 0) {
  assert(num_blocks >= 0 && block_size >= 1 && "use block_allocator::make to validate");
  free_.reserve(ref_count_.size());
  for (int32_t id = num_blocks - 1; id >= 0; --id)
    free_.push_back(id);
}

expected<int32_t> block_allocator::allocate() {
  if (free_.empty())
    return make_error(errc::unavailable, "kv cache: no free block (all " +
                                             std::to_string(num_blocks()) + " blocks in use)");
  auto id = free_.back();
  free_.pop_back();
  ref_count_[static_cast<size_t>(id)] = 1;
  return id;
}

expected<std::vector<int32_t>> block_allocator::allocate(int32_t n) {
  if (n < 0)
    return make_error(errc::invalid_argument,
                      "kv cache allocate: expected a block count >= 0, got " + std::to_string(n));
  if (n > num_free())
    return make_error(errc::unavailable, "kv cache: need " + std::to_string(n) + " free blocks, " +
                                             std::to_string(num_free()) + " of " +
                                             std::to_string(num_blocks()) + " free");
  std::vector<int32_t> ids(free_.end() - n, free_.end());
  std::reverse(ids.begin(), ids.end());
  free_.resize(free_.size() - static_cast<size_t>(n));
  for (auto id : ids)
    ref_count_[static_cast<size_t>(id)] = 1;
  return ids;
}

expected<void> block_allocator::retain(int32_t id) {
  if (!contains(id))
    return make_error(errc::invalid_argument, "kv cache retain: " + id_text(id) + " outside [0, " +
                                                  std::to_string(num_blocks()) + ")");
  auto& rc = ref_count_[static_cast<size_t>(id)];
  if (rc == 0)
    return make_error(errc::invalid_argument,
                      "kv cache retain: " + id_text(id) + " is free (allocate it first)");
  ++rc;
  return caf::unit;
}

expected<void> block_allocator::release(int32_t id) {
  if (!contains(id))
    return make_error(errc::invalid_argument, "kv cache release: " + id_text(id) + " outside [0, " +
                                                  std::to_string(num_blocks()) + ")");
  auto& rc = ref_count_[static_cast<size_t>(id)];
  if (rc == 0)
    return make_error(errc::invalid_argument,
                      "kv cache release: " + id_text(id) + " is already free (double release)");
  if (--rc == 0)
    free_.push_back(id);
  return caf::unit;
}

expected<void> block_allocator::release_all(std::span<const int32_t> ids) {
  // Validate first so that a bad table changes nothing.
  std::unordered_map<int32_t, int32_t> owners;
  for (auto id : ids) {
    if (!contains(id))
      return make_error(errc::invalid_argument, "kv cache release: " + id_text(id) +
                                                    " outside [0, " + std::to_string(num_blocks()) +
                                                    ")");
    if (++owners[id] > ref_count_[static_cast<size_t>(id)])
      return make_error(errc::invalid_argument,
                        "kv cache release: " + id_text(id) + " released " +
                            std::to_string(owners[id]) + " times but has " +
                            std::to_string(ref_count_[static_cast<size_t>(id)]) + " owners");
  }
  for (auto id : ids)
    if (--ref_count_[static_cast<size_t>(id)] == 0)
      free_.push_back(id);
  return caf::unit;
}

int32_t block_allocator::ref_count(int32_t id) const noexcept {
  return contains(id) ? ref_count_[static_cast<size_t>(id)] : 0;
}

int32_t block_allocator::blocks_for(int64_t num_tokens) const noexcept {
  if (num_tokens <= 0)
    return 0;
  return static_cast<int32_t>((num_tokens + block_size_ - 1) / block_size_);
}

double block_allocator::utilization() const noexcept {
  if (num_blocks() == 0)
    return 0.0;
  return static_cast<double>(num_used()) / static_cast<double>(num_blocks());
}

expected<void> block_allocator::check_invariants() const {
  std::vector<bool> listed(ref_count_.size(), false);
  for (auto id : free_) {
    if (!contains(id))
      return make_error(errc::internal, "kv cache: free list holds " + id_text(id) +
                                            " outside [0, " + std::to_string(num_blocks()) + ")");
    if (listed[static_cast<size_t>(id)])
      return make_error(errc::internal, "kv cache: " + id_text(id) + " is listed free twice");
    listed[static_cast<size_t>(id)] = true;
    if (ref_count_[static_cast<size_t>(id)] != 0)
      return make_error(errc::internal, "kv cache: " + id_text(id) + " is free but has " +
                                            std::to_string(ref_count_[static_cast<size_t>(id)]) +
                                            " owners");
  }
  for (size_t i = 0; i < ref_count_.size(); ++i) {
    if (ref_count_[i] < 0)
      return make_error(errc::internal, "kv cache: " + id_text(static_cast<int32_t>(i)) +
                                            " has a negative count " +
                                            std::to_string(ref_count_[i]));
    if (ref_count_[i] == 0 && !listed[i])
      return make_error(errc::internal, "kv cache: " + id_text(static_cast<int32_t>(i)) +
                                            " has no owner but is not on the free list");
  }
  return caf::unit;
}

} // namespace troupe::actors::inference
