#include "actors/inference/engine.hpp"

#include "actors/inference/block_allocator.hpp"
#include "actors/inference/prefix_cache.hpp"
#include "models/batch_invariant.hpp"
#include "models/llama.hpp"
#include "runtime/binary_form.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <set>
#include <span>

namespace troupe::actors::inference {

namespace {

using clock_type = std::chrono::steady_clock;

double ms_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct request_state;

/// One sample of a request: its tokens, KV blocks and random stream.
struct sequence {
  int64_t id = 0;
  request_state* req = nullptr;
  int32_t sample_index = 0;
  std::vector<int64_t> tokens; ///< prompt + generated
  std::vector<float> logprobs; ///< one per generated token
  std::vector<int64_t> versions; ///< the weight version that sampled each
  /// Its K/V mixes weight versions (NOTE [in-flight update]): kept out of
  /// the prefix cache.
  bool mixed_kv = false;
  int64_t num_computed = 0;    ///< tokens whose K/V is in the cache
  std::vector<int32_t> blocks;
  rng_stream rng;
  clock_type::time_point last_token_at{};
  bool finished = false;
  std::string finish_reason;
  int64_t generated() const { return static_cast<int64_t>(logprobs.size()); }
};

struct request_state {
  generate_request request;
  std::vector<std::unique_ptr<sequence>> samples; ///< index = sample index
  int32_t remaining = 0;                          ///< unfinished samples
  bool forked = false;                            ///< samples 1..n-1 exist
  clock_type::time_point arrived{};
  clock_type::time_point first_token_at{};
  bool has_first_token = false;
  int64_t version_first = -1;
};

// NOTE [engine snapshot]: the records of export_state, CAF's binary form.
struct sequence_record {
  int32_t sample_index = 0;
  std::vector<int64_t> tokens;
  std::vector<float> logprobs;
  std::vector<int64_t> versions;
  bool mixed_kv = false;
  int64_t num_computed = 0;
  std::vector<int32_t> blocks; ///< indices into the snapshot's blocks
  uint64_t rng0 = 0, rng1 = 0;
  bool finished = false;
  std::string finish_reason;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sequence_record& x) {
  return f(caf::meta::type_name("sequence_record"), x.sample_index, x.tokens,
           runtime::wire(x.logprobs), x.versions, x.mixed_kv, x.num_computed, x.blocks, x.rng0,
           x.rng1, x.finished, x.finish_reason);
}

struct request_record {
  generate_request request;
  bool forked = false;
  int32_t remaining = 0;
  int64_t version_first = -1;
  bool has_first_token = false;
  std::vector<sequence_record> samples;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_record& x) {
  return f(caf::meta::type_name("request_record"), x.request, x.forked, x.remaining,
           x.version_first, x.has_first_token, x.samples);
}

/// A place in a queue: a request's sample.
struct slot_record {
  std::string id;
  int32_t sample = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, slot_record& x) {
  return f(caf::meta::type_name("slot_record"), x.id, x.sample);
}

struct state_record {
  int64_t version = 0;
  int64_t block_size = 0;
  std::vector<request_record> requests;
  std::vector<slot_record> running, waiting;
  int64_t blocks = 0;      ///< blocks whose K/V follows
  int64_t block_bytes = 0; ///< bytes of one block's K (or V) in one layer
  std::string kv;          ///< per layer: K of every block, then V
  engine_metrics metrics;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, state_record& x) {
  return f(caf::meta::type_name("engine_state"), x.version, x.block_size, x.requests, x.running,
           x.waiting, x.blocks, x.block_bytes, x.kv, x.metrics);
}

} // namespace

struct engine::impl {
  models::llama_model model{nullptr};
  engine_config config;
  int64_t max_model_len = 0;
  int64_t vocab = 0;
  std::vector<int64_t> eos;
  models::paged_kv_cache kv;
  std::unique_ptr<block_allocator> blocks;
  std::unique_ptr<prefix_cache> prefixes;
  std::map<std::string, std::unique_ptr<request_state>> requests;
  std::deque<sequence*> waiting;
  std::vector<sequence*> running; ///< admission order (last = most recent)
  int64_t next_seq_id = 0;
  uint64_t seed_counter = 0;
  int64_t version = 0;
  engine_metrics m;

  // ---- block helpers ---------------------------------------------------------

  /// A free block, evicting unreferenced cached prefixes when the pool is short.
  std::optional<int32_t> take_block() {
    if (blocks->num_free() == 0 && prefixes)
      prefixes->evict(1);
    auto b = blocks->allocate();
    if (!b)
      return std::nullopt;
    return *b;
  }

  void release_blocks(sequence& s) {
    for (auto b : s.blocks)
      blocks->release(b);
    s.blocks.clear();
    s.num_computed = 0;
    s.mixed_kv = false; // computed again, under the current weights
  }

  /// Copies the K/V of every layer from block `src` to block `dst`.
  void copy_block(int32_t src, int32_t dst) {
    torch::NoGradGuard ng;
    for (size_t l = 0; l < kv.k.size(); ++l) {
      kv.k[l][dst].copy_(kv.k[l][src]);
      kv.v[l][dst].copy_(kv.v[l][src]);
    }
  }

