#include "actors/inference/engine.hpp"
#include "models/llama.hpp"
#include "tests/actors/tiny_engine.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <random>
#include <set>

using namespace troupe;
using namespace troupe::actors::inference;
using namespace troupe::actors::inference::testing;

namespace {

std::vector<int64_t> random_prompt(std::mt19937& rng, int min_len, int max_len) {
  std::uniform_int_distribution<int> len(min_len, max_len);
  std::uniform_int_distribution<int64_t> tok(0, 49);
  std::vector<int64_t> p(static_cast<size_t>(len(rng)));
  for (auto& t : p)
    t = tok(rng);
  return p;
}

/// Greedy decoding by full recomputation of the dense forward every step.
std::vector<int64_t> greedy_reference(models::llama_model& m, std::vector<int64_t> ids, int n) {
  torch::NoGradGuard ng;
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) {
    auto t = torch::tensor(ids, torch::kLong).unsqueeze(0);
    auto next = m->forward(t, {}).select(1, t.size(1) - 1).argmax(-1).item<int64_t>();
    out.push_back(next);
    ids.push_back(next);
  }
  return out;
}


} // namespace

TEST(Engine, GreedyEqualsFullRecompute) {
  auto m = tiny_model();
  auto e = make_engine(m);
  std::mt19937 rng(3);
  std::vector<generate_request> reqs;
  for (int i = 0; i < 5; ++i)
    reqs.push_back({"r" + std::to_string(i), random_prompt(rng, 1, 13), greedy(12)});
  auto outs = e->generate(reqs);
  ASSERT_TRUE(outs) << describe(outs.error());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*outs)[i].samples[0].tokens, greedy_reference(m, reqs[i].prompt, 12)) << i;
    EXPECT_EQ((*outs)[i].samples[0].finish_reason, "length");
  }
  EXPECT_LT(e->free_blocks(), e->metrics().num_blocks); // prompts stay cached
  e->clear_prefix_cache();
  EXPECT_EQ(e->free_blocks(), e->metrics().num_blocks);
}

TEST(Engine, LogprobsEqualTeacherForcedForward) {
  auto m = tiny_model();
  auto e = make_engine(m);
  std::mt19937 rng(5);
  auto prompt = random_prompt(rng, 6, 6);
  auto sp = random_sampling(10, 99);
  sp.temperature = 0.7;
  auto outs = e->generate({{"a", prompt, sp}});
  ASSERT_TRUE(outs) << describe(outs.error());
  const auto& s = (*outs)[0].samples[0];
  ASSERT_EQ(s.tokens.size(), 10u);
  std::vector<int64_t> full = prompt;
  full.insert(full.end(), s.tokens.begin(), s.tokens.end());
  torch::NoGradGuard ng;
  auto logits = m->forward(torch::tensor(full, torch::kLong).unsqueeze(0), {})[0];
  auto lp = torch::log_softmax(logits / 0.7, -1);
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    auto pos = static_cast<int64_t>(prompt.size() + i - 1);
    EXPECT_NEAR(s.logprobs[i], lp[pos][s.tokens[i]].item<float>(), 1e-5) << i;
  }
}

TEST(Engine, StaggeredArrivalsGiveTheSameOutputsAsAlone) {
  auto m = tiny_model();
  std::mt19937 rng(11);
  std::vector<generate_request> reqs;
  for (int i = 0; i < 6; ++i)
    reqs.push_back({"s" + std::to_string(i), random_prompt(rng, 2, 20),
                    random_sampling(8 + i, 1000 + static_cast<uint64_t>(i))});
  std::vector<std::vector<int64_t>> alone;
  for (auto& r : reqs) {
    auto e = make_engine(m);
    auto o = e->generate({r});
    ASSERT_TRUE(o);
    alone.push_back((*o)[0].samples[0].tokens);
  }
  auto e = make_engine(m);
  std::map<std::string, std::vector<int64_t>> got;
  size_t next = 0;
  while (next < reqs.size() || !e->idle()) {
    if (next < reqs.size()) {
      ASSERT_TRUE(e->add_request(reqs[next++])); // one new arrival per step
    }
    auto done = e->step();
    ASSERT_TRUE(done) << describe(done.error());
    for (auto& o : *done)
      got[o.id] = o.samples[0].tokens;
  }
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[reqs[i].id], alone[i]) << reqs[i].id;
}

