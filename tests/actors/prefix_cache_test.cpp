#include "actors/inference/prefix_cache.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <numeric>
#include <random>
#include <span>
#include <vector>

using namespace troupe;
using troupe::actors::inference::block_allocator;
using troupe::actors::inference::prefix_cache;

namespace {

using tokens_t = std::vector<int64_t>;
using table_t = std::vector<int32_t>;

tokens_t iota_tokens(int64_t n, int64_t first) {
  tokens_t t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

tokens_t concat(const tokens_t& a, const tokens_t& b) {
  auto out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

/// One request's life: match, allocate the rest, insert; returns its table.
table_t admit(prefix_cache& cache, const tokens_t& prompt) {
  auto& alloc = cache.allocator();
  auto m = cache.match(prompt, static_cast<int64_t>(prompt.size()) - 1);
  auto rest = cache.allocate(alloc.blocks_for(static_cast<int64_t>(prompt.size())) -
                             static_cast<int32_t>(m.blocks.size()));
  EXPECT_TRUE(rest);
  auto table = m.blocks;
  table.insert(table.end(), rest->begin(), rest->end());
  EXPECT_TRUE(cache.insert(prompt, table));
  return table;
}

} // namespace

TEST(PrefixCache, RepeatedPromptReusesItsFullBlocks) {
  block_allocator alloc{16, 4};
  prefix_cache cache{alloc};
  auto prompt = iota_tokens(10, 100);

  auto first = cache.match(prompt, 9);
  EXPECT_EQ(first.matched_tokens, 0);
  EXPECT_TRUE(first.blocks.empty());
  auto table = alloc.allocate(3);
  ASSERT_TRUE(table);
  EXPECT_EQ(*table, (table_t{0, 1, 2}));
  auto indexed = cache.insert(prompt, *table);
  ASSERT_TRUE(indexed);
  EXPECT_EQ(*indexed, 2); // only the two full blocks
  EXPECT_EQ(cache.cached_blocks(), 2);
  EXPECT_EQ(alloc.ref_count(0), 2);
  EXPECT_EQ(alloc.ref_count(1), 2);
  EXPECT_EQ(alloc.ref_count(2), 1);
  ASSERT_TRUE(alloc.release_all(*table));
  // Cached blocks stay owned by the cache: not handed out.
  EXPECT_EQ(alloc.num_free(), 14);
  EXPECT_EQ(alloc.ref_count(0), 1);
  EXPECT_EQ(alloc.ref_count(2), 0);

  auto second = cache.match(prompt, 9);
  EXPECT_EQ(second.matched_tokens, 8);
  EXPECT_EQ(second.blocks, (table_t{0, 1}));
  EXPECT_EQ(alloc.ref_count(0), 2);
  EXPECT_EQ(alloc.ref_count(1), 2);
  ASSERT_TRUE(alloc.release_all(second.blocks));

  // max_tokens caps the match at whole blocks below it.
  auto capped = cache.match(prompt, 7);
  EXPECT_EQ(capped.matched_tokens, 4);
  EXPECT_EQ(capped.blocks, (table_t{0}));
  ASSERT_TRUE(alloc.release_all(capped.blocks));
  auto exact = cache.match(std::span<const int64_t>{prompt}.first(8), 7);
  EXPECT_EQ(exact.matched_tokens, 4); // never the whole prompt
  ASSERT_TRUE(alloc.release_all(exact.blocks));
  auto none = cache.match(prompt, -5);
  EXPECT_EQ(none.matched_tokens, 0);
  EXPECT_EQ(alloc.ref_count(0), 1);
  EXPECT_TRUE(cache.check_invariants());
  EXPECT_TRUE(alloc.check_invariants());
}

TEST(PrefixCache, DivergingPromptsSplitAnEdgeAtABlockBoundary) {
  block_allocator alloc{16, 4};
  prefix_cache cache{alloc};
  auto shared = iota_tokens(8, 0);
  auto p1 = concat(shared, iota_tokens(4, 100));
  auto p2 = concat(shared, iota_tokens(4, 200));

  auto t1 = admit(cache, p1);
  EXPECT_EQ(t1, (table_t{0, 1, 2}));
  EXPECT_EQ(cache.cached_blocks(), 3);
  auto t2 = admit(cache, p2); // matches 8 of 12, computes one block
  EXPECT_EQ(t2, (table_t{0, 1, 3}));
  EXPECT_EQ(cache.cached_blocks(), 4);
  ASSERT_TRUE(cache.check_invariants());

  auto m1 = cache.match(p1, 12);
  EXPECT_EQ(m1.matched_tokens, 12);
  EXPECT_EQ(m1.blocks, (table_t{0, 1, 2}));
  auto m2 = cache.match(p2, 12);
  EXPECT_EQ(m2.matched_tokens, 12);
  EXPECT_EQ(m2.blocks, (table_t{0, 1, 3}));
  auto p3 = concat(shared, iota_tokens(4, 300));
  auto m3 = cache.match(p3, 11);
  EXPECT_EQ(m3.matched_tokens, 8);
  EXPECT_EQ(m3.blocks, (table_t{0, 1}));
  // Diverging inside the first block of an edge matches nothing of it.
  auto p4 = concat(iota_tokens(6, 0), iota_tokens(6, 50));
  auto m4 = cache.match(p4, 11);
  EXPECT_EQ(m4.matched_tokens, 4);
  EXPECT_EQ(m4.blocks, (table_t{0}));
  for (const auto* t : {&t1, &t2, &m1.blocks, &m2.blocks, &m3.blocks, &m4.blocks})
    ASSERT_TRUE(alloc.release_all(*t));
  EXPECT_EQ(alloc.num_used(), 4);
  EXPECT_TRUE(cache.check_invariants());
  EXPECT_TRUE(alloc.check_invariants());
}

TEST(PrefixCache, DuplicateInsertKeepsTheExistingBlocks) {
  block_allocator alloc{16, 4};
  prefix_cache cache{alloc};
  auto prompt = iota_tokens(12, 0);
  // Two requests computed the same prompt concurrently.
  auto a = alloc.allocate(3);
  auto b = alloc.allocate(3);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*b, (table_t{3, 4, 5}));
  auto first = cache.insert(prompt, *a);
  ASSERT_TRUE(first);
  EXPECT_EQ(*first, 3);
  auto dup = cache.insert(prompt, *b);
  ASSERT_TRUE(dup);
  EXPECT_EQ(*dup, 0);
  EXPECT_EQ(alloc.ref_count(3), 1); // not retained: stays private
  EXPECT_EQ(alloc.ref_count(0), 2);
  EXPECT_EQ(cache.cached_blocks(), 3);
  ASSERT_TRUE(alloc.release_all(*b));
  EXPECT_EQ(alloc.num_free(), 13); // the duplicates are free again

  // A longer sequence whose prefix was cached under other ids: only the new
  // block is indexed, below the existing path.
  auto longer = concat(prompt, iota_tokens(4, 90));
  auto c = alloc.allocate(4);
  ASSERT_TRUE(c);
  auto more = cache.insert(longer, *c);
  ASSERT_TRUE(more);
  EXPECT_EQ(*more, 1);
  auto m = cache.match(longer, 16);
  EXPECT_EQ(m.blocks, (table_t{0, 1, 2, (*c)[3]}));
  // A shorter sequence ending inside an edge adds nothing.
  auto shorter = cache.insert(std::span<const int64_t>{prompt}.first(8), *a);
  ASSERT_TRUE(shorter);
  EXPECT_EQ(*shorter, 0);
  ASSERT_TRUE(alloc.release_all(m.blocks));
  ASSERT_TRUE(alloc.release_all(*a));
  ASSERT_TRUE(alloc.release_all(*c));
  EXPECT_EQ(alloc.num_used(), 4);
  EXPECT_TRUE(cache.check_invariants());
  EXPECT_TRUE(alloc.check_invariants());
}

TEST(PrefixCache, InsertRejectsMisuseAndChangesNothing) {
  block_allocator alloc{8, 4};
  prefix_cache cache{alloc};
  auto prompt = iota_tokens(8, 0);
  auto t = alloc.allocate(2);
  ASSERT_TRUE(t);
  table_t one{(*t)[0]};
  auto short_table = cache.insert(prompt, one);
  ASSERT_FALSE(short_table);
  EXPECT_EQ(code_of(short_table.error()), errc::invalid_argument);
  EXPECT_EQ(context_of(short_table.error()),
            "prefix cache insert: 8 tokens fill 2 blocks of 4 tokens, got 1 block ids");
  table_t with_free{(*t)[0], 5};
  auto free_block = cache.insert(prompt, with_free);
  ASSERT_FALSE(free_block);
  EXPECT_EQ(context_of(free_block.error()), "prefix cache insert: blocks[1] = kv block 5 is free");
  table_t out_of_range{(*t)[0], 99};
  EXPECT_EQ(code_of(cache.insert(prompt, out_of_range).error()), errc::invalid_argument);
  ASSERT_TRUE(cache.insert(prompt, *t));
  // The same block cannot hold a second prefix.
  auto other = iota_tokens(4, 50);
  table_t reused{(*t)[1]};
  auto twice = cache.insert(other, reused);
  ASSERT_FALSE(twice);
  EXPECT_EQ(context_of(twice.error()),
            "prefix cache insert: blocks[0] = kv block 1 already holds another prefix");
  EXPECT_EQ(cache.cached_blocks(), 2);
  EXPECT_EQ(alloc.ref_count(0), 2);
  ASSERT_TRUE(alloc.release_all(*t));
  EXPECT_TRUE(cache.check_invariants());
}

TEST(PrefixCache, EvictsLeastRecentlyUsedFirst) {
  block_allocator alloc{8, 4};
  prefix_cache cache{alloc};
  auto x = iota_tokens(4, 0);
  auto y = iota_tokens(4, 10);
  auto z = iota_tokens(4, 20);
  for (const auto* p : {&x, &y, &z}) {
    auto t = admit(cache, *p);
    ASSERT_TRUE(alloc.release_all(t));
  }
  // x -> block 0, y -> 1, z -> 2; touching x makes y the oldest.
  auto touch = cache.match(x, 4);
  ASSERT_EQ(touch.blocks, (table_t{0}));
  ASSERT_TRUE(alloc.release_all(touch.blocks));
  EXPECT_EQ(cache.num_evictable(), 3);
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(alloc.ref_count(1), 0);
  EXPECT_EQ(alloc.ref_count(0), 1);
  EXPECT_EQ(alloc.ref_count(2), 1);
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(alloc.ref_count(2), 0);
  EXPECT_EQ(cache.evict(5), 1);
  EXPECT_EQ(alloc.ref_count(0), 0);
  EXPECT_EQ(cache.evict(1), 0);
  EXPECT_EQ(cache.evict(0), 0);
  EXPECT_EQ(cache.cached_blocks(), 0);
  EXPECT_EQ(alloc.num_free(), 8);
  EXPECT_TRUE(cache.check_invariants());
}

TEST(PrefixCache, EvictionTrimsLeavesFromTheEndAndThenTheirParents) {
  block_allocator alloc{8, 4};
  prefix_cache cache{alloc};
  auto a = iota_tokens(4, 0);
  auto p1 = concat(a, iota_tokens(8, 100)); // a | b1 b2
  auto p2 = concat(a, iota_tokens(4, 200)); // a | c
  auto t1 = alloc.allocate(3);
  ASSERT_TRUE(t1);
  ASSERT_TRUE(cache.insert(p1, *t1)); // blocks 0 1 2, clock 1
  auto t2 = alloc.allocate(1);
  ASSERT_TRUE(t2);
  table_t t2_table{0, (*t2)[0]};
  ASSERT_TRUE(cache.insert(p2, t2_table)); // block 3 below a, clock 2
  ASSERT_TRUE(alloc.release_all(*t1));
  ASSERT_TRUE(alloc.release(3));
  EXPECT_EQ(cache.num_evictable(), 4);
  // The b leaf (clock 1) is older than c (clock 2): its last block goes first.
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(alloc.ref_count(2), 0);
  auto m = cache.match(p1, 12);
  EXPECT_EQ(m.matched_tokens, 8);
  EXPECT_EQ(m.blocks, (table_t{0, 1}));
  ASSERT_TRUE(alloc.release_all(m.blocks)); // touches a and b: c is now oldest
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(alloc.ref_count(3), 0);
  // Then b's remaining block, then a, which became a leaf.
  EXPECT_EQ(cache.evict(2), 2);
  EXPECT_EQ(alloc.ref_count(1), 0);
  EXPECT_EQ(alloc.ref_count(0), 0);
  EXPECT_EQ(cache.cached_blocks(), 0);
  EXPECT_TRUE(cache.check_invariants());
  EXPECT_TRUE(alloc.check_invariants());
}

TEST(PrefixCache, EvictionNeverFreesBlocksInUse) {
  block_allocator alloc{8, 4};
  prefix_cache cache{alloc};
  auto p = iota_tokens(12, 0);
  auto t = admit(cache, p);
  ASSERT_TRUE(alloc.release_all(t));
  // A request holding the first block only: the rest of the edge can go.
  auto held = cache.match(p, 7);
  ASSERT_EQ(held.blocks, (table_t{0}));
  EXPECT_EQ(cache.num_evictable(), 2);
  EXPECT_EQ(cache.evict(10), 2);
  EXPECT_EQ(cache.cached_blocks(), 1);
  EXPECT_EQ(alloc.ref_count(0), 2);
  EXPECT_EQ(cache.evict(10), 0);

  // A live request on a leaf pins its whole path, even cache-only ancestors.
  block_allocator alloc2{8, 4};
  prefix_cache cache2{alloc2};
  auto q1 = iota_tokens(8, 0);
  auto dup = alloc2.allocate(2); // computed privately, concurrently
  auto t1 = admit(cache2, q1);   // cached as blocks 2 3
  ASSERT_TRUE(dup);
  ASSERT_TRUE(alloc2.release_all(t1));
  auto q2 = concat(q1, iota_tokens(4, 50));
  auto rest = alloc2.allocate(1);
  ASSERT_TRUE(rest);
  table_t t2{(*dup)[0], (*dup)[1], (*rest)[0]};
  ASSERT_TRUE(cache2.insert(q2, t2)); // indexes block 4 below 2 3
  EXPECT_EQ(alloc2.ref_count(2), 1);
  EXPECT_EQ(alloc2.ref_count(4), 2);
  EXPECT_EQ(cache2.num_evictable(), 0);
  EXPECT_EQ(cache2.evict(8), 0);
  ASSERT_TRUE(alloc2.release_all(t2));
  EXPECT_EQ(cache2.num_evictable(), 3);
  EXPECT_EQ(cache2.evict(8), 3);
  EXPECT_EQ(alloc2.num_free(), 8);
  ASSERT_TRUE(alloc.release_all(held.blocks));
}

TEST(PrefixCache, AllocateEvictsOnlyWhatItNeeds) {
  block_allocator alloc{4, 4};
  prefix_cache cache{alloc};
  auto t = admit(cache, iota_tokens(12, 0)); // blocks 0 1 2, all cached
  ASSERT_TRUE(alloc.release_all(t));
  EXPECT_EQ(alloc.num_free(), 1);
  auto two = cache.allocate(2);
  ASSERT_TRUE(two);
  EXPECT_EQ(*two, (table_t{2, 3}));
  EXPECT_EQ(cache.cached_blocks(), 2);
  auto too_many = cache.allocate(3);
  ASSERT_FALSE(too_many);
  EXPECT_EQ(code_of(too_many.error()), errc::unavailable);
  EXPECT_EQ(context_of(too_many.error()),
            "kv cache: need 3 free blocks, 0 free and 2 evictable of 4");
  EXPECT_EQ(cache.cached_blocks(), 2); // nothing evicted
  EXPECT_EQ(code_of(cache.allocate(-1).error()), errc::invalid_argument);
  ASSERT_TRUE(alloc.release_all(*two));
  EXPECT_TRUE(cache.check_invariants());
  EXPECT_TRUE(alloc.check_invariants());
}

TEST(PrefixCache, ClearReleasesTheCachesReferencesOnly) {
  block_allocator alloc{8, 4};
  prefix_cache cache{alloc};
  auto done = admit(cache, iota_tokens(8, 0));
  ASSERT_TRUE(alloc.release_all(done));
  auto live = admit(cache, iota_tokens(9, 100)); // 3 blocks, 2 cached
  EXPECT_EQ(cache.cached_blocks(), 4);
  EXPECT_EQ(alloc.num_used(), 5);
  cache.clear();
  EXPECT_EQ(cache.cached_blocks(), 0);
  EXPECT_EQ(alloc.num_used(), 3); // the live request's blocks stay
  for (auto b : live)
    EXPECT_EQ(alloc.ref_count(b), 1);
  auto miss = cache.match(iota_tokens(8, 0), 8);
  EXPECT_EQ(miss.matched_tokens, 0);
  ASSERT_TRUE(alloc.release_all(live));
  EXPECT_EQ(alloc.num_free(), 8);
  EXPECT_TRUE(cache.check_invariants());
  // The cache is usable again after clear().
  auto again = admit(cache, iota_tokens(8, 0));
  EXPECT_EQ(cache.cached_blocks(), 2);
  ASSERT_TRUE(alloc.release_all(again));
}

TEST(PrefixCache, DestructionReleasesTheCachesReferences) {
  block_allocator alloc{8, 4};
  {
    prefix_cache cache{alloc};
    auto t = admit(cache, iota_tokens(8, 0));
    ASSERT_TRUE(alloc.release_all(t));
    EXPECT_EQ(alloc.num_used(), 2);
  }
  EXPECT_EQ(alloc.num_free(), 8);
}

TEST(PrefixCache, HitRateCountsPromptTokens) {
  block_allocator alloc{8, 4};
  prefix_cache cache{alloc};
  EXPECT_EQ(cache.hit_rate(), 0.0);
  auto prompt = iota_tokens(10, 0);
  auto t = admit(cache, prompt); // 10 queried, 0 hit
  ASSERT_TRUE(alloc.release_all(t));
  auto m = cache.match(prompt, 9); // 10 queried, 8 hit
  ASSERT_TRUE(alloc.release_all(m.blocks));
  EXPECT_EQ(cache.queried_tokens(), 20);
  EXPECT_EQ(cache.hit_tokens(), 8);
  EXPECT_DOUBLE_EQ(cache.hit_rate(), 0.4);
  cache.clear(); // metrics are cumulative
  EXPECT_EQ(cache.queried_tokens(), 20);
}

namespace {

/// FNV-1a of a token run: stands for the K/V a block holds (K/V of a token
/// depends on every token before it).
uint64_t kv_of(std::span<const int64_t> prefix) {
  uint64_t h = 1469598103934665603ull;
  for (auto t : prefix) {
    h ^= static_cast<uint64_t>(t);
    h *= 1099511628211ull;
  }
  return h ^ prefix.size();
}

struct sim_request {
  tokens_t tokens; // prompt + what it will generate
  size_t prompt_len = 0;
  table_t table;
  bool indexed_prompt = false;
};

} // namespace

// 10,000 requests through match -> allocate (evicting) -> insert -> release,
// several alive at once, with GRPO-style forks (copy-on-write of a shared
// partial block), deferred inserts (concurrent duplicates), evictions and
// weight-version clears. Simulated K/V contents catch a block handed to two
// owners or a cached block that was overwritten.
TEST(PrefixCache, RandomWorkloadLeaksNothingAndKeepsInvariants) {
  constexpr int32_t num_blocks = 32;
  constexpr int32_t bs = 4;
  constexpr int num_requests = 10'000;
  block_allocator alloc{num_blocks, bs};
  prefix_cache cache{alloc};
  std::mt19937_64 rng{20240611};
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>{lo, hi}(rng); };
  auto chance = [&](double p) { return std::bernoulli_distribution{p}(rng); };
  auto random_tokens = [&](int n) {
    tokens_t t(static_cast<size_t>(n));
    for (auto& x : t)
      x = uniform(0, 9); // small vocabulary: suffixes collide too
    return t;
  };
  std::vector<tokens_t> prefixes;
  for (int len : {0, 3, 8, 13, 20, 27})
    prefixes.push_back(random_tokens(len));
  std::vector<tokens_t> history;
  std::vector<uint64_t> content(num_blocks, 0);
  std::deque<sim_request> live;
  int64_t hits = 0, forks = 0, copies = 0, preemptions = 0, duplicates = 0, clears = 0, evicted = 0;