  /// Ensures `s` owns writable blocks for tokens [num_computed, upto). Returns
  /// false when the pool ran out (already-taken blocks stay with `s`).
  bool reserve(sequence& s, int64_t upto) {
    auto bs = config.block_size;
    // Copy-on-write: the first slot written may sit in a shared, partly
    // filled block (forked samples share their prompt's last block).
    if (s.num_computed % bs != 0) {
      auto idx = static_cast<size_t>(s.num_computed / bs);
      auto old = s.blocks[idx];
      if (blocks->ref_count(old) > 1) {
        auto fresh = take_block();
        if (!fresh)
          return false;
        copy_block(old, *fresh);
        blocks->release(old);
        s.blocks[idx] = *fresh;
      }
    }
    auto needed = (upto + bs - 1) / bs;
    while (static_cast<int64_t>(s.blocks.size()) < needed) {
      auto b = take_block();
      if (!b)
        return false;
      s.blocks.push_back(*b);
    }
    return true;
  }

  /// Frees the most recently admitted running sequence other than `keep`
  /// and puts it at the front of the waiting queue. False if none.
  bool preempt_one(const sequence* keep) {
    for (auto it = running.rbegin(); it != running.rend(); ++it) {
      if (*it == keep)
        continue;
      auto* victim = *it;
      running.erase(std::next(it).base());
      release_blocks(*victim);
      waiting.push_front(victim);
      ++m.preemptions;
      return true;
    }
    return false;
  }

  // ---- validation ------------------------------------------------------------

  // NOTE [token-in, token-out]: the sequences of the last finished requests
  // (each of their samples), by id, for requests that extend them.
  static constexpr size_t kKeptRequests = 1024;
  std::map<std::string, std::vector<std::vector<int64_t>>> kept;
  std::deque<std::string> kept_order;

  void keep_sequences(const request_state& req) {
    std::vector<std::vector<int64_t>> seqs;
    seqs.reserve(req.samples.size());
    for (const auto& s : req.samples)
      seqs.push_back(s->tokens);
    // A reused id is its latest request's, and as young as it.
    if (!kept.insert_or_assign(req.request.id, std::move(seqs)).second)
      kept_order.erase(std::find(kept_order.begin(), kept_order.end(), req.request.id));
    kept_order.push_back(req.request.id);
    while (kept_order.size() > kKeptRequests) {
      kept.erase(kept_order.front());
      kept_order.pop_front();
    }
  }

  /// A request that extends another with its whole prompt (the earlier
  /// sequence, then the appended tokens).
  expected<void> resolve_extension(generate_request& r) const {
    if (r.extends.empty())
      return caf::unit;
    auto [id, index] = parse_sample_ref(r.extends);
    auto it = kept.find(id);
    if (it == kept.end())
      return make_error(errc::not_found,
                        "request '" + r.id + "': extends '" + r.extends +
                            "': no finished request of that id (the engine keeps the last " +
                            std::to_string(kKeptRequests) + ")");
    if (index >= it->second.size())
      return make_error(errc::not_found, "request '" + r.id + "': extends '" + r.extends +
                                             "': request '" + id + "' had " +
                                             std::to_string(it->second.size()) + " sample(s)");
    const auto& seq = it->second[index];
    r.prompt.insert(r.prompt.begin(), seq.begin(), seq.end());
    r.extends.clear();
    return caf::unit;
  }

  expected<void> check_request(const generate_request& r) const {
    auto where = "request '" + r.id + "': ";
    if (r.id.empty())
      return make_error(errc::invalid_argument, "request: empty id");
    if (requests.count(r.id) != 0)
      return make_error(errc::invalid_argument, where + "id is already in flight");
    if (r.prompt.empty())
      return make_error(errc::invalid_argument, where + "prompt: empty prompt");
    auto len = static_cast<int64_t>(r.prompt.size());
    if (len >= max_model_len)
      return make_error(errc::invalid_argument,
                        where + "prompt: " + std::to_string(len) +
                          " tokens do not fit the context of " + std::to_string(max_model_len) +
                          " (at least one generated token must fit)");
    for (size_t i = 0; i < r.prompt.size(); ++i)
      if (r.prompt[i] < 0 || r.prompt[i] >= vocab)
        return make_error(errc::invalid_argument,
                          where + "prompt[" + std::to_string(i) + "]: token " +
                            std::to_string(r.prompt[i]) + " outside the vocabulary [0, " +
                            std::to_string(vocab) + ")");
    if (auto ok = validate(r.sampling, vocab); !ok)
      return with_prefix(ok.error(), "request '" + r.id + "'");
    auto total = std::min(len + r.sampling.max_tokens, max_model_len);
    auto pool_tokens = blocks->num_blocks() * config.block_size;
    if (total > pool_tokens)
      return make_error(errc::invalid_argument,
                        where + "needs " + std::to_string(total) +
                          " tokens of KV cache, the whole pool holds " +
                          std::to_string(pool_tokens));
    return caf::unit;
  }

  // ---- queueing (after check_request) -----------------------------------------

  void enqueue(generate_request request) {
    auto state = std::make_unique<request_state>();
    state->arrived = clock_type::now();
    auto seed = request.sampling.seed ? *request.sampling.seed
                                      : config.seed * 0x9e3779b97f4a7c15ULL + seed_counter++;
    auto n = request.sampling.n;
    state->request = std::move(request);
    state->remaining = n;
    state->forked = n == 1;
    for (int32_t i = 0; i < n; ++i) {
      auto s = std::make_unique<sequence>();
      s->id = next_seq_id++;
      s->req = state.get();
      s->sample_index = i;
      s->rng = rng_stream::make(seed, static_cast<uint64_t>(i));
      if (i == 0)
        s->tokens = state->request.prompt;
      state->samples.push_back(std::move(s));
    }
    waiting.push_back(state->samples[0].get());
    auto id = state->request.id;
    requests.emplace(id, std::move(state));
  }