TEST(Engine, PoolExhaustionPreemptsAndRecomputesToTheSameOutputs) {
  auto m = tiny_model();
  std::mt19937 rng(17);
  std::vector<generate_request> reqs;
  for (int i = 0; i < 8; ++i)
    reqs.push_back({"p" + std::to_string(i), random_prompt(rng, 4, 10), greedy(16)});
  auto big = make_engine(m);
  auto expect = big->generate(reqs);
  ASSERT_TRUE(expect);
  engine_config small;
  small.block_size = 4;
  small.num_blocks = 10; // 40 token slots for 8 requests of up to 26 tokens
  auto e = make_engine(m, small);
  auto outs = e->generate(reqs);
  ASSERT_TRUE(outs) << describe(outs.error());
  EXPECT_GT(e->metrics().preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*outs)[i].samples[0].tokens, (*expect)[i].samples[0].tokens) << i;
    EXPECT_EQ((*outs)[i].samples[0].tokens.size(), 16u); // never truncated
  }
  e->clear_prefix_cache();
  EXPECT_EQ(e->free_blocks(), 10);
}

TEST(Engine, NSamplesSharePromptKvAndSampleZeroMatchesASingleSample) {
  auto m = tiny_model();
  std::mt19937 rng(23);
  auto prompt = random_prompt(rng, 18, 18); // 4 full blocks + 2 tokens in a shared last block
  auto sp = random_sampling(6, 4242);
  sp.n = 8;
  auto e = make_engine(m);
  auto outs = e->generate({{"g", prompt, sp}});
  ASSERT_TRUE(outs) << describe(outs.error());
  ASSERT_EQ((*outs)[0].samples.size(), 8u);
  EXPECT_EQ(e->metrics().prefill_tokens_computed, 18); // once, not 8 times
  auto single = sp;
  single.n = 1;
  auto e1 = make_engine(m);
  auto one = e1->generate({{"one", prompt, single}});
  ASSERT_TRUE(one);
  EXPECT_EQ((*outs)[0].samples[0].tokens, (*one)[0].samples[0].tokens);
  // The samples differ from each other (independent streams).
  std::set<std::vector<int64_t>> distinct;
  for (const auto& s : (*outs)[0].samples)
    distinct.insert(s.tokens);
  EXPECT_GT(distinct.size(), 1u);
  e->clear_prefix_cache();
  EXPECT_EQ(e->free_blocks(), e->metrics().num_blocks);
}

// NOTE [token-in, token-out]: a request that extends a finished one by
// appended tokens samples what a request with the whole sequence as its
// prompt samples, and computes only the tokens past the earlier
// sequence's cached whole blocks.
TEST(Engine, ARequestExtendsAFinishedSequenceReusingItsCache) {
  auto m = tiny_model();
  std::mt19937 rng(31);
  auto prompt = random_prompt(rng, 9, 9);
  auto turn = random_prompt(rng, 3, 3); // the appended tokens (a next turn)
  auto e = make_engine(m);
  auto first = e->generate({{"t1", prompt, greedy(7)}});
  ASSERT_TRUE(first) << describe(first.error());
  const auto before = e->metrics().prefill_tokens_computed;
  generate_request next{"t2", turn, greedy(5)};
  next.extends = "t1";
  auto second = e->generate({next});
  ASSERT_TRUE(second) << describe(second.error());
  // 9 + 7 = 16 tokens of which 15 were computed (the last sampled token's
  // K/V was not): 3 whole blocks cached; the extension computes 16 - 12 +
  // 3 = 7 of its 19 prompt tokens.
  EXPECT_EQ(e->metrics().prefill_tokens_computed - before, 7);
  std::vector<int64_t> whole = prompt;
  whole.insert(whole.end(), (*first)[0].samples[0].tokens.begin(),
               (*first)[0].samples[0].tokens.end());
  whole.insert(whole.end(), turn.begin(), turn.end());
  EXPECT_EQ((*second)[0].prompt, whole) << "the output's prompt is the whole sequence";
  auto fresh = make_engine(m)->generate({{"whole", whole, greedy(5)}});
  ASSERT_TRUE(fresh);
  EXPECT_EQ((*second)[0].samples[0].tokens, (*fresh)[0].samples[0].tokens);
  generate_request unknown{"t3", turn, greedy(2)};
  unknown.extends = "nope";
  auto bad = e->generate({unknown});
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("extends 'nope': no finished request"), std::string::npos)
      << describe(bad.error());
}

