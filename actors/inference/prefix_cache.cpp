#include "actors/inference/prefix_cache.hpp"

#include <algorithm>
#include <cassert>
#include <map>
#include <queue>
#include <string>
#include <tuple>

namespace troupe::actors::inference {

namespace {

using token_span = std::span<const int64_t>;

/// Lexicographic order on token runs; transparent so a span finds a vector key.
struct tokens_less {
  using is_transparent = void;
  bool operator()(token_span a, token_span b) const {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }
};

/// Block `i` (block_size tokens) of `tokens`.
token_span block_at(token_span tokens, size_t i, size_t block_size) {
  return tokens.subspan(i * block_size, block_size);
}

} // namespace

// An edge of the tree and the node it leads to. The root has no tokens; every
// other node holds a non-empty run of whole blocks: tokens.size() ==
// blocks.size() * block_size. Children are keyed by their first block.
struct prefix_cache::node {
  std::vector<int64_t> tokens;
  std::vector<int32_t> blocks;
  node* parent = nullptr;
  std::map<std::vector<int64_t>, std::unique_ptr<node>, tokens_less> children;
  /// clock_ value of the last match() or insert() that used this node.
  uint64_t last_access = 0;
  /// Creation order (deterministic LRU tie-break).
  uint64_t id = 0;

  /// Leading blocks of this edge equal to blocks [pos, limit) of `seq`.
  size_t common_blocks(token_span seq, size_t pos, size_t limit, size_t block_size) const {
    size_t k = 0;
    while (k < blocks.size() && pos + k < limit) {
      auto mine = block_at(tokens, k, block_size);
      auto theirs = block_at(seq, pos + k, block_size);
      if (!std::equal(mine.begin(), mine.end(), theirs.begin()))
        break;
      ++k;
    }
    return k;
  }