  // ---- finishing -------------------------------------------------------------

  void finish_sequence(sequence& s, std::string reason) {
    s.finished = true;
    s.finish_reason = std::move(reason);
    if (prefixes && s.num_computed > 0 && !s.mixed_kv)
      prefixes->insert(std::span<const int64_t>(s.tokens.data(), static_cast<size_t>(s.num_computed)),
                       std::span<const int32_t>(s.blocks.data(), s.blocks.size()));
    release_blocks(s);
    --s.req->remaining;
  }

  /// Appends a sampled token and applies the stop rules.
  void append(sequence& s, const sampled_token& t, clock_type::time_point now) {
    auto& req = *s.req;
    if (s.generated() > 0) {
      m.itl_ms_sum += ms_between(s.last_token_at, now);
      ++m.itl_count;
    }
    s.tokens.push_back(t.token);
    s.logprobs.push_back(t.logprob);
    s.versions.push_back(version);
    s.last_token_at = now;
    ++m.generated_tokens;
    if (!req.has_first_token) {
      req.has_first_token = true;
      req.first_token_at = now;
      m.ttft_ms_sum += ms_between(req.arrived, now);
    }
    if (req.version_first < 0)
      req.version_first = version;
    const auto& sp = req.request.sampling;
    bool stop = std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), t.token) !=
                  sp.stop_token_ids.end() ||
                (!sp.ignore_eos && std::find(eos.begin(), eos.end(), t.token) != eos.end());
    if (stop)
      finish_sequence(s, "stop");
    else if (s.generated() >= sp.max_tokens ||
             static_cast<int64_t>(s.tokens.size()) >= max_model_len)
      finish_sequence(s, "length");
  }

  /// Creates samples 1..n-1 of `first`'s request sharing its prompt blocks.
  std::vector<sequence*> fork(sequence& first) {
    auto& req = *first.req;
    std::vector<sequence*> out;
    req.forked = true;
    for (int32_t i = 1; i < req.request.sampling.n; ++i) {
      auto& s = *req.samples[static_cast<size_t>(i)];
      s.tokens = first.tokens;
      s.num_computed = first.num_computed;
      s.mixed_kv = first.mixed_kv;
      s.blocks = first.blocks;
      for (auto b : s.blocks)
        blocks->retain(b);
      out.push_back(&s);
    }
    return out;
  }

  request_output collect(request_state& req) {
    request_output out;
    out.id = req.request.id;
    out.prompt = req.request.prompt;
    auto plen = req.request.prompt.size();
    for (auto& s : req.samples) {
      sample_output so;
      so.tokens.assign(s->tokens.begin() + static_cast<int64_t>(plen), s->tokens.end());
      so.logprobs = s->logprobs;
      so.versions = s->versions;
      so.finish_reason = s->finish_reason;
      out.samples.push_back(std::move(so));
    }
    keep_sequences(req);
    out.weight_version = version;
    out.first_weight_version = req.version_first;
    auto now = clock_type::now();
    out.ttft_ms = ms_between(req.arrived, req.first_token_at);
    out.latency_ms = ms_between(req.arrived, now);
    ++m.finished_requests;
    return out;
  }

  // ---- the step ----------------------------------------------------------------

  // The KV pool after release_kv_cache: allocated again before the next step.
  bool kv_released = false;

  expected<void> ensure_kv() {
    if (!kv_released)
      return caf::unit;
    auto fresh = guarded("allocating the KV pool", [&] {
      return model->make_paged_cache(kv.num_blocks, kv.block_size);
    });
    if (!fresh)
      return fresh.error();
    kv = std::move(*fresh);
    kv_released = false;
    return caf::unit;
  }

  /// What one step computes: the scheduled sequences, how many tokens of
  /// each, and the token budget left.
  struct step_plan {
    std::vector<sequence*> scheduled;
    std::vector<int64_t> counts;
    int64_t budget = 0;
  };

  /// A plan's tokens as one paged batch, and which scheduled sequences
  /// sample from it (those whose last known token it computes).
  struct step_batch {
    models::paged_batch batch;
    std::vector<int64_t> logit_rows;
    std::vector<size_t> sampling_seqs; ///< indices into plan.scheduled
  };

  /// One engine step (NOTE [engine step]): schedule → build the batch → run
  /// it → sample and fork → retire. Answers the requests it finished.
  expected<std::vector<request_output>> step() {
    if (!requests.empty())
      if (auto ok = ensure_kv(); !ok)
        return ok.error();
    auto t0 = clock_type::now();
    step_plan plan;
    plan.budget = config.max_batched_tokens;
    schedule_running(plan);
    admit_waiting(plan);
    std::vector<request_output> done;
    if (!plan.scheduled.empty()) {
      auto built = build_batch(plan);
      auto logits = run_batch(plan, built);
      if (!logits)
        return logits.error();
      if (auto ok = sample_and_fork(plan, built, *logits); !ok)
        return ok.error();
      m.kv_peak_utilization = std::max(m.kv_peak_utilization, blocks->utilization());
      done = retire();
      ++m.steps;
    }
    m.busy_seconds += std::chrono::duration<double>(clock_type::now() - t0).count();
    return done;
  }

  /// (1) Decode slots for running sequences, oldest first; preempts the
  /// newest when the pool is dry.
  void schedule_running(step_plan& plan) {
    auto& [scheduled, counts, budget] = plan;
    for (size_t i = 0; i < running.size() && budget > 0;) {
      auto* s = running[i];
      auto want = std::min<int64_t>(static_cast<int64_t>(s->tokens.size()) - s->num_computed, budget);
      if (reserve(*s, s->num_computed + want)) {
        scheduled.push_back(s);
        counts.push_back(want);
        budget -= want;
        ++i;
        continue;
      }
      if (!preempt_one(s)) {
        // Nothing else to free: `s` waits itself. check_request guarantees
        // one sequence fits the pool, so this only happens transiently.
        running.erase(running.begin() + static_cast<int64_t>(i));
        release_blocks(*s);
        waiting.push_front(s);
        ++m.preemptions;
        continue;
      }
      // The victim may have been scheduled already (it sat before `s`): drop
      // it from this step, and find `s` again (its index may have moved).
      for (size_t j = 0; j < scheduled.size(); ++j)
        if (std::find(running.begin(), running.end(), scheduled[j]) == running.end()) {
          budget += counts[j];
          scheduled.erase(scheduled.begin() + static_cast<int64_t>(j));
          counts.erase(counts.begin() + static_cast<int64_t>(j));
          --j;
        }
      i = static_cast<size_t>(std::find(running.begin(), running.end(), s) - running.begin());
    }
  }

  /// (2) Admits waiting sequences in order (a cached prefix first), while
  /// the budget, the sequence limit and the pool allow.
  void admit_waiting(step_plan& plan) {
    while (!waiting.empty() && plan.budget > 0 &&
           static_cast<int64_t>(running.size()) < config.max_num_seqs) {
      auto* s = waiting.front();
      if (s->blocks.empty() && prefixes && s->num_computed == 0) {
        auto len = static_cast<int64_t>(s->tokens.size());
        auto hit = prefixes->match(std::span<const int64_t>(s->tokens.data(), s->tokens.size()),
                                   len - 1);
        s->blocks = hit.blocks;
        s->num_computed = hit.matched_tokens;
      }
      auto want = std::min<int64_t>(static_cast<int64_t>(s->tokens.size()) - s->num_computed, plan.budget);
      if (!reserve(*s, s->num_computed + want)) {
        release_blocks(*s); // give back what it took; retry next step
        break;
      }
      waiting.pop_front();
      if (s->generated() == 0 && s->sample_index == 0)
        m.prompt_tokens += static_cast<int64_t>(s->tokens.size());
      running.push_back(s);
      plan.scheduled.push_back(s);
      plan.counts.push_back(want);
      plan.budget -= want;
    }
  }

  /// (3a) Every scheduled token as one paged batch: ids, positions, KV
  /// slots, block tables, context lengths and query starts.
  step_batch build_batch(const step_plan& plan) {
    const auto& scheduled = plan.scheduled;
    const auto& counts = plan.counts;
    auto bs = config.block_size;
    int64_t n_tokens = 0;
    size_t max_blocks = 0;
    for (size_t i = 0; i < scheduled.size(); ++i) {
      n_tokens += counts[i];
      max_blocks = std::max(max_blocks, scheduled[i]->blocks.size());
    }
    auto R = static_cast<int64_t>(scheduled.size());
    auto ids = torch::empty({n_tokens}, torch::kLong);
    auto pos = torch::empty({n_tokens}, torch::kLong);
    auto slots = torch::empty({n_tokens}, torch::kLong);
    auto tables = torch::zeros({R, static_cast<int64_t>(max_blocks)}, torch::kInt);
    auto ctx = torch::empty({R}, torch::kLong);
    auto qstart = torch::empty({R + 1}, torch::kLong);
    step_batch out;
    auto* idp = ids.data_ptr<int64_t>();
    auto* pp = pos.data_ptr<int64_t>();
    auto* sp = slots.data_ptr<int64_t>();
    auto* tp = tables.data_ptr<int32_t>();
    auto* cp = ctx.data_ptr<int64_t>();
    auto* qp = qstart.data_ptr<int64_t>();
    int64_t off = 0;
    for (int64_t r = 0; r < R; ++r) {
      auto& s = *scheduled[static_cast<size_t>(r)];
      auto n = counts[static_cast<size_t>(r)];
      qp[r] = off;
      for (int64_t j = 0; j < n; ++j) {
        auto p = s.num_computed + j;
        idp[off + j] = s.tokens[static_cast<size_t>(p)];
        pp[off + j] = p;
        sp[off + j] = int64_t{s.blocks[static_cast<size_t>(p / bs)]} * bs + p % bs;
      }
      for (size_t b = 0; b < s.blocks.size(); ++b)
        tp[r * static_cast<int64_t>(max_blocks) + static_cast<int64_t>(b)] = s.blocks[b];
      cp[r] = s.num_computed + n;
      off += n;
      const bool reaches_end = s.num_computed + n == static_cast<int64_t>(s.tokens.size());
      if (reaches_end) {
        out.logit_rows.push_back(off - 1);
        out.sampling_seqs.push_back(static_cast<size_t>(r));
      }
      if (s.generated() == 0)
        m.prefill_tokens_computed += n;
      else // a decode computes the last token; more is K/V computed again
        m.recomputed_tokens += n - (reaches_end ? 1 : 0);
    }
    qp[R] = off;
    out.batch = models::paged_batch{ids, pos, slots, tables, ctx, qstart};
    return out;
  }

  /// (3b) The forward pass over the batch; answers the float32 logits of
  /// the sampling rows and advances each sequence's computed count.
  expected<torch::Tensor> run_batch(const step_plan& plan, const step_batch& built) {
    auto rows = torch::tensor(built.logit_rows, torch::kLong);
    torch::NoGradGuard ng;
    auto logits = models::run_forward_paged(model, built.batch, kv, rows);
    if (!logits)
      return with_prefix(logits.error(), "engine step");
    if (const auto path = model->last_decode(); path.decode) { // NOTE [decode path report]
      ++(path.fused ? m.fused_decode_steps : m.aten_decode_steps);
      if (!path.fused)
        m.aten_decode_reason = path.why;
    }
    for (size_t i = 0; i < plan.scheduled.size(); ++i)
      plan.scheduled[i]->num_computed += plan.counts[i];
    return logits->to(torch::kFloat32).contiguous();
  }

  /// (4) Samples a token for every sequence that reached its end. A first
  /// sample finishing its prompt caches the prompt's blocks and forks its
  /// siblings, which sample from the same logits row.
  expected<void> sample_and_fork(const step_plan& plan, const step_batch& built,
                                 const torch::Tensor& logits) {
    std::vector<sequence*> samplers;
    std::vector<int64_t> row_of;
    for (size_t k = 0; k < built.sampling_seqs.size(); ++k) {
      auto* s = plan.scheduled[built.sampling_seqs[k]];
      samplers.push_back(s);
      row_of.push_back(static_cast<int64_t>(k));
      if (s->generated() > 0)
        continue;
      if (prefixes)
        prefixes->insert(std::span<const int64_t>(s->tokens.data(), s->tokens.size()),
                         std::span<const int32_t>(s->blocks.data(), s->blocks.size()));
      if (s->sample_index == 0 && !s->req->forked)
        for (auto* sib : fork(*s)) {
          samplers.push_back(sib);
          row_of.push_back(static_cast<int64_t>(k));
          running.push_back(sib);
        }
    }
    std::vector<const sampling_params*> params;
    std::vector<rng_stream*> streams;
    for (auto* s : samplers) {
      params.push_back(&s->req->request.sampling);
      streams.push_back(&s->rng);
    }
    // Rows are copied only when forked siblings repeat one.
    bool identity = static_cast<int64_t>(row_of.size()) == logits.size(0);
    auto picked = sample(identity ? logits : logits.index_select(0, torch::tensor(row_of, torch::kLong)),
                         params, streams);
    if (!picked)
      return picked.error();
    auto now = clock_type::now();
    for (size_t i = 0; i < samplers.size(); ++i)
      append(*samplers[i], (*picked)[i], now);
    return caf::unit;
  }

  /// (5) Drops finished sequences from the running set and answers the
  /// requests whose every sample finished.
  std::vector<request_output> retire() {
    running.erase(std::remove_if(running.begin(), running.end(),
                                 [](sequence* s) { return s->finished; }),
                  running.end());
    std::vector<request_output> done;
    for (auto it = requests.begin(); it != requests.end();) {
      if (it->second->remaining == 0 && it->second->forked) {
        done.push_back(collect(*it->second));
        it = requests.erase(it);
      } else {
        ++it;
      }
    }
    return done;
  }
};