// An id used again (an evaluation's ids, each time it runs) is kept as its
// latest request, counted young again: the earlier use's place in the
// order of the last 1024 never evicts it.
TEST(Engine, AReusedIdIsKeptAsItsLatestRequest) {
  auto m = tiny_model();
  std::mt19937 rng(37);
  auto e = make_engine(m);
  auto batch_of = [&](const std::string& prefix, int n) {
    std::vector<generate_request> rs;
    for (int i = 0; i < n; ++i)
      rs.push_back({prefix + std::to_string(i), random_prompt(rng, 2, 2), greedy(1)});
    return rs;
  };
  ASSERT_TRUE(e->generate({{"r", random_prompt(rng, 3, 3), greedy(1)}}));
  ASSERT_TRUE(e->generate(batch_of("x", 1000)));
  auto again = e->generate({{"r", random_prompt(rng, 4, 4), greedy(2)}});
  ASSERT_TRUE(again) << describe(again.error());
  ASSERT_TRUE(e->generate(batch_of("y", 100)))
      << "1101 ids since r's first use, 101 since its last";
  generate_request next{"r2", random_prompt(rng, 1, 1), greedy(1)};
  next.extends = "r";
  auto second = e->generate({next});
  ASSERT_TRUE(second) << describe(second.error());
  auto whole = (*again)[0].prompt;
  whole.insert(whole.end(), (*again)[0].samples[0].tokens.begin(),
               (*again)[0].samples[0].tokens.end());
  whole.insert(whole.end(), next.prompt.begin(), next.prompt.end());
  EXPECT_EQ((*second)[0].prompt, whole) << "extends the latest 'r'";
}

TEST(Engine, RepeatedPromptsHitThePrefixCache) {
  auto m = tiny_model();
  std::mt19937 rng(29);
  auto prompt = random_prompt(rng, 17, 17);
  auto e = make_engine(m);
  auto first = e->generate({{"a", prompt, greedy(5)}});
  auto second = e->generate({{"b", prompt, greedy(5)}});
  ASSERT_TRUE(first && second);
  EXPECT_EQ((*first)[0].samples[0].tokens, (*second)[0].samples[0].tokens);
  auto m2 = e->metrics();
  // 17 tokens = 4 full blocks: the second request reuses 16 and computes 1.
  EXPECT_EQ(m2.prefill_tokens_computed, 17 + 1);
  EXPECT_GT(m2.prefix_hit_rate, 0.0);
}