  auto expected_kv = [&](const sim_request& r, size_t i) {
    auto end = std::min((i + 1) * bs, r.tokens.size());
    return kv_of(std::span<const int64_t>{r.tokens}.first(end));
  };
  auto check = [&] {
    ASSERT_TRUE(alloc.check_invariants());
    ASSERT_TRUE(cache.check_invariants());
    std::vector<int32_t> owners(num_blocks, 0);
    int64_t table_refs = 0;
    for (const auto& r : live) {
      ASSERT_EQ(r.table.size(),
                static_cast<size_t>(alloc.blocks_for(static_cast<int64_t>(r.tokens.size()))));
      for (auto b : r.table)
        ++owners[static_cast<size_t>(b)];
      table_refs += static_cast<int64_t>(r.table.size());
    }
    int64_t total = 0, cache_refs = 0;
    for (int32_t b = 0; b < num_blocks; ++b) {
      auto rc = alloc.ref_count(b);
      total += rc;
      // Every owner is a table entry or the cache's one reference.
      auto extra = rc - owners[static_cast<size_t>(b)];
      ASSERT_TRUE(extra == 0 || extra == 1) << "block " << b << " rc " << rc;
      cache_refs += extra;
    }
    ASSERT_EQ(total, table_refs + cache.cached_blocks());
    ASSERT_EQ(cache_refs, cache.cached_blocks());
  };
  auto finish = [&](size_t idx) {
    auto r = std::move(live[idx]);
    live.erase(live.begin() + static_cast<ptrdiff_t>(idx));
    // Nobody overwrote this request's K/V while it ran.
    for (size_t i = 0; i < r.table.size(); ++i)
      ASSERT_EQ(content[static_cast<size_t>(r.table[i])], expected_kv(r, i)) << "block " << i;
    auto before = cache.cached_blocks();
    auto n = cache.insert(r.tokens, r.table);
    ASSERT_TRUE(n) << describe(n.error());
    ASSERT_EQ(cache.cached_blocks(), before + *n);
    ASSERT_TRUE(alloc.release_all(r.table));
  };
  // Allocates for `r` with eviction, preempting the oldest request when short.
  auto allocate_for = [&](int32_t n) -> table_t {
    while (true) {
      auto got = cache.allocate(n);
      if (got)
        return *got;
      EXPECT_EQ(code_of(got.error()), errc::unavailable);
      EXPECT_FALSE(live.empty()) << "an idle pool must fit any one request";
      if (live.empty())
        return {};
      ++preemptions;
      finish(0);
    }
  };