// ---- engine -------------------------------------------------------------------

engine::engine() : impl_(std::make_unique<impl>()) {}
engine::~engine() = default;

std::string sample_ref(const std::string& id, size_t index) {
  return index == 0 ? id : id + "#" + std::to_string(index);
}

std::pair<std::string, size_t> parse_sample_ref(const std::string& ref) {
  auto hash = ref.rfind('#');
  if (hash == std::string::npos || hash + 1 == ref.size() || ref.size() - hash > 10)
    return {ref, 0};
  size_t index = 0;
  for (size_t i = hash + 1; i < ref.size(); ++i) {
    if (ref[i] < '0' || ref[i] > '9')
      return {ref, 0};
    index = index * 10 + static_cast<size_t>(ref[i] - '0');
  }
  return {ref.substr(0, hash), index};
}

expected<std::unique_ptr<engine>> engine::make(models::llama_model model,
                                               const engine_config& config) {
  if (auto ok = validate(config); !ok)
    return ok.error();
  if (model->head() != models::head_kind::lm)
    return make_error(errc::invalid_argument, "engine: the model needs an lm head, it has a " +
                                                std::string{models::to_string(model->head())} + " head");
  std::unique_ptr<engine> e{new engine()};
  auto& d = *e->impl_;
  d.model = model;
  d.model->eval();
  d.model->set_decode_isa(config.decode_isa);
  if (config.batch_invariant)
    if (auto why = models::batch_invariant_unsupported(*model); !why.empty())
      return make_error(errc::unsupported, "engine.batch_invariant: " + why);
  d.model->set_batch_invariant(config.batch_invariant);
  d.model->set_decode_panels(packs_decode_panels(config) ? config.decode_panels : panels_mode::off);
  d.config = config;
  const auto& mc = model->config();
  d.vocab = mc.vocab_size;
  d.eos = mc.eos_token_ids;
  d.max_model_len = config.max_model_len > 0 ? config.max_model_len : mc.max_position_embeddings;
  // A TP rank's pool holds its own kv heads (NOTE [tensor-parallel decode]
  // in models/llama.cpp): its blocks are that much smaller.
  const auto pool_shape = kv_pool_shape(mc, model->tp());
  auto sized = kv_pool_blocks(config, pool_shape,
                              static_cast<int64_t>((*model->parameters().begin()).element_size()));
  if (!sized)
    return sized.error();
  auto num_blocks = *sized;
  auto kv = guarded("allocating the KV pool", [&] {
    return model->make_paged_cache(num_blocks, config.block_size);
  });
  if (!kv)
    return kv.error();
  d.kv = std::move(*kv);
  d.blocks = std::make_unique<block_allocator>(static_cast<int32_t>(num_blocks),
                                               static_cast<int32_t>(config.block_size));
  if (config.enable_prefix_caching)
    d.prefixes = std::make_unique<prefix_cache>(*d.blocks);
  d.m.num_blocks = num_blocks;
  return e;
}