TEST(Engine, BadRequestsGetClearErrorsAndDoNotDisturbOthers) {
  auto m = tiny_model();
  auto e = make_engine(m);
  ASSERT_TRUE(e->add_request({"good", {1, 2, 3}, greedy(4)}));
  auto empty = e->add_request({"empty", {}, greedy(4)});
  ASSERT_FALSE(empty);
  EXPECT_EQ(describe(empty.error()), "invalid_argument: request 'empty': prompt: empty prompt");
  auto too_long = e->add_request({"long", std::vector<int64_t>(96, 1), greedy(4)});
  ASSERT_FALSE(too_long);
  EXPECT_NE(describe(too_long.error()).find("request 'long': prompt: 96 tokens do not fit the context of 96"),
            std::string::npos)
    << describe(too_long.error());
  auto zero = e->add_request({"zero", {1}, greedy(0)});
  ASSERT_FALSE(zero);
  EXPECT_NE(describe(zero.error()).find("request 'zero': sampling.max_tokens: expected an integer >= 1, got 0"),
            std::string::npos)
    << describe(zero.error());
  auto bad_tok = e->add_request({"tok", {1, 77}, greedy(2)});
  ASSERT_FALSE(bad_tok);
  EXPECT_NE(describe(bad_tok.error()).find("prompt[1]: token 77 outside the vocabulary [0, 50)"),
            std::string::npos);
  auto dup = e->add_request({"good", {1}, greedy(2)});
  ASSERT_FALSE(dup);
  auto outs = e->run_until_idle();
  ASSERT_TRUE(outs);
  ASSERT_EQ(outs->size(), 1u);
  EXPECT_EQ((*outs)[0].samples[0].tokens, greedy_reference(m, {1, 2, 3}, 4));
}

TEST(Engine, StopTokensEndGenerationAndAreKept) {
  auto m = tiny_model();
  auto e = make_engine(m);
  auto ref = greedy_reference(m, {5, 6, 7}, 10);
  auto sp = greedy(10);
  sp.stop_token_ids = {ref[3]};
  auto outs = e->generate({{"s", {5, 6, 7}, sp}});
  ASSERT_TRUE(outs);
  const auto& s = (*outs)[0].samples[0];
  auto first_stop = std::find(ref.begin(), ref.end(), ref[3]) - ref.begin();
  EXPECT_EQ(s.tokens, std::vector<int64_t>(ref.begin(), ref.begin() + first_stop + 1));
  EXPECT_EQ(s.finish_reason, "stop");
}

TEST(Engine, WeightUpdateInPlaceTagsOutputsAndMatchesAFreshEngine) {
  auto m = tiny_model(1);
  auto e = make_engine(m);
  std::vector<int64_t> prompt{3, 1, 4, 1, 5, 9, 2, 6};
  auto before = e->generate({{"x", prompt, greedy(6)}});
  ASSERT_TRUE(before);
  EXPECT_EQ((*before)[0].weight_version, 0);
  auto other = tiny_model(2);
  auto stale = e->load_weights(0, models::export_hf_weights(other));
  ASSERT_FALSE(stale);
  EXPECT_EQ(code_of(stale.error()), errc::version_mismatch);
  ASSERT_TRUE(e->load_weights(1, models::export_hf_weights(other)));
  auto after = e->generate({{"y", prompt, greedy(6)}});
  ASSERT_TRUE(after);
  EXPECT_EQ((*after)[0].weight_version, 1);
  EXPECT_EQ((*after)[0].samples[0].tokens, greedy_reference(other, prompt, 6));
  // The prefix cached under version 0 was dropped: the prompt was recomputed.
  EXPECT_EQ(e->metrics().prefill_tokens_computed, 2 * 8);
}