  /// The key of this node in its parent's children.
  std::vector<int64_t> key(size_t block_size) const {
    return {tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(block_size)};
  }
};

namespace {

/// Every node of the tree under `root` (root first), parents before children.
template <class Node>
std::vector<Node*> preorder(Node* root) {
  std::vector<Node*> out;
  std::vector<Node*> todo{root};
  while (!todo.empty()) {
    auto* n = todo.back();
    todo.pop_back();
    out.push_back(n);
    for (auto& [key, child] : n->children)
      todo.push_back(child.get());
  }
  return out;
}

} // namespace

prefix_cache::prefix_cache(block_allocator& alloc)
    : alloc_(&alloc), root_(std::make_unique<node>()),
      indexed_(static_cast<size_t>(alloc.num_blocks()), false) {
  root_->id = next_node_id_++;
}

prefix_cache::~prefix_cache() {
  clear();
}

prefix_match prefix_cache::match(token_span tokens, int64_t max_tokens) {
  const auto bs = static_cast<size_t>(alloc_->block_size());
  const auto cap = static_cast<size_t>(std::max<int64_t>(max_tokens, 0));
  const size_t limit = std::min(tokens.size(), cap) / bs;
  const auto tick = ++clock_;
  prefix_match out;
  node* cur = root_.get();
  size_t pos = 0;
  while (pos < limit) {
    auto it = cur->children.find(block_at(tokens, pos, bs));
    if (it == cur->children.end())
      break;
    node* child = it->second.get();
    auto k = child->common_blocks(tokens, pos, limit, bs);
    // k >= 1: the key is the first block. A partly used edge is touched whole.
    child->last_access = tick;
    out.blocks.insert(out.blocks.end(), child->blocks.begin(),
                      child->blocks.begin() + static_cast<ptrdiff_t>(k));
    pos += k;
    if (k < child->blocks.size())
      break;
    cur = child;
  }
  for (auto b : out.blocks) {
    [[maybe_unused]] auto ok = alloc_->retain(b);
    assert(ok && "indexed blocks are owned by the cache");
  }
  out.matched_tokens = static_cast<int64_t>(pos * bs);
  queried_tokens_ += static_cast<int64_t>(tokens.size());
  hit_tokens_ += out.matched_tokens;
  return out;
}

prefix_cache::node* prefix_cache::split(node* child, size_t k) {
  const auto bs = static_cast<size_t>(alloc_->block_size());
  node* parent = child->parent;
  auto key = child->key(bs);
  auto it = parent->children.find(key);
  auto owned = std::move(it->second);
  parent->children.erase(it);
  auto upper = std::make_unique<node>();
  upper->tokens.assign(child->tokens.begin(),
                       child->tokens.begin() + static_cast<ptrdiff_t>(k * bs));
  upper->blocks.assign(child->blocks.begin(), child->blocks.begin() + static_cast<ptrdiff_t>(k));
  upper->parent = parent;
  upper->last_access = child->last_access;
  upper->id = next_node_id_++;
  child->tokens.erase(child->tokens.begin(),
                      child->tokens.begin() + static_cast<ptrdiff_t>(k * bs));
  child->blocks.erase(child->blocks.begin(), child->blocks.begin() + static_cast<ptrdiff_t>(k));
  child->parent = upper.get();
  upper->children.emplace(child->key(bs), std::move(owned));
  auto* result = upper.get();
  parent->children.emplace(std::move(key), std::move(upper));
  return result;
}

expected<int32_t> prefix_cache::insert(token_span tokens, std::span<const int32_t> blocks) {
  const auto bs = static_cast<size_t>(alloc_->block_size());
  const size_t full = tokens.size() / bs;
  if (blocks.size() < full)
    return make_error(errc::invalid_argument,
                      "prefix cache insert: " + std::to_string(tokens.size()) + " tokens fill " +
                          std::to_string(full) + " blocks of " + std::to_string(bs) +
                          " tokens, got " + std::to_string(blocks.size()) + " block ids");
  for (size_t i = 0; i < full; ++i)
    if (alloc_->ref_count(blocks[i]) == 0)
      return make_error(errc::invalid_argument,
                        "prefix cache insert: blocks[" + std::to_string(i) + "] = kv block " +
                            std::to_string(blocks[i]) + " is " +
                            (alloc_->contains(blocks[i]) ? "free" : "out of range"));
  // Dry run: the first `cached` blocks are already in the tree; the rest will
  // be indexed and must not be indexed anywhere yet.
  size_t cached = 0;
  for (node* cur = root_.get(); cached < full;) {
    auto it = cur->children.find(block_at(tokens, cached, bs));
    if (it == cur->children.end())
      break;
    auto k = it->second->common_blocks(tokens, cached, full, bs);
    cached += k;
    if (k < it->second->blocks.size())
      break;
    cur = it->second.get();
  }
  for (size_t i = cached; i < full; ++i) {
    auto b = blocks[i];
    bool twice = std::find(blocks.begin() + static_cast<ptrdiff_t>(cached),
                           blocks.begin() + static_cast<ptrdiff_t>(i),
                           b) != blocks.begin() + static_cast<ptrdiff_t>(i);
    if (indexed_[static_cast<size_t>(b)] || twice)
      return make_error(errc::invalid_argument, "prefix cache insert: blocks[" + std::to_string(i) +
                                                    "] = kv block " + std::to_string(b) +
                                                    " already holds another prefix");
  }
  // Walk again, splitting the edge where the sequence leaves it.
  const auto tick = ++clock_;
  node* cur = root_.get();
  size_t pos = 0;
  while (pos < full) {
    auto it = cur->children.find(block_at(tokens, pos, bs));
    if (it == cur->children.end()) {
      auto leaf = std::make_unique<node>();
      leaf->tokens.assign(tokens.begin() + static_cast<ptrdiff_t>(pos * bs),
                          tokens.begin() + static_cast<ptrdiff_t>(full * bs));
      leaf->blocks.assign(blocks.begin() + static_cast<ptrdiff_t>(pos),
                          blocks.begin() + static_cast<ptrdiff_t>(full));
      leaf->parent = cur;
      leaf->last_access = tick;
      leaf->id = next_node_id_++;
      for (auto b : leaf->blocks) {
        [[maybe_unused]] auto ok = alloc_->retain(b);
        assert(ok && "validated above");
        indexed_[static_cast<size_t>(b)] = true;
      }
      cached_blocks_ += static_cast<int32_t>(leaf->blocks.size());
      auto key = leaf->key(bs);
      cur->children.emplace(std::move(key), std::move(leaf));
      break;
    }
    node* child = it->second.get();
    auto k = child->common_blocks(tokens, pos, full, bs);
    pos += k;
    if (k < child->blocks.size() && pos < full)
      child = split(child, k); // the sequence diverges inside this edge
    child->last_access = tick;
    cur = child;
    if (k < child->blocks.size())
      break; // the sequence ends inside this edge: nothing new to index
  }
  return static_cast<int32_t>(full - cached);
}

int32_t prefix_cache::num_evictable() const {
  // Post-order: a node's tail can be trimmed only once all its children are
  // gone; it is gone itself once every one of its blocks was trimmed.
  auto nodes = preorder<const node>(root_.get());
  std::map<const node*, bool> removable;
  int32_t total = 0;
  for (auto i = nodes.size(); i-- > 1;) { // skip the root (index 0)
    const node* n = nodes[i];
    bool children_gone = std::all_of(n->children.begin(), n->children.end(),
                                     [&](const auto& kv) { return removable[kv.second.get()]; });
    size_t trimmed = 0;
    if (children_gone)
      while (trimmed < n->blocks.size() &&
             alloc_->ref_count(n->blocks[n->blocks.size() - 1 - trimmed]) == 1)
        ++trimmed;
    total += static_cast<int32_t>(trimmed);
    removable[n] = children_gone && trimmed == n->blocks.size();
  }
  return total;
}

int32_t prefix_cache::evict(int32_t num_blocks) {
  if (num_blocks <= 0)
    return 0;
  const auto bs = static_cast<size_t>(alloc_->block_size());
  auto evictable_leaf = [&](const node* n) {
    return n != root_.get() && n->children.empty() && !n->blocks.empty() &&
           alloc_->ref_count(n->blocks.back()) == 1;
  };
  using entry = std::tuple<uint64_t, uint64_t, node*>; // last_access, id, node
  std::priority_queue<entry, std::vector<entry>, std::greater<>> lru;
  for (auto* n : preorder<node>(root_.get()))
    if (evictable_leaf(n))
      lru.emplace(n->last_access, n->id, n);
  int32_t freed = 0;
  while (freed < num_blocks && !lru.empty()) {
    node* leaf = std::get<2>(lru.top());
    lru.pop();
    auto key = leaf->key(bs);
    while (freed < num_blocks && !leaf->blocks.empty() &&
           alloc_->ref_count(leaf->blocks.back()) == 1) {
      auto b = leaf->blocks.back();
      leaf->blocks.pop_back();
      leaf->tokens.resize(leaf->tokens.size() - bs);
      indexed_[static_cast<size_t>(b)] = false;
      --cached_blocks_;
      [[maybe_unused]] auto ok = alloc_->release(b);
      assert(ok && "the cache owns its indexed blocks");
      ++freed;
    }
    if (leaf->blocks.empty()) {
      node* parent = leaf->parent;
      parent->children.erase(key); // destroys leaf
      if (evictable_leaf(parent))
        lru.emplace(parent->last_access, parent->id, parent);
    }
  }
  return freed;
}

expected<std::vector<int32_t>> prefix_cache::allocate(int32_t n) {
  if (n < 0)
    return make_error(errc::invalid_argument,
                      "kv cache allocate: expected a block count >= 0, got " + std::to_string(n));
  auto short_by = n - alloc_->num_free();
  if (short_by > 0) {
    auto evictable = num_evictable();
    if (evictable < short_by)
      return make_error(errc::unavailable, "kv cache: need " + std::to_string(n) +
                                               " free blocks, " +
                                               std::to_string(alloc_->num_free()) + " free and " +
                                               std::to_string(evictable) + " evictable of " +
                                               std::to_string(alloc_->num_blocks()));
    [[maybe_unused]] auto freed = evict(short_by);
    assert(freed == short_by);
  }
  return alloc_->allocate(n);
}

void prefix_cache::clear() {
  if (!root_)
    return;
  auto nodes = preorder<node>(root_.get());
  for (auto* n : nodes)
    for (auto b : n->blocks) {
      indexed_[static_cast<size_t>(b)] = false;
      [[maybe_unused]] auto ok = alloc_->release(b);
      assert(ok && "the cache owns its indexed blocks");
    }
  // Children before parents: no deep recursion in the destructors.
  for (auto i = nodes.size(); i-- > 0;)
    nodes[i]->children.clear();
  cached_blocks_ = 0;
}

double prefix_cache::hit_rate() const noexcept {
  if (queried_tokens_ == 0)
    return 0.0;
  return static_cast<double>(hit_tokens_) / static_cast<double>(queried_tokens_);
}

expected<void> prefix_cache::check_invariants() const {
  const auto bs = static_cast<size_t>(alloc_->block_size());
  std::vector<bool> seen(indexed_.size(), false);
  int32_t count = 0;
  for (const auto* n : preorder<const node>(root_.get())) {
    if (n != root_.get()) {
      if (n->blocks.empty() || n->tokens.size() != n->blocks.size() * bs)
        return make_error(errc::internal, "prefix cache: node with " +
                                              std::to_string(n->tokens.size()) + " tokens and " +
                                              std::to_string(n->blocks.size()) + " blocks");
      if (n->parent == nullptr ||
          n->parent->children.find(n->key(bs)) == n->parent->children.end() ||
          n->parent->children.find(n->key(bs))->second.get() != n)
        return make_error(errc::internal, "prefix cache: node not under its parent's key");
    }
    for (auto b : n->blocks) {
      if (!alloc_->contains(b) || seen[static_cast<size_t>(b)] || !indexed_[static_cast<size_t>(b)])
        return make_error(errc::internal, "prefix cache: kv block " + std::to_string(b) +
                                              " indexed twice or out of range");
      seen[static_cast<size_t>(b)] = true;
      if (alloc_->ref_count(b) < 1)
        return make_error(errc::internal,
                          "prefix cache: indexed kv block " + std::to_string(b) + " is free");
      ++count;
    }
  }
  if (count != cached_blocks_ ||
      count != static_cast<int32_t>(std::count(indexed_.begin(), indexed_.end(), true)))
    return make_error(errc::internal, "prefix cache: " + std::to_string(count) +
                                          " blocks in the tree, cached_blocks() says " +
                                          std::to_string(cached_blocks_));
  return caf::unit;
}

} // namespace troupe::actors::inference