expected<void> engine::add_request(generate_request request) {
  if (auto ok = impl_->resolve_extension(request); !ok)
    return ok;
  if (auto ok = impl_->check_request(request); !ok)
    return ok;
  impl_->enqueue(std::move(request));
  return caf::unit;
}

expected<std::vector<request_output>> engine::step() {
  return impl_->step();
}

bool engine::idle() const {
  return impl_->requests.empty();
}

expected<std::vector<request_output>> engine::run_until_idle() {
  std::vector<request_output> out;
  while (!idle()) {
    auto before = impl_->m.steps;
    auto r = step();
    if (!r)
      return r.error();
    for (auto& o : *r)
      out.push_back(std::move(o));
    if (impl_->m.steps == before && r->empty())
      return make_error(errc::internal, "engine made no progress with requests queued");
  }
  return out;
}

expected<void> engine::add_requests(std::vector<generate_request> requests) {
  std::set<std::string> ids;
  for (auto& r : requests) {
    if (auto ok = impl_->resolve_extension(r); !ok)
      return ok;
    if (auto ok = impl_->check_request(r); !ok)
      return ok;
    if (!ids.insert(r.id).second)
      return make_error(errc::invalid_argument,
                        "request '" + r.id + "': id appears twice in one batch");
  }
  for (auto& r : requests)
    impl_->enqueue(std::move(r));
  return caf::unit;
}