// NOTE [in-flight update]: a version loaded while a sequence runs. Kept,
// its K/V is not computed again, its tokens are tagged with the versions
// that sampled them, and it never enters the prefix cache (a later request
// with its prompt computes the prompt again); recomputed, its K/V is
// computed again under the new weights, and its continuation is exactly the
// new weights' greedy one.
TEST(Engine, AnUpdateWhileASequenceRunsKeepsOrRecomputesItsKv) {
  auto v0 = tiny_model(1), v1 = tiny_model(2);
  const std::vector<int64_t> prompt{3, 1, 4, 1, 5, 9, 2, 6};
  for (auto mode : {update_kv::keep, update_kv::recompute}) {
    SCOPED_TRACE(to_string(mode));
    engine_config c;
    c.on_update = mode;
    auto e = make_engine(copy_of(v0, models::head_kind::lm), c);
    ASSERT_TRUE(e->add_request({"x", prompt, greedy(8)}));
    for (int i = 0; i < 3; ++i) // the prompt and two decodes: three tokens
      ASSERT_TRUE(e->step());
    EXPECT_EQ(e->metrics().prefill_tokens_computed, 8);
    ASSERT_TRUE(e->load_weights(1, models::export_hf_weights(v1)));
    auto outs = e->run_until_idle();
    ASSERT_TRUE(outs && outs->size() == 1);
    const auto& s = outs->front().samples[0];
    EXPECT_EQ(s.versions, (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1, 1}));
    ASSERT_EQ(s.tokens.size(), 8u);
    std::vector<int64_t> head(s.tokens.begin(), s.tokens.begin() + 3);
    EXPECT_EQ(head, greedy_reference(v0, prompt, 3));
    auto seen = prompt;
    seen.insert(seen.end(), head.begin(), head.end());
    EXPECT_EQ(e->metrics().prefill_tokens_computed, 8);
    const auto recomputed = e->metrics().recomputed_tokens;
    if (mode == update_kv::keep) {
      EXPECT_EQ(recomputed, 0) << "no token computed twice";
    } else {
      EXPECT_EQ(recomputed, 10) << "the prompt and the tokens so far but the last (a decode's)";
      EXPECT_EQ(std::vector<int64_t>(s.tokens.begin() + 3, s.tokens.end()),
                greedy_reference(v1, seen, 5));
    }
    auto before = e->metrics().prefill_tokens_computed;
    ASSERT_TRUE(e->generate({{"again", prompt, greedy(1)}}));
    const auto again = e->metrics().prefill_tokens_computed - before;
    if (mode == update_kv::keep)
      EXPECT_EQ(again, 8) << "a sequence of mixed versions is not a cached prefix";
    else
      EXPECT_LT(again, 8) << "recomputed under version 1, its prompt is cached";
  }
}