  for (int step = 0; step < num_requests; ++step) {
    while (live.size() >= static_cast<size_t>(uniform(1, 8)))
      finish(static_cast<size_t>(uniform(0, static_cast<int>(live.size()) - 1)));
    if (HasFatalFailure())
      return;

    sim_request r;
    tokens_t prompt;
    if (!history.empty() && chance(0.2)) {
      prompt = history[static_cast<size_t>(uniform(0, static_cast<int>(history.size()) - 1))];
    } else {
      prompt = concat(prefixes[static_cast<size_t>(uniform(0, 5))], random_tokens(uniform(1, 10)));
      if (history.size() < 64)
        history.push_back(prompt);
      else
        history[static_cast<size_t>(uniform(0, 63))] = prompt;
    }
    r.prompt_len = prompt.size();
    r.tokens = concat(prompt, random_tokens(uniform(0, 8)));

    auto m = cache.match(prompt, static_cast<int64_t>(prompt.size()) - 1);
    ASSERT_EQ(m.matched_tokens % bs, 0);
    ASSERT_LE(m.matched_tokens, static_cast<int64_t>(prompt.size()) - 1);
    ASSERT_EQ(m.blocks.size(), static_cast<size_t>(m.matched_tokens / bs));
    for (size_t i = 0; i < m.blocks.size(); ++i)
      ASSERT_EQ(content[static_cast<size_t>(m.blocks[i])], expected_kv(r, i))
          << "cached block " << i << " holds another prefix's K/V";
    hits += m.matched_tokens;
    r.table = m.blocks;
    auto need = alloc.blocks_for(static_cast<int64_t>(r.tokens.size())) -
                static_cast<int32_t>(m.blocks.size());
    // Hold the matched blocks while allocating: eviction must skip them.
    auto fresh = allocate_for(need);
    ASSERT_EQ(fresh.size(), static_cast<size_t>(need));
    for (auto b : fresh) {
      ASSERT_EQ(alloc.ref_count(b), 1);
      r.table.push_back(b);
    }
    for (size_t i = m.blocks.size(); i < r.table.size(); ++i)
      content[static_cast<size_t>(r.table[i])] = expected_kv(r, i); // prefill + decode
    if (chance(0.5)) { // prefill done: index the prompt now, or only at finish
      auto n = cache.insert(prompt, r.table);
      ASSERT_TRUE(n) << describe(n.error());
      if (*n < static_cast<int32_t>(prompt.size() / bs - m.blocks.size()))
        ++duplicates;
    }

    // A second sample of the same prompt shares its blocks (GRPO group).
    if (chance(0.25)) {
      ++forks;
      sim_request s;
      s.prompt_len = r.prompt_len;
      s.tokens = concat(prompt, random_tokens(uniform(1, 8)));
      auto shared = static_cast<size_t>(alloc.blocks_for(static_cast<int64_t>(prompt.size())));
      for (size_t i = 0; i < shared; ++i) {
        ASSERT_TRUE(alloc.retain(r.table[i]));
        s.table.push_back(r.table[i]);
      }
      // Copy-on-write: the partly filled last prompt block is shared.
      if (prompt.size() % bs != 0) {
        ASSERT_TRUE(alloc.is_shared(s.table.back()));
        auto copy = allocate_for(1);
        ASSERT_EQ(copy.size(), 1u);
        ASSERT_TRUE(alloc.release(s.table.back()));
        s.table.back() = copy[0];
        ++copies;
      }
      auto more = allocate_for(alloc.blocks_for(static_cast<int64_t>(s.tokens.size())) -
                               static_cast<int32_t>(s.table.size()));
      s.table.insert(s.table.end(), more.begin(), more.end());
      for (size_t i = prompt.size() / bs; i < s.table.size(); ++i)
        content[static_cast<size_t>(s.table[i])] = expected_kv(s, i);
      live.push_back(std::move(s));
    }
    live.push_back(std::move(r));

    if (chance(0.05))
      evicted += cache.evict(uniform(1, 8));
    if (chance(0.002)) { // new weight version: cached K/V is stale
      ++clears;
      cache.clear();
      ASSERT_EQ(cache.cached_blocks(), 0);
    }
    check();
    if (HasFatalFailure())
      return;
  }
  while (!live.empty())
    finish(live.size() - 1);
  check();
  EXPECT_GT(cache.cached_blocks(), 0);
  cache.clear();
  EXPECT_EQ(alloc.num_free(), num_blocks);
  for (int32_t b = 0; b < num_blocks; ++b)
    EXPECT_EQ(alloc.ref_count(b), 0);
  EXPECT_TRUE(alloc.check_invariants());
  // The run exercised every path.
  EXPECT_GT(hits, 0);
  EXPECT_EQ(cache.hit_tokens(), hits);
  EXPECT_GT(forks, 0);
  EXPECT_GT(copies, 0);
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(duplicates, 0);
  EXPECT_GT(clears, 0);
  EXPECT_GT(evicted, 0);
  EXPECT_GT(cache.hit_rate(), 0.1);
}
