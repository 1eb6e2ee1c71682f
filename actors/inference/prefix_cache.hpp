#pragma once
// Automatic prefix caching for the inference engine (SGLang's RadixCache at
// vLLM's block granularity): a radix tree over token ids whose edges hold runs
// of whole blocks, each block id holding the K/V of its block_size tokens.
// Repeated prompts and the n samples of a GRPO group reuse the full blocks of
// their common prefix instead of recomputing them.
//
// Ownership: the cache holds one reference (block_allocator::retain) on every
// block it indexes and gives it back on eviction, clear() or destruction; see
// NOTE [kv block ownership] in block_allocator.hpp.
// Threading: not thread-safe; owned by the engine's scheduler, like the
// allocator it refers to.

#include "actors/inference/block_allocator.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace troupe::actors::inference {

/// What match() found: the first `matched_tokens` tokens of the prompt are
/// cached in `blocks` (one per block_size tokens, in order).
struct prefix_match {
  /// A multiple of the block size.
  int64_t matched_tokens = 0;
  /// One reference on each is now owned by the caller (release at finish).
  std::vector<int32_t> blocks;
};

/// A radix tree from token prefixes (whole blocks only) to KV block ids.
class prefix_cache {
public:
  /// An empty cache over `alloc` (not owned; must outlive the cache).
  explicit prefix_cache(block_allocator& alloc);

  /// Releases the cache's references (as clear()).
  ~prefix_cache();

  prefix_cache(const prefix_cache&) = delete;
  prefix_cache& operator=(const prefix_cache&) = delete;

  /// Longest cached prefix of `tokens` in whole blocks, at most `max_tokens`
  /// tokens (pass prompt_len - 1: the engine must compute the last prompt
  /// token to get logits; max_tokens < 0 counts as 0). Retains every returned
  /// block on the caller's behalf and marks the path as recently used.
  /// Counts tokens.size() as queried and matched_tokens as hit.
  prefix_match match(std::span<const int64_t> tokens, int64_t max_tokens);

  /// Indexes the tokens.size() / block_size full blocks of a sequence whose
  /// KV lives in `blocks` (its block table; extra entries such as a partly
  /// filled last block are ignored). Positions already cached keep their
  /// existing block (the caller's duplicate stays private); each newly
  /// indexed block is retained by the cache. Returns the number newly
  /// indexed. invalid_argument (nothing changes) when `blocks` is too short,
  /// holds a free or out-of-range id, or would index a block twice.
  expected<int32_t> insert(std::span<const int64_t> tokens, std::span<const int32_t> blocks);

  /// Frees up to `num_blocks` blocks that only the cache owns (count 1),
  /// trimming least recently used leaves from their ends first; a leaf emptied
  /// this way may make its parent an evictable leaf. Returns how many were
  /// freed (0 for num_blocks <= 0).
  int32_t evict(int32_t num_blocks);

  /// Blocks that evict() could free right now (leaf-first order included).
  int32_t num_evictable() const;

  /// Allocates `n` blocks from the allocator, first evicting cache-only blocks
  /// when the free list is short. All or nothing: unavailable (and nothing
  /// evicted) when free + evictable < n; invalid_argument when n < 0.
  expected<std::vector<int32_t>> allocate(int32_t n);

  /// Drops every entry and releases the cache's references (weights changed:
  /// cached K/V is stale). Blocks that requests still own stay theirs.
  /// Metrics are cumulative and kept.
  void clear();

  /// Blocks indexed by the cache (= references the cache holds).
  int32_t cached_blocks() const noexcept { return cached_blocks_; }

  /// Prompt tokens passed to match() so far.
  int64_t queried_tokens() const noexcept { return queried_tokens_; }

  /// Prompt tokens match() found cached so far.
  int64_t hit_tokens() const noexcept { return hit_tokens_; }

  /// hit_tokens / queried_tokens (0 before any query).
  double hit_rate() const noexcept;

  /// The allocator this cache indexes.
  block_allocator& allocator() noexcept { return *alloc_; }

  /// Checks the tree: edges are non-empty runs of whole blocks, every indexed
  /// block is owned (count >= 1) and indexed once, the count of indexed
  /// blocks equals cached_blocks(). internal on failure (for tests).
  expected<void> check_invariants() const;

private:
  struct node;

  /// Splits `child` after its first `k` blocks; returns the new upper node.
  node* split(node* child, size_t k);

  block_allocator* alloc_;
  std::unique_ptr<node> root_;
  /// Per block id: indexed by this cache.
  std::vector<bool> indexed_;
  int32_t cached_blocks_ = 0;
  /// Logical clock: advanced by each match() and insert() (LRU order).
  uint64_t clock_ = 0;
  /// Creation counter of nodes (breaks LRU ties deterministically).
  uint64_t next_node_id_ = 0;
  int64_t queried_tokens_ = 0;
  int64_t hit_tokens_ = 0;
};

} // namespace troupe::actors::inference