// NOTE [engine snapshot]: an engine's requests exported mid-generation —
// forked samples, some finished, some still waiting for a slot, K/V from
// two weight versions — and imported into a fresh engine at the same
// version finish exactly as the uninterrupted engine finishes them, and
// its counters go on from the exported ones.
TEST(Engine, ASnapshotImportedIntoAFreshEngineFinishesAsTheOriginalWould) {
  auto v0 = tiny_model(1), v1 = tiny_model(2);
  engine_config c;
  c.max_num_seqs = 3; // the last requests wait for a slot
  std::mt19937 rng(11);
  std::vector<generate_request> requests;
  for (int i = 0; i < 5; ++i) {
    auto sp = random_sampling(4 + 2 * i, 100 + static_cast<uint64_t>(i));
    sp.n = i % 2 == 0 ? 2 : 1;
    requests.push_back({"r" + std::to_string(i), random_prompt(rng, 3, 9), sp});
  }
  auto start = [&] {
    auto e = make_engine(copy_of(v0, models::head_kind::lm), c);
    EXPECT_TRUE(e->add_requests(requests));
    std::map<std::string, request_output> done;
    auto steps = [&](int n) {
      for (int i = 0; i < n; ++i) {
        auto outs = e->step();
        EXPECT_TRUE(outs);
        for (auto& o : *outs)
          done.emplace(o.id, o);
      }
    };
    steps(3);
    EXPECT_TRUE(e->load_weights(1, models::export_hf_weights(v1)));
    steps(4);
    return std::make_pair(std::move(e), std::move(done));
  };
  auto [straight, done_straight] = start();
  auto [saved, done_saved] = start();
  auto snap = saved->export_state();
  ASSERT_TRUE(snap) << describe(snap.error());
  auto fresh = make_engine(copy_of(v0, models::head_kind::lm), c);
  ASSERT_TRUE(fresh->load_weights(1, models::export_hf_weights(v1)));
  auto ids = fresh->import_state(*snap);
  ASSERT_TRUE(ids) << describe(ids.error());
  EXPECT_EQ(ids->size() + done_saved.size(), requests.size());
  EXPECT_EQ(fresh->metrics().generated_tokens, saved->metrics().generated_tokens);
  EXPECT_EQ(fresh->metrics().waiting, saved->metrics().waiting);
  EXPECT_GT(fresh->metrics().waiting, 0) << "a request still waits for a slot";
  auto rest = fresh->run_until_idle();
  auto rest_straight = straight->run_until_idle();
  ASSERT_TRUE(rest && rest_straight);
  for (auto& o : *rest)
    done_saved.emplace(o.id, o);
  for (auto& o : *rest_straight)
    done_straight.emplace(o.id, o);
  ASSERT_EQ(done_saved.size(), requests.size());
  bool mixed = false;
  for (const auto& [id, a] : done_straight) {
    const auto& b = done_saved.at(id);
    ASSERT_EQ(a.samples.size(), b.samples.size()) << id;
    for (size_t k = 0; k < a.samples.size(); ++k) {
      EXPECT_EQ(a.samples[k].tokens, b.samples[k].tokens) << id << " sample " << k;
      EXPECT_EQ(a.samples[k].logprobs, b.samples[k].logprobs) << id << " sample " << k;
      EXPECT_EQ(a.samples[k].versions, b.samples[k].versions) << id << " sample " << k;
      EXPECT_EQ(a.samples[k].finish_reason, b.samples[k].finish_reason) << id;
      mixed = mixed || (a.samples[k].versions.front() == 0 && a.samples[k].versions.back() == 1);
    }
  }
  EXPECT_TRUE(mixed) << "a sample spans the update";
  EXPECT_EQ(fresh->metrics().generated_tokens, straight->metrics().generated_tokens);
  EXPECT_EQ(fresh->metrics().steps, straight->metrics().steps);
  fresh->clear_prefix_cache();
  EXPECT_EQ(fresh->free_blocks(), fresh->metrics().num_blocks) << "no block leaked";
}

// A snapshot goes only into an engine that holds no requests, at its weight
// version; a refused import leaves the engine as it was.
TEST(Engine, ASnapshotIsRefusedByABusyEngineAnotherVersionOrBadBytes) {
  auto m = tiny_model();
  auto e = make_engine(m);
  ASSERT_TRUE(e->add_request({"a", {1, 2, 3}, greedy(6)}));
  ASSERT_TRUE(e->step());
  auto snap = e->export_state();
  ASSERT_TRUE(snap) << describe(snap.error());

  auto busy = make_engine(m);
  ASSERT_TRUE(busy->add_request({"b", {4, 5}, greedy(2)}));
  auto refused = busy->import_state(*snap);
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error()).find("requests are in the engine already"), std::string::npos)
      << describe(refused.error());

  auto newer = make_engine(m);
  ASSERT_TRUE(newer->load_weights(3, models::export_hf_weights(m)));
  refused = newer->import_state(*snap);
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error()).find("weight version 0, the engine holds version 3"),
            std::string::npos)
      << describe(refused.error());
  EXPECT_EQ(newer->free_blocks(), newer->metrics().num_blocks);

  auto other = make_engine(m);
  refused = other->import_state(snap->substr(0, snap->size() / 2));
  ASSERT_FALSE(refused);
  EXPECT_EQ(code_of(refused.error()), errc::corrupted);
  EXPECT_TRUE(other->idle());
  EXPECT_EQ(other->free_blocks(), other->metrics().num_blocks);
  // The good snapshot still goes in, and finishes the request.
  ASSERT_TRUE(other->import_state(*snap));
  EXPECT_TRUE(other->holds("a"));
  auto outs = other->run_until_idle();
  ASSERT_TRUE(outs && outs->size() == 1);
  EXPECT_EQ(outs->front().samples[0].tokens, greedy_reference(m, {1, 2, 3}, 6));
}