expected<std::vector<request_output>> engine::generate(std::vector<generate_request> requests) {
  std::vector<std::string> order;
  for (const auto& r : requests)
    order.push_back(r.id);
  if (auto ok = add_requests(std::move(requests)); !ok)
    return ok.error();
  auto outs = run_until_idle();
  if (!outs)
    return outs;
  std::map<std::string, request_output> by_id;
  for (auto& o : *outs)
    by_id.emplace(o.id, std::move(o));
  std::vector<request_output> sorted;
  for (const auto& id : order)
    sorted.push_back(std::move(by_id.at(id)));
  return sorted;
}

expected<void> engine::load_weights(int64_t version,
                                    const std::map<std::string, at::Tensor>& hf_tensors) {
  auto& d = *impl_;
  if (version <= d.version)
    return make_error(errc::version_mismatch, "engine: weight version " + std::to_string(version) +
                                                " is not newer than the loaded version " +
                                                std::to_string(d.version));
  if (auto ok = models::assign_hf_weights(d.model, hf_tensors); !ok)
    return with_prefix(ok.error(), "engine: weight version " + std::to_string(version));
  d.version = version;
  // NOTE [in-flight update]: the running sequences' K/V was computed by
  // the weights before; cached prefixes' too, and they are dropped.
  if (d.config.on_update == update_kv::keep) {
    for (auto* s : d.running)
      s->mixed_kv = true;
  } else {
    while (!d.running.empty()) {
      auto* s = d.running.back();
      d.running.pop_back();
      d.release_blocks(*s);
      d.waiting.push_front(s);
    }
  }
  if (d.prefixes)
    d.prefixes->clear();
  return caf::unit;
}

int64_t engine::weight_version() const {
  return impl_->version;
}

engine_metrics engine::metrics() const {
  auto m = impl_->m;
  m.running = static_cast<int64_t>(impl_->running.size());
  m.waiting = static_cast<int64_t>(impl_->waiting.size());
  m.kv_utilization = impl_->blocks->utilization();
  m.prefix_hit_rate = impl_->prefixes ? impl_->prefixes->hit_rate() : 0.0;
  return m;
}

const engine_config& engine::config() const {
  return impl_->config;
}

int64_t engine::free_blocks() const {
  return impl_->blocks->num_free();
}

void engine::reset_kv_peak() { impl_->m.kv_peak_utilization = impl_->blocks->utilization(); }

void engine::clear_prefix_cache() {
  if (impl_->prefixes)
    impl_->prefixes->clear();
}

expected<int64_t> engine::release_kv_cache() {
  auto& d = *impl_;
  if (!d.requests.empty())
    return make_error(errc::invalid_argument,
                      "release_kv_cache: " + std::to_string(d.requests.size()) + " requests are running");
  if (d.kv_released)
    return int64_t{0};
  clear_prefix_cache();
  int64_t bytes = 0;
  for (const auto* side : {&d.kv.k, &d.kv.v})
    for (const auto& t : *side)
      bytes += t.numel() * static_cast<int64_t>(t.element_size());
  d.kv.k.clear();
  d.kv.v.clear();
  bytes += d.model->decode_panels_bytes();
  d.model->drop_decode_panels();
  d.kv_released = true;
  return bytes;
}

