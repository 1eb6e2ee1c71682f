#pragma once
// The physical block pool of the inference engine's paged KV cache: which of
// `num_blocks` fixed-size KV blocks are free, and how many owners each used
// block has. Pure bookkeeping: the K/V tensors live with the model; a block id
// is an index into them. See NOTE [kv block ownership].
//
// Threading: not thread-safe. One allocator is owned by one inference engine
// and touched only by its scheduler (the engine actor's thread of control).

#include "runtime/error.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace troupe::actors::inference {

// NOTE [kv block ownership]
// Every used block has a reference count = the number of its owners. Owners
// are (a) running requests, one reference per block-table entry, and (b) the
// prefix cache, one reference per block it indexes. A block returns to the
// free list exactly when its last owner releases it; a free block has count 0
// and is never referenced by anyone.
//
// Protocol (single-threaded, driven by the scheduler):
//  1. Admission: `prefix_cache::match(prompt, prompt_len - 1)` returns the
//     longest cached run of FULL blocks and retains each for the request. The
//     request then needs `blocks_for(total_tokens) - matched` fresh blocks,
//     obtained with `prefix_cache::allocate(n)`, which evicts least recently
//     used cache-only blocks when the free list is short (all or nothing). An
//     engine without a prefix cache calls `block_allocator::allocate(n)`.
//     If allocation fails the scheduler releases the matched blocks again and
//     waits (or preempts another request).
//  2. After prefill (and again at finish, to cover generated tokens) the
//     engine calls `prefix_cache::insert(tokens, block_table)`; the cache
//     takes its own reference on each block it newly indexes. Blocks whose
//     prefix was already cached under other ids stay private to the request.
//  3. At finish or preemption the request releases every entry of its block
//     table (`release_all`). Blocks also indexed by the cache keep count >= 1
//     ("cached free": not handed out) until `prefix_cache::evict` drops the
//     cache's reference, which only happens when the count is exactly 1, i.e.
//     no request uses the block. Locking is thus folded into the counts: no
//     separate per-node lock exists.
//  4. Copy-on-write: cached blocks are always full and never written again. A
//     partly filled block may be shared by the n samples of one prompt (each
//     sample retains it); before a sample appends to a block with
//     `is_shared(id)`, the engine allocates a fresh block, copies the K/V, and
//     releases its reference to the shared one.
//  5. A weight-version change calls `prefix_cache::clear()`: cached K/V is
//     stale; blocks of running requests stay theirs.

/// A pool of `num_blocks` KV blocks of `block_size` tokens with per-block
/// reference counts. Block ids are int32 in [0, num_blocks).
class block_allocator {
public:
  /// Validating factory: invalid_argument unless num_blocks >= 0 and
  /// block_size >= 1.
  static expected<block_allocator> make(int32_t num_blocks, int32_t block_size);

  /// A pool with every block free. Precondition: num_blocks >= 0 and
  /// block_size >= 1 (checked by the engine's config validation; see make()).
  block_allocator(int32_t num_blocks, int32_t block_size);

  /// Takes one free block (count 1); unavailable when none is free.
  expected<int32_t> allocate();

  /// Takes `n` free blocks (count 1 each), all or nothing: unavailable when
  /// fewer than `n` are free (nothing taken), invalid_argument when n < 0.
  expected<std::vector<int32_t>> allocate(int32_t n);

  /// Adds an owner to a used block; invalid_argument for an id out of range
  /// or a free block (a free block cannot be shared).
  expected<void> retain(int32_t id);

  /// Removes an owner; the block becomes free at count 0. invalid_argument
  /// for an id out of range or a block that is already free (double release).
  expected<void> release(int32_t id);

  /// Releases every id of `ids` (duplicates count as several owners), all or
  /// nothing: on invalid_argument no count changes.
  expected<void> release_all(std::span<const int32_t> ids);

  /// The number of owners of block `id` (0 = free; 0 for an id out of range).
  int32_t ref_count(int32_t id) const noexcept;

  /// True when block `id` has more than one owner (copy before writing).
  bool is_shared(int32_t id) const noexcept { return ref_count(id) > 1; }

  /// True when `id` is a block id of this pool.
  bool contains(int32_t id) const noexcept { return id >= 0 && id < num_blocks(); }

  /// Blocks on the free list.
  int32_t num_free() const noexcept { return static_cast<int32_t>(free_.size()); }

  /// Blocks with at least one owner (requests or the prefix cache).
  int32_t num_used() const noexcept { return num_blocks() - num_free(); }

  /// Size of the pool.
  int32_t num_blocks() const noexcept { return static_cast<int32_t>(ref_count_.size()); }

  /// Tokens per block.
  int32_t block_size() const noexcept { return block_size_; }

  /// Blocks needed to hold `num_tokens` tokens: ceil(num_tokens / block_size);
  /// 0 for num_tokens <= 0.
  int32_t blocks_for(int64_t num_tokens) const noexcept;

  /// num_used / num_blocks in [0, 1] (0 for an empty pool).
  double utilization() const noexcept;

  /// Checks the free list against the counts: every listed block has count 0,
  /// is listed once, and every count-0 block is listed. internal on failure
  /// (for tests and debug assertions).
  expected<void> check_invariants() const;

private:
  int32_t block_size_;
  /// Owners per block; 0 = free.
  std::vector<int32_t> ref_count_;
  /// Free block ids; allocation pops from the back (lowest ids first on a
  /// fresh pool, most recently freed first afterwards).
  std::vector<int32_t> free_;
};

} // namespace troupe::actors::inference