TEST(Engine, TenThousandRandomRequestsLeaveThePoolEmpty) {
  auto m = tiny_model();
  engine_config c;
  c.block_size = 4;
  c.num_blocks = 48;
  c.max_num_seqs = 64;
  auto e = make_engine(m, c);
  std::mt19937 rng(31);
  std::uniform_int_distribution<int> max_tok(1, 4), n(1, 3), shared(0, 3);
  std::vector<std::vector<int64_t>> prefixes;
  for (int i = 0; i < 4; ++i)
    prefixes.push_back(random_prompt(rng, 4, 9));
  int64_t finished = 0;
  for (int i = 0; i < 10000; ++i) {
    auto p = prefixes[static_cast<size_t>(shared(rng))];
    auto tail = random_prompt(rng, 1, 5);
    p.insert(p.end(), tail.begin(), tail.end());
    auto sp = random_sampling(max_tok(rng), static_cast<uint64_t>(i));
    sp.n = n(rng);
    ASSERT_TRUE(e->add_request({std::to_string(i), p, sp}));
    if (i % 16 == 15) {
      auto done = e->step();
      ASSERT_TRUE(done) << describe(done.error());
      finished += static_cast<int64_t>(done->size());
    }
  }
  auto rest = e->run_until_idle();
  ASSERT_TRUE(rest) << describe(rest.error());
  finished += static_cast<int64_t>(rest->size());
  EXPECT_EQ(finished, 10000);
  e->clear_prefix_cache();
  EXPECT_EQ(e->free_blocks(), 48);
  EXPECT_EQ(e->metrics().kv_utilization, 0.0);
}

TEST(Engine, AddRequestsQueuesAllOrNone) {
  auto e = make_engine(tiny_model());
  std::vector<generate_request> reqs = {{"p", {1, 2, 3}, greedy(4)},
                                        {"q", {4, 5}, greedy(4)},
                                        {"p", {6}, greedy(4)}};
  auto dup = e->add_requests(reqs);
  ASSERT_FALSE(dup);
  EXPECT_NE(describe(dup.error()).find("request 'p': id appears twice in one batch"),
            std::string::npos)
      << describe(dup.error());
  EXPECT_TRUE(e->idle()) << "nothing of a rejected batch is queued";
  reqs[2].id = "r";
  reqs[2].sampling.max_tokens = 0;
  auto bad = e->add_requests(reqs);
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("request 'r'"), std::string::npos) << describe(bad.error());
  EXPECT_TRUE(e->idle());
  reqs[2].sampling.max_tokens = 4;
  ASSERT_TRUE(e->add_requests(reqs));
  auto outs = e->run_until_idle();
  ASSERT_TRUE(outs) << describe(outs.error());
  EXPECT_EQ(outs->size(), 3u);
}

// NOTE [kv pool size]: the pool holds the expected work, at least one
// sequence of the whole context, at most kv_cache_mb; num_blocks wins.
TEST(KvPoolSize, FollowsTheWorkWithinTheCap) {
  models::llama_config m;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.num_hidden_layers = 3;
  m.max_position_embeddings = 256;
  engine_config c; // block_size 16, max_num_seqs 64, cap 256 MiB
  const int64_t block = 2 * 3 * 16 * 2 * 16 * 4;
  EXPECT_EQ(kv_block_bytes(c, m, 4), block);
  // Unknown work: max_num_seqs sequences of the whole context.
  EXPECT_EQ(*kv_pool_blocks(c, m, 4), 64 * 16);
  // Two sequences of 40 tokens: 2 x 3 blocks, but one whole context (16).
  c.expected_sequences = 2;
  c.expected_tokens = 40;
  EXPECT_EQ(*kv_pool_blocks(c, m, 4), 16);
  // 100 sequences of 40 tokens: max_num_seqs (64) of them, 3 blocks each.
  c.expected_sequences = 100;
  EXPECT_EQ(*kv_pool_blocks(c, m, 4), 64 * 3);
  // The cap.
  c.kv_cache_mb = 10.0 * block / (1 << 20);
  EXPECT_EQ(*kv_pool_blocks(c, m, 4), 10);
  c.kv_cache_mb = 0.5 * block / (1 << 20);
  auto none = kv_pool_blocks(c, m, 4);
  ASSERT_FALSE(none);
  EXPECT_EQ(code_of(none.error()), errc::invalid_config);
  // An explicit pool.
  c.num_blocks = 7;
  EXPECT_EQ(*kv_pool_blocks(c, m, 4), 7);
  // An engine made without a pool size holds what its requests need.
  auto model = tiny_model(); // tests/actors/tiny_engine.hpp
  engine_config sized;
  sized.expected_sequences = 1;
  sized.expected_tokens = 8;
  auto e = engine::make(model, sized);
  ASSERT_TRUE(e) << describe(e.error());
  auto ctx = model->config().max_position_embeddings;
  EXPECT_EQ((*e)->metrics().num_blocks, (ctx + 15) / 16);
}