bool engine::kv_cache_released() const { return impl_->kv_released; }

bool engine::holds(const std::string& id) const {
  return impl_->requests.count(id) != 0;
}

// ---- snapshot (NOTE [engine snapshot]) --------------------------------------

namespace {

// Bytes of one block's K (or V) in one layer; 0 while the pool is released.
int64_t layer_block_bytes(const models::paged_kv_cache& kv) {
  return kv.k.empty() ? 0
                      : kv.k.front()[0].numel() * static_cast<int64_t>(kv.k.front().element_size());
}

// The bytes of blocks `ids` of every layer's K then V (CPU, contiguous).
std::string kv_bytes(const models::paged_kv_cache& kv, const std::vector<int32_t>& ids) {
  std::string out;
  if (ids.empty())
    return out;
  torch::NoGradGuard ng;
  auto index = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kLong);
  for (const auto* side : {&kv.k, &kv.v})
    for (const auto& layer : *side) {
      auto part = layer.index_select(0, index.to(layer.device())).cpu().contiguous();
      auto n = part.numel() * static_cast<int64_t>(part.element_size());
      out.append(static_cast<const char*>(part.data_ptr()), static_cast<size_t>(n));
    }
  return out;
}

} // namespace

expected<std::string> engine::export_state() const {
  const auto& d = *impl_;
  state_record st;
  st.version = d.version;
  st.block_size = d.config.block_size;
  st.metrics = d.m;
  std::map<int32_t, int32_t> index_of; // engine block → snapshot block
  std::vector<int32_t> ids;
  for (const auto& [id, req] : d.requests) {
    request_record r;
    r.request = req->request;
    r.forked = req->forked;
    r.remaining = req->remaining;
    r.version_first = req->version_first;
    r.has_first_token = req->has_first_token;
    for (const auto& s : req->samples) {
      sequence_record q;
      q.sample_index = s->sample_index;
      q.tokens = s->tokens;
      q.logprobs = s->logprobs;
      q.versions = s->versions;
      q.mixed_kv = s->mixed_kv;
      q.num_computed = s->num_computed;
      for (auto b : s->blocks) {
        auto [it, fresh] = index_of.emplace(b, static_cast<int32_t>(ids.size()));
        if (fresh)
          ids.push_back(b);
        q.blocks.push_back(it->second);
      }
      q.rng0 = s->rng.s0;
      q.rng1 = s->rng.s1;
      q.finished = s->finished;
      q.finish_reason = s->finish_reason;
      r.samples.push_back(std::move(q));
    }
    st.requests.push_back(std::move(r));
  }
  for (const auto* s : d.running)
    st.running.push_back({s->req->request.id, s->sample_index});
  for (const auto* s : d.waiting)
    st.waiting.push_back({s->req->request.id, s->sample_index});
  if (!ids.empty() && d.kv_released)
    return make_error(errc::internal,
                      "engine: export_state: blocks are held while the KV pool is released");
  st.blocks = static_cast<int64_t>(ids.size());
  st.block_bytes = layer_block_bytes(d.kv);
  auto kv = guarded("engine: export_state", [&] { return kv_bytes(d.kv, ids); });
  if (!kv)
    return kv.error();
  st.kv = std::move(*kv);
  return runtime::to_bytes(st, "engine: export_state: the requests");
}

namespace {

// Checks a snapshot against the engine it is imported into.
expected<void> check_state(const state_record& st, int64_t version, int64_t block_size,
                           int64_t block_bytes, size_t layers) {
  auto what = [](const std::string& x) {
    return make_error(errc::invalid_argument, "engine: import_state: " + x);
  };
  if (st.version != version)
    return what("the requests were taken under weight version " + std::to_string(st.version) +
                ", the engine holds version " + std::to_string(version));
  if (st.block_size != block_size || (st.blocks > 0 && st.block_bytes != block_bytes))
    return what("KV blocks of " + std::to_string(st.block_size) + " tokens (" +
                std::to_string(st.block_bytes) + " bytes a layer), the engine's are " +
                std::to_string(block_size) + " tokens (" + std::to_string(block_bytes) + " bytes)");
  if (st.blocks < 0 || static_cast<int64_t>(st.kv.size()) !=
                           st.blocks * st.block_bytes * 2 * static_cast<int64_t>(layers))
    return what("the K/V holds " + std::to_string(st.kv.size()) + " bytes for " +
                std::to_string(st.blocks) + " blocks");
  for (const auto& r : st.requests) {
    if (r.samples.size() != static_cast<size_t>(r.request.sampling.n))
      return what("request '" + r.request.id + "' has " + std::to_string(r.samples.size()) +
                  " samples, its n is " + std::to_string(r.request.sampling.n));
    for (const auto& q : r.samples)
      for (auto b : q.blocks)
        if (b < 0 || b >= st.blocks)
          return what("request '" + r.request.id + "' refers to block " + std::to_string(b) +
                      " of " + std::to_string(st.blocks));
  }
  return {};
}

} // namespace