// NOTE [decode panels]: the packed copy is made where steps batch, its
// bytes come back with the KV pool on release, and a bad value is an error
// naming the key.
TEST(DecodePanels, PackedWhereStepsBatchAndReleasedWithTheKvPool) {
  engine_config c;
  EXPECT_TRUE(packs_decode_panels(c)); // max_num_seqs 64
  c.expected_sequences = 1;
  EXPECT_FALSE(packs_decode_panels(c)); // one sequence: batch-1 steps read the stored rows
  c.decode_panels = panels_mode::on;
  EXPECT_TRUE(packs_decode_panels(c));
  c.decode_panels = panels_mode::off;
  c.expected_sequences = 8;
  EXPECT_FALSE(packs_decode_panels(c));
  c.decode_panels = panels_mode::automatic;
  c.decode_isa = static_cast<isa_mode>(9);
  auto bad_isa = validate(c);
  ASSERT_FALSE(bad_isa);
  EXPECT_NE(describe(bad_isa.error())
                .find("engine.decode_isa: expected one of auto, avx512, avx2, "
                      "baseline, got 9"),
            std::string::npos);
  c.decode_isa = isa_mode::automatic;
  c.decode_panels = static_cast<panels_mode>(7);
  auto bad = validate(c);
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("engine.decode_panels"), std::string::npos);

  auto m = tiny_model();
  engine_config one;
  one.expected_sequences = 1;
  make_engine(m, one);
  EXPECT_EQ(m->decode_panels(), panels_mode::off);
  auto e = make_engine(m); // max_num_seqs 64: packs
  EXPECT_EQ(m->decode_panels(), panels_mode::automatic);
  std::vector<generate_request> reqs;
  for (int i = 0; i < 3; ++i)
    reqs.push_back({"r" + std::to_string(i), {1, 2, 3, static_cast<int64_t>(i)}, greedy(4)});
  auto outs = e->generate(reqs);
  ASSERT_TRUE(outs) << describe(outs.error());
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ((*outs)[i].samples[0].tokens, greedy_reference(m, reqs[i].prompt, 4)) << i;
  const auto panels = models::decode_panels_bytes(m->config());
  EXPECT_EQ(m->decode_panels_bytes(), panels);
  auto kv = e->metrics().num_blocks * kv_block_bytes(e->config(), m->config(), 4);
  auto freed = e->release_kv_cache();
  ASSERT_TRUE(freed) << describe(freed.error());
  EXPECT_EQ(*freed, kv + panels);
  EXPECT_EQ(m->decode_panels_bytes(), 0);
  // The next batch makes both again.
  auto again = e->generate(reqs);
  ASSERT_TRUE(again) << describe(again.error());
  EXPECT_EQ((*again)[1].samples[0].tokens, (*outs)[1].samples[0].tokens);
  EXPECT_EQ(m->decode_panels_bytes(), panels);
}