namespace {

// Writes the snapshot's K/V (every layer's K, then V, of its blocks in
// order) into the pool's blocks `fresh`.
void copy_kv_in(models::paged_kv_cache& kv, const state_record& st,
                const std::vector<int32_t>& fresh) {
  if (fresh.empty())
    return;
  torch::NoGradGuard ng;
  auto index = torch::tensor(std::vector<int64_t>(fresh.begin(), fresh.end()), torch::kLong);
  const char* at = st.kv.data();
  for (auto* side : {&kv.k, &kv.v})
    for (auto& layer : *side) {
      auto shape = layer.sizes().vec();
      shape[0] = st.blocks;
      auto part = torch::from_blob(const_cast<char*>(at), shape,
                                   torch::TensorOptions().dtype(layer.dtype()));
      layer.index_copy_(0, index.to(layer.device()), part.to(layer.device()));
      at += st.blocks * st.block_bytes;
    }
}

// Gives each block as many owners as the snapshot's sequences that hold it
// (allocate gave each one).
void set_owners(block_allocator& blocks, const state_record& st,
                const std::vector<int32_t>& fresh) {
  std::vector<int32_t> owners(fresh.size(), 0);
  for (const auto& r : st.requests)
    for (const auto& q : r.samples)
      for (auto b : q.blocks)
        ++owners[static_cast<size_t>(b)];
  for (size_t b = 0; b < fresh.size(); ++b) {
    if (owners[b] == 0)
      (void)blocks.release(fresh[b]);
    for (int32_t k = 1; k < owners[b]; ++k)
      (void)blocks.retain(fresh[b]);
  }
}

// The request of record `r`, its samples on blocks `fresh`.
std::unique_ptr<request_state> request_of(request_record& r, const std::vector<int32_t>& fresh,
                                          int64_t& next_seq_id) {
  const auto now = clock_type::now();
  auto state = std::make_unique<request_state>();
  state->arrived = now;
  state->first_token_at = now;
  state->has_first_token = r.has_first_token;
  state->version_first = r.version_first;
  state->forked = r.forked;
  state->remaining = r.remaining;
  state->request = std::move(r.request);
  for (auto& q : r.samples) {
    auto s = std::make_unique<sequence>();
    s->id = next_seq_id++;
    s->req = state.get();
    s->sample_index = q.sample_index;
    s->tokens = std::move(q.tokens);
    s->logprobs = std::move(q.logprobs);
    s->versions = std::move(q.versions);
    s->mixed_kv = q.mixed_kv;
    s->num_computed = q.num_computed;
    for (auto b : q.blocks)
      s->blocks.push_back(fresh[static_cast<size_t>(b)]);
    s->rng.s0 = q.rng0;
    s->rng.s1 = q.rng1;
    s->last_token_at = now;
    s->finished = q.finished;
    s->finish_reason = std::move(q.finish_reason);
    state->samples.push_back(std::move(s));
  }
  return state;
}

} // namespace

// NOTE [engine snapshot]: checked, K/V copied into fresh blocks, requests
// rebuilt, queues placed; a failure leaves the engine as it was.
expected<std::vector<std::string>> engine::import_state(const std::string& bytes) {
  auto& d = *impl_;
  state_record st;
  if (auto ok = runtime::from_bytes(bytes, st, "engine: import_state: the snapshot"); !ok)
    return ok.error();
  if (!d.requests.empty())
    return make_error(errc::invalid_argument,
                      "engine: import_state: " + std::to_string(d.requests.size()) +
                          " requests are in the engine already");
  if (auto ok = d.ensure_kv(); !ok)
    return ok.error();
  if (auto ok =
          check_state(st, d.version, d.config.block_size, layer_block_bytes(d.kv), d.kv.k.size());
      !ok)
    return ok.error();
  if (d.prefixes && d.blocks->num_free() < st.blocks)
    d.prefixes->clear();
  auto taken = d.blocks->allocate(static_cast<int32_t>(st.blocks));
  if (!taken)
    return make_error(errc::unavailable, "engine: import_state: the requests hold " +
                                             std::to_string(st.blocks) +
                                             " KV blocks, the pool has " +
                                             std::to_string(d.blocks->num_free()) + " free");
  const auto& fresh = *taken;
  if (auto copied = guarded("engine: import_state", [&] { copy_kv_in(d.kv, st, fresh); });
      !copied) {
    (void)d.blocks->release_all(fresh);
    return copied.error();
  }
  set_owners(*d.blocks, st, fresh);
  std::vector<std::string> ids;
  for (auto& r : st.requests) {
    auto state = request_of(r, fresh, d.next_seq_id);
    ids.push_back(state->request.id);
    d.requests.emplace(state->request.id, std::move(state));
  }
  auto place = [&](const std::vector<slot_record>& from, auto& queue) -> expected<void> {
    for (const auto& slot : from) {
      auto it = d.requests.find(slot.id);
      if (it == d.requests.end() || slot.sample < 0 ||
          static_cast<size_t>(slot.sample) >= it->second->samples.size())
        return make_error(errc::corrupted, "engine: import_state: a queue names sample " +
                                               std::to_string(slot.sample) + " of request '" +
                                               slot.id + "', which the snapshot lacks");
      queue.push_back(it->second->samples[static_cast<size_t>(slot.sample)].get());
    }
    return {};
  };
  auto placed = place(st.running, d.running);
  if (placed)
    placed = place(st.waiting, d.waiting);
  if (!placed) {
    d.running.clear();
    d.waiting.clear();
    for (auto& [id, req] : d.requests)
      for (auto& s : req->samples)
        d.release_blocks(*s);
    d.requests.clear();
    return placed.error();
  }
  const auto pool = d.m.num_blocks;
  d.m = st.metrics;
  d.m.num_blocks = pool;
  return ids;
}

} // namespace troupe::actors::inference
