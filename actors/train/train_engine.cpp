#include "actors/train/train_engine.hpp"

#include "actors/train/micro_batches.hpp"

#include "actors/train/training_strategy.hpp"
#include "kernels/kl.hpp"
#include "kernels/logprobs.hpp"
#include "kernels/losses.hpp"
#include "kernels/masked.hpp"
#include "models/batch_invariant.hpp"
#include "models/llama.hpp"
#include "runtime/gradient_reducer.hpp"
#include "runtime/hooked_backend.hpp"
#include "runtime/safetensors.hpp"
#include "runtime/seeded_random.hpp"
#include "runtime/torch_guard.hpp"

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace troupe::actors::train {

namespace {

// A training-state archive's bytes.
std::string archive_bytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

at::Tensor need(const runtime::tensor_batch& b, const std::string& name) {
  return value_or_throw(b.get(name));
}

// The indices into parameters() of each transformer layer's parameters
// ("layers.<i>.*"), for a strategy that works a layer at a time.
std::vector<std::vector<size_t>> layer_parameters(const models::llama_model& m) {
  std::vector<std::vector<size_t>> layers(m->config().num_hidden_layers);
  size_t index = 0;
  for (const auto& p : m->named_parameters()) {
    const auto& name = p.key();
    if (name.rfind("layers.", 0) == 0) {
      auto layer = std::stoul(name.substr(7, name.find('.', 7) - 7));
      if (layer < layers.size())
        layers[layer].push_back(index);
    }
    ++index;
  }
  return layers;
}

// A metric named *_max is a maximum: combined by max over micro-batches,
// steps and DP ranks (NOTE [first-minibatch contract] in train_engine.hpp).
bool is_max_key(const std::string& k) {
  return k.size() > 4 && k.compare(k.size() - 4, 4, "_max") == 0;
}

// Metrics over optimizer steps: each the mean over the steps that report
// it (the largest for a maximum).
struct metric_sum {
  metric_map sum;
  std::map<std::string, int64_t> n;
  void add(const metric_map& m) {
    for (const auto& [k, v] : m) {
      auto [it, fresh] = sum.emplace(k, v);
      if (!fresh)
        it->second = is_max_key(k) ? std::max(it->second, v) : it->second + v;
      ++n[k];
    }
  }
  metric_map mean() const {
    metric_map out;
    for (const auto& [k, v] : sum)
      out[k] = is_max_key(k) ? v : v / static_cast<double>(n.at(k));
    return out;
  }
};

double item(const at::Tensor& t) { return t.detach().to(at::kDouble).item<double>(); }

// NOTE [first-minibatch contract]: the new log-probs before any step
// against the batch's old ones, over the response tokens.
void add_first_minibatch_metrics(metric_map& m, const at::Tensor& lp, const at::Tensor& old,
                                 const at::Tensor& mask) {
  auto d = (lp - old).to(at::kDouble);
  auto mean = [&](const at::Tensor& x) {
    return item(value_or_throw(kernels::masked_mean(x, mask)));
  };
  m["actor/first_minibatch/logprob_abs_diff_mean"] = mean(d.abs());
  m["actor/first_minibatch/logprob_abs_diff_max"] = item((d.abs() * mask).max());
  m["actor/first_minibatch/ppo_kl"] = mean(-d);
}

// Whether metric `k` is a token mean (weighted by tokens, not loss units).
bool is_token_key(const std::string& k, std::initializer_list<const char*> token_keys) {
  return std::any_of(token_keys.begin(), token_keys.end(), [&](const char* t) { return k == t; });
}

} // namespace

struct train_engine::impl {
  models::llama_model model{nullptr};
  std::optional<optimizer_options> opts;
  /// How the parameters, gradients and AdamW state are held and updated
  /// (NOTE [training strategies]); null for a frozen engine.
  std::unique_ptr<training_strategy> strategy;
  int64_t steps = 0;

  /// The file of the offloaded optimizer state ("" = resident).
  std::string offloaded;

  /// NOTE [peer state]: whether each update first keeps the training state,
  /// and the state before the last update (copies of what save_state
  /// writes, by key).
  bool keep_before_update = false;
  std::optional<std::vector<std::pair<std::string, at::Tensor>>> before_update;

  // Reads an offloaded optimizer state back (and removes its file).
  expected<void> reload_optimizer() {
    if (offloaded.empty())
      return {};
    auto ok = strategy->reload_state(offloaded);
    if (!ok)
      return with_prefix(ok.error(), offloaded);
    std::remove(offloaded.c_str());
    offloaded.clear();
    return {};
  }

  /// A frozen engine's weights, written once by offload_weights ("" = never
  /// written); `weights_out` says they are freed now.
  std::string weights_file;
  bool weights_out = false;
  /// The parameters' shapes, recorded with the file (they are empty while
  /// offloaded).
  std::map<std::string, std::vector<int64_t>> weight_shapes;

  // Reads offloaded frozen weights back into the parameters (the file stays:
  // the weights never change, so the next offload only frees them).
  expected<void> reload_weights() {
    if (!weights_out)
      return {};
    auto ok = guarded("reloading the offloaded weights", [&]() -> expected<void> {
      // Read straight into fresh tensors (pread, no intermediate buffer);
      // every parameter is checked before any is set.
      auto saved = runtime::load_safetensors(weights_file);
      if (!saved)
        return saved.error();
      auto params = model->named_parameters();
      if (saved->size() != params.size())
        return make_error(errc::corrupted, weights_file + ": " + std::to_string(saved->size()) +
                                               " tensors for " + std::to_string(params.size()) +
                                               " parameters");
      for (const auto& p : params) {
        auto it = saved->find(p.key());
        if (it == saved->end() || it->second.sizes() != at::IntArrayRef(weight_shapes.at(p.key())) ||
            it->second.scalar_type() != p.value().scalar_type())
          return make_error(errc::corrupted, weights_file + ": parameter " + p.key() +
                                                 " is missing or has another shape or dtype");
      }
      torch::NoGradGuard no_grad;
      for (auto& p : params)
        p.value().set_(saved->at(p.key()));
      return {};
    });
    if (!ok)
      return with_prefix(ok.error(), "reloading the offloaded weights");
    weights_out = false;
    return {};
  }

  /// Whatever offload freed is back: every entry point that reads the model
  /// or the optimizer calls this first.
  expected<void> make_resident() {
    if (auto ok = reload_weights(); !ok)
      return ok;
    return reload_optimizer();
  }

  expected<void> require_trainable(const char* what) {
    if (!strategy)
      return make_error(errc::invalid_argument,
                        std::string{what} + ": this engine has no optimizer (a frozen model)");
    return make_resident();
  }

  // Logits of the next tokens [B, L-1, V], with gradient when enabled.
  at::Tensor shifted_logits(const runtime::tensor_batch& b) {
    auto logits = run_model(b);
    return logits.narrow(1, 0, logits.size(1) - 1);
  }

  // The model's output for a batch (its head's: on a pipeline's last
  // stage from the previous stage's output, NOTE [pipeline execution]).
  at::Tensor run_model(const runtime::tensor_batch& b) {
    auto [ids, mask] = model_inputs(b);
    if (model->pp().active())
      return model->forward_stage(ids, mask, stage_input);
    return model->forward(ids, mask);
  }

  // Scores of a preference batch's chosen and rejected rows in one forward:
  // [2B] → (r_c, r_r).
  std::pair<at::Tensor, at::Tensor> pair_scores(const runtime::tensor_batch& b) {
    auto s = run_model(b).to(torch::kFloat);
    auto n = b.size();
    return {s.narrow(0, 0, n), s.narrow(0, n, n)};
  }

  // The ids and mask a batch's forward runs on: a preference batch's chosen
  // rows, then its rejected ones (one pass scores both).
  static std::pair<at::Tensor, at::Tensor> model_inputs(const runtime::tensor_batch& b) {
    if (!b.contains("chosen_ids"))
      return {need(b, "input_ids"), need(b, "attention_mask")};
    auto ci = need(b, "chosen_ids"), ri = need(b, "rejected_ids");
    if (ci.size(1) != ri.size(1))
      throw error_exception(make_error(errc::shape_mismatch,
                                       "chosen_ids and rejected_ids must have the same length"));
    return {torch::cat({ci, ri}, 0),
            torch::cat({need(b, "chosen_mask"), need(b, "rejected_mask")}, 0)};
  }

  at::Tensor next_tokens(const runtime::tensor_batch& b) {
    auto ids = need(b, "input_ids");
    return ids.narrow(1, 1, ids.size(1) - 1);
  }

  // log p(next token) [B, L-1] under softmax(logits / τ), and the entropy
  // when asked (always under TP: the same pass), with gradient when
  // enabled. Under TP from this rank's part of the logits (NOTE
  // [vocab-parallel log-probs] in kernels/logprobs.hpp).
  kernels::log_probs_entropy next_token_stats(const runtime::tensor_batch& b,
                                              const kernels::logits_options& lo, bool entropy) {
    auto logits = shifted_logits(b);
    auto tokens = next_tokens(b);
    if (const auto& tp = model->tp(); tp.active())
      return value_or_throw(kernels::vocab_parallel_log_probs_and_entropy(
          logits, tokens, tp.vocab0, model->config().vocab_size, *tp.group, lo));
    if (entropy)
      return value_or_throw(kernels::token_log_probs_and_entropy(logits, tokens, lo));
    return {value_or_throw(kernels::token_log_probs(logits, tokens, lo)), {}};
  }

  // `o` with the model's lines (NOTE [tensor-parallel norm] in
  // strategy_parts.hpp): its TP group and replicated parameters, its PP
  // group and the tied embedding's copy another stage counts.
  strategy_options with_lines(strategy_options o) const {
    auto& l = o.lines;
    l.pp = model->pp().group;
    l.pp_elsewhere.clear();
    if (tied_copy())
      for (const auto& p : model->named_parameters())
        l.pp_elsewhere.push_back(p.key() == tied_name);
    const auto& tp = model->tp();
    l.tp = tp.active() ? tp.group : nullptr;
    l.tp_replicated.clear();
    if (tp.active())
      for (const auto& p : model->named_parameters())
        l.tp_replicated.push_back(models::tp_slice_of(p.key(), model->config(), tp).replicated());
    return o;
  }

  // ---- NOTE [tied embedding under PP] ----------------------------------
  // A tied embedding is the first stage's token embedding and the last
  // stage's LM head: both stages hold a copy (models/llama.cpp), equal
  // after joining (the first sends its copy to the last). Each copy gets
  // the gradient of its own use, so after a step's backward passes the
  // two stages add each other's (a send and a receive each way, the sum
  // taken in the same order: equal bits on both) before the
  // strategy syncs over DP, and both step the same sum with the same
  // AdamW state, so the copies stay equal. The global norm counts it once
  // (the last stage's copy is "elsewhere"); the export takes the first
  // stage's. The gradients must still be whole on each rank when the
  // stages add them: ddp and zero1, not zero2 / zero3 (which reduce during
  // backward).
  static constexpr const char* tied_name = "tok_embeddings.weight";
  static constexpr int tied_tag = 1 << 21;

  // Whether this stage holds a copy of an embedding tied across stages.
  bool tied_across_stages() const {
    const auto& pp = model->pp();
    return pp.active() && model->config().tie_word_embeddings &&
           model->head() == models::head_kind::lm && (pp.first() || pp.last());
  }
  // Whether it is the last stage's copy (the one the first stage counts).
  bool tied_copy() const { return tied_across_stages() && !model->pp().first(); }

  at::Tensor tied_parameter() const {
    for (const auto& p : model->named_parameters())
      if (p.key() == tied_name)
        return p.value();
    throw error_exception(make_error(errc::internal, "the tied embedding is missing"));
  }

  // x on the first and last stage becomes their sum (or, `replace`, the
  // first stage's) on both: point to point, so any dtype (bf16 too) and
  // any number of stages between them.
  void exchange_tied(at::Tensor x, bool replace) const {
    const auto& pp = model->pp();
    auto& g = *pp.group;
    const int peer = pp.first() ? pp.size - 1 : 0;
    auto mine = x.contiguous().clone();
    auto theirs = at::empty_like(mine);
    if (replace) { // the first stage's, to the last
      if (pp.first())
        value_or_throw(g.send(mine, peer, tied_tag));
      else
        value_or_throw(g.recv(theirs, peer, tied_tag));
    } else {
      auto sent = value_or_throw(g.start_send(mine, peer, tied_tag));
      value_or_throw(g.recv(theirs, peer, tied_tag));
      value_or_throw(sent->wait());
    }
    torch::NoGradGuard no_grad;
    if (replace)
      x.copy_(pp.first() ? mine : theirs);
    else if (pp.first()) // the same order of the sum on both stages
      x.copy_(mine + theirs);
    else
      x.copy_(theirs + mine);
  }

  void sum_tied_gradients() const {
    if (!tied_across_stages())
      return;
    auto p = tied_parameter();
    if (!p.grad().defined())
      p.mutable_grad() = at::zeros_like(p);
    exchange_tied(p.grad(), false);
  }

  // Parameter i whole: under TP gathered from every rank's part (each rank
  // of the TP group calls this for the same i at once), else itself.
  at::Tensor whole(size_t i, const at::Tensor& param) const {
    const auto& tp = model->tp();
    if (!tp.active())
      return param.detach();
    return value_or_throw(
        models::tp_gather_weight(param.detach(), names().at(i), model->config(), tp));
  }
  // The parameters' troupe names, in registration order.
  const std::vector<std::string>& names() const {
    if (param_names.empty())
      for (const auto& p : model->named_parameters())
        param_names.push_back(p.key());
    return param_names;
  }
  mutable std::vector<std::string> param_names;

  // fn() with every parameter whole (zero3 gathers them: every rank of the
  // group calls this at once), freed after; what fn wrote into them is kept
  // when `keep` and fn returned.
  template <class Fn>
  auto with_whole_parameters(bool keep, Fn&& fn) {
    if (strategy)
      value_or_throw(strategy->gather_parameters());
    struct release_guard {
      training_strategy* s;
      bool keep;
      ~release_guard() {
        if (s)
          s->release_parameters(keep);
      }
    } release{strategy.get(), false};
    auto out = fn();
    release.keep = keep;
    return out;
  }

  // NOTE [export units]: visit(i) for each parameter i (registration
  // order), its unit whole (zero3 gathers it: every rank of the group calls
  // this at once) and freed after; answers the largest unit's bytes when
  // the strategy gathers (the export's spike beyond its copy), else 0.
  template <class Fn>
  int64_t by_export_units(Fn&& visit) {
    auto params = model->parameters();
    if (!strategy) {
      for (size_t i = 0; i < params.size(); ++i)
        visit(i);
      return 0;
    }
    const bool gathers = strategy->layer_hooks() != nullptr;
    const auto units = strategy->export_units();
    int64_t largest = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      value_or_throw(strategy->gather_unit(u));
      struct release_guard {
        training_strategy* s;
        size_t u;
        ~release_guard() { s->release_unit(u); }
      } release{strategy.get(), u};
      int64_t bytes = 0;
      for (auto i : units[u]) {
        visit(i);
        bytes += params[i].numel() * static_cast<int64_t>(params[i].element_size());
      }
      if (gathers)
        largest = std::max(largest, bytes);
    }
    return largest;
  }
  /// The last export's spike: a zero3 unit whole (by_export_units) and the
  /// largest thing it made — a TP gather's working set, a later stage's
  /// tensor (export_weights_to).
  int64_t export_spike = 0;
  /// Each parameter's shape, recorded whole (a zero3 rank frees them at rest).
  std::vector<std::vector<int64_t>> shapes;

  // The parameters' indices in the order by_export_units visits them.
  std::vector<size_t> export_order() const {
    std::vector<size_t> out;
    if (!strategy) {
      for (size_t i = 0; i < shapes.size(); ++i)
        out.push_back(i);
      return out;
    }
    for (const auto& unit : strategy->export_units())
      out.insert(out.end(), unit.begin(), unit.end());
    return out;
  }

  // Learning rate of the next step (linear warm-up).
  double next_lr() const {
    double lr = opts->lr;
    if (opts->warmup_steps > 0)
      lr *= std::min(1.0, static_cast<double>(steps + 1) / static_cast<double>(opts->warmup_steps));
    return lr;
  }

  struct step_result;
  // The group's value of per-rank metrics: each weighted by the rank's
  // share — of tokens for the token means in `token_keys` (clip fractions,
  // ppo_kl), of loss units otherwise. Shares sum to 1, so values equal on
  // every rank (grad_norm, lr) pass unchanged.
  metric_map group_metrics(metric_map m, const step_result& r,
                           std::initializer_list<const char*> token_keys = {});

  struct step_result {
    double grad_norm = 0;
    double lr = 0;
    /// This rank's share of the minibatch's loss units and of its tokens
    /// (1 without DP).
    double share = 1;
    double token_share = 1;
  };

  /// Rows a micro-batch computes at once; 0 = the whole (NOTE [micro-batches]).
  int64_t micro_rows = 0;
  /// Or its padded tokens at most (NOTE [token micro-batches]); 0 = off.
  int64_t micro_tokens = 0;
  /// NOTE [true on-policy]: log-prob values from the batch-invariant forward.
  bool batch_invariant = false;

  // The batch-invariant log-probs [B, L-1] of a batch's response tokens
  // (every next token without a response_mask); 0 elsewhere.
  at::Tensor invariant_log_probs(const runtime::tensor_batch& b, double temperature) {
    auto [ids, mask] = model_inputs(b);
    auto want = b.contains("response_mask") ? need(b, "response_mask") : at::Tensor{};
    return value_or_throw(models::batch_invariant_log_probs(*model, ids, mask, temperature, want));
  }

  struct micro_split {
    std::vector<runtime::tensor_batch> parts;
    std::vector<int64_t> rows;    // the batch's rows in the parts' order (empty: in order)
    std::vector<int64_t> lengths; // each part's width (by tokens)
    int64_t width = 0;            // the batch's
  };

  // The micro-batches of a batch: by tokens (NOTE [token micro-batches]),
  // slices of micro_rows rows (the last may be shorter), or the batch.
  micro_split micro_batches(const runtime::tensor_batch& b) const {
    micro_split out;
    if (micro_tokens > 0 && b.size() > 1) {
      out.width = value_or_throw(batch_width(b));
      const auto lengths = value_or_throw(row_lengths(b));
      const int64_t sequences = b.contains("attention_mask") ? 1 : 2; // a preference pair: two
      for (auto& rows : pack_by_tokens(lengths, micro_tokens / sequences)) {
        // At least 2 columns: the shifted tensors keep one.
        const auto longest =
            std::min(out.width, std::max<int64_t>(lengths[static_cast<size_t>(rows.front())], 2));
        out.parts.push_back(value_or_throw(take_rows(b, rows, longest)));
        out.lengths.push_back(longest);
        out.rows.insert(out.rows.end(), rows.begin(), rows.end());
      }
      return out;
    }
    if (micro_rows <= 0 && model->pp().active()) { // NOTE [pipeline execution]
      const int64_t n = pipe_micro > 0 ? pipe_micro : model->pp().size;
      out.parts = value_or_throw(b.split(std::min(n, b.size())));
      return out;
    }
    if (micro_rows <= 0 || b.size() <= micro_rows) {
      out.parts.push_back(b);
      return out;
    }
    for (int64_t r = 0; r < b.size(); r += micro_rows)
      out.parts.push_back(value_or_throw(b.slice(r, std::min(b.size(), r + micro_rows))));
    return out;
  }

  // A forward pass without gradient, a micro-batch at a time, its outputs
  // concatenated (by tokens: padded back to the batch's width, in its row
  // order). In a pipeline the last stage computes them and every stage
  // answers its result (NOTE [pipeline execution]).
  template <class Fn>
  runtime::tensor_batch by_micro_batches(const runtime::tensor_batch& b, Fn&& fn) {
    auto split = micro_batches(b);
    auto outs = pipelined() ? pipeline_forward(split.parts, fn) : each_part(split.parts, fn);
    if (outs.empty()) // a pipeline stage before the last
      return from_last_stage(runtime::tensor_batch{});
    for (size_t i = 0; i < outs.size() && !split.rows.empty(); ++i)
      outs[i] = value_or_throw(pad_outputs(outs[i], split.lengths[i], split.width));
    auto all = outs.size() == 1 ? std::move(outs.front())
                                : value_or_throw(runtime::tensor_batch::concat(outs));
    if (!split.rows.empty()) {
      std::vector<int64_t> back(split.rows.size()); // row i of the batch is row back[i] of `all`
      for (size_t k = 0; k < split.rows.size(); ++k)
        back[static_cast<size_t>(split.rows[k])] = static_cast<int64_t>(k);
      all = value_or_throw(all.select(torch::tensor(back, torch::kLong)));
    }
    return pipelined() ? from_last_stage(std::move(all)) : all;
  }

  // A strategy that gathers during the passes (zero3) needs as many on
  // every rank, agreed before any: the last again, its answer dropped.
  size_t forward_rounds(size_t parts) {
    return dp && strategy && strategy->layer_hooks() ? most_micro_batches(parts) : parts;
  }

  // fn of each part in turn.
  template <class Fn>
  std::vector<runtime::tensor_batch> each_part(const std::vector<runtime::tensor_batch>& parts,
                                               Fn&& fn) {
    std::vector<runtime::tensor_batch> outs;
    const size_t rounds = forward_rounds(parts.size());
    for (const auto& part : parts)
      outs.push_back(fn(part));
    for (auto i = parts.size(); i < rounds; ++i)
      fn(parts.back());
    return outs;
  }

  // ---- NOTE [pipeline execution] --------------------------------------
  // A stage runs its list of the schedule (runtime/pipeline_schedule.hpp)
  // in order, the receive each action waits for posted one action ahead
  // (receives_ahead). Forward of micro-batch m: receive the previous stage's
  // output [rows, T, hidden] (tag 2m; the first stage embeds the ids), run
  // the stage's layers, and send the result on (started, not waited for:
  // neighbours may be sending to each other at once); the last stage
  // computes the micro-batch's loss — weighted by its share as without PP —
  // from what it received (run_model reads stage_input). Backward of m:
  // the last stage back-propagates its loss, the others the gradient the
  // next stage sent (tag 2m + 1) through their output, and every stage but
  // the first sends its input's gradient back. A stage keeps the inputs and
  // outputs of the micro-batches in flight only. Forward-only passes run
  // the forwards in order; the last stage's result, and an update's
  // metrics, are broadcast to every stage, so that every rank answers the
  // same. Each stage's gradient norm adds into the global one (NOTE
  // [tensor-parallel norm]).
  int64_t pipe_micro = 0;
  at::Tensor stage_input;
  pipeline_pass pipe_log;
  // Times a pass and what in it waits (receives).
  struct pass_clock {
    pipeline_pass& log;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    double waited = 0;
    explicit pass_clock(pipeline_pass& l) : log(l) { log = {}; }
    template <class Fn>
    void wait(Fn&& fn) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    void done() {
      log.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      log.busy_seconds = log.seconds - waited;
    }
  };
  /// Every stage's exported tensors (HF name, dtype, whole shape), in
  /// stage order: exchanged when joining (NOTE [pipeline export]).
  std::vector<std::vector<runtime::tensor_spec>> stage_layouts;

  bool pipelined() const { return model->pp().active(); }

  // NOTE [pipeline export]: the first stage exports the whole model — its
  // own parameters, then each later stage's in stage order, received over
  // its PP line (from the rank of the same TP rank, which gathers them
  // whole over its TP group) one tensor at a time (tag export_tag + index),
  // so the exporter holds one received tensor beyond its own; every TP
  // rank of the first stage can export, as without PP (each line carries
  // the whole model: tp times the bytes a single line would). The layout
  // every stage exports is exchanged once, when joining.
  static constexpr int export_tag = 1 << 22;

  // Whether parameter i is in this stage's export (the last stage's copy
  // of a tied embedding is not: NOTE [tied embedding under PP]).
  bool exported(size_t i) const { return !tied_copy() || names().at(i) != tied_name; }

  // This stage's exported tensors (HF name, dtype, whole shape).
  std::vector<runtime::tensor_spec> own_layout() const {
    auto params = model->parameters();
    std::vector<runtime::tensor_spec> out;
    for (auto i : export_order())
      if (exported(i))
        out.push_back(
            {value_or_throw(models::to_hf_name(names().at(i), model->head())),
             params[i].scalar_type(),
             models::tp_full_shape(names().at(i), shapes.at(i), model->config(), model->tp())});
    return out;
  }

  // Every stage's own_layout, from each stage in turn.
  std::vector<std::vector<runtime::tensor_spec>> exchange_stage_layouts() const {
    const auto& pp = model->pp();
    std::vector<std::vector<runtime::tensor_spec>> out;
    for (int s = 0; s < pp.size; ++s) {
      std::string text;
      if (s == pp.rank)
        for (const auto& t : own_layout()) {
          text += t.name + "\t" + std::to_string(static_cast<int>(t.dtype));
          for (auto d : t.shape)
            text += "\t" + std::to_string(d);
          text += "\n";
        }
      value_or_throw(runtime::broadcast_bytes(*pp.group, text, s));
      std::vector<runtime::tensor_spec> layout;
      std::istringstream lines(text);
      for (std::string line; std::getline(lines, line);) {
        std::istringstream fields(line);
        runtime::tensor_spec t;
        int dtype = 0;
        std::getline(fields, t.name, '\t');
        fields >> dtype;
        t.dtype = static_cast<at::ScalarType>(dtype);
        for (int64_t d; fields >> d;)
          t.shape.push_back(d);
        layout.push_back(std::move(t));
      }
      out.push_back(std::move(layout));
    }
    return out;
  }

  // The later stages' tensors on the first stage (put(k, t) from k on), or
  // this later stage's sent there (by its first TP rank).
  void pipeline_export(const runtime::tensor_sink& put, size_t k) const {
    const auto& pp = model->pp();
    if (pp.first()) {
      for (size_t s = 1; s < stage_layouts.size(); ++s)
        for (size_t j = 0; j < stage_layouts[s].size(); ++j) {
          const auto& spec = stage_layouts[s][j];
          auto t = at::empty(spec.shape, at::TensorOptions().dtype(spec.dtype));
          value_or_throw(pp.group->recv(t, static_cast<int>(s), export_tag + static_cast<int>(j)));
          if (put)
            put(k++, t);
        }
    }
  }

  // Sends started and not yet waited for, with the tensors they read.
  struct sends_in_flight {
    std::vector<std::pair<at::Tensor, std::unique_ptr<runtime::pending_transfer>>> started;
    void start(runtime::process_group& g, at::Tensor t, int dst, int tag) {
      t = t.contiguous();
      auto sent = value_or_throw(g.start_send(t, dst, tag));
      started.emplace_back(std::move(t), std::move(sent));
    }
    void wait_all() {
      for (auto& [t, s] : started)
        value_or_throw(s->wait());
      started.clear();
    }
    ~sends_in_flight() {
      for (auto& [t, s] : started)
        (void)s->wait();
    }
  };

  // The receives a stage's actions wait for, each posted one action ahead
  // so that the transfer overlaps the computing before it: a forward's
  // input from the previous stage (tag 2m), a backward's gradient from the
  // next (tag 2m + 1), both [rows, T, hidden] in the model's dtype.
  class receives_ahead {
  public:
    receives_ahead(impl& d, const std::vector<runtime::pipe_action>& actions,
                   const std::vector<runtime::tensor_batch>& parts, pass_clock& clock)
        : d_(d), actions_(actions), parts_(parts), clock_(clock) {
      if (!actions.empty())
        next_ = post(actions.front());
    }
    // What action k receives (undefined when it receives nothing); posts
    // action k + 1's receive first.
    at::Tensor take(size_t k) {
      auto now = std::move(next_);
      next_ = k + 1 < actions_.size() ? post(actions_[k + 1]) : posted{};
      if (now.pending)
        clock_.wait([&] { value_or_throw(now.pending->wait()); });
      return now.buffer;
    }

  private:
    struct posted {
      at::Tensor buffer;
      std::unique_ptr<runtime::pending_transfer> pending;
    };
    posted post(const runtime::pipe_action& a) {
      const auto& pp = d_.model->pp();
      const bool forward = a.op == runtime::pipe_action::forward;
      if (forward ? pp.first() : pp.last())
        return {};
      auto ids = model_inputs(parts_[static_cast<size_t>(a.micro_batch)]).first;
      posted p;
      p.buffer = at::empty({ids.size(0), ids.size(1), d_.model->config().hidden_size},
                           d_.model->parameters().front().options().requires_grad(false));
      p.pending = value_or_throw(pp.group->start_recv(p.buffer, forward ? pp.rank - 1 : pp.rank + 1,
                                                      2 * a.micro_batch + (forward ? 0 : 1)));
      return p;
    }
    impl& d_;
    const std::vector<runtime::pipe_action>& actions_;
    const std::vector<runtime::tensor_batch>& parts_;
    pass_clock& clock_;
    posted next_;
  };

  // A stage's forward of micro-batch m before the last stage: its output,
  // sent on.
  at::Tensor forward_on(const runtime::tensor_batch& part, int m, const at::Tensor& input,
                        sends_in_flight& sends) {
    auto [ids, mask] = model_inputs(part);
    auto out = model->forward_stage(ids, mask, input);
    sends.start(*model->pp().group, out.detach(), model->pp().rank + 1, 2 * m);
    return out;
  }

  template <class Fn>
  std::vector<runtime::tensor_batch> pipeline_forward(std::vector<runtime::tensor_batch> parts,
                                                      Fn&& fn) {
    const auto& pp = model->pp();
    const auto own = parts.size();
    if (!parts.empty()) { // zero3: as many passes on every rank
      const auto last = parts.back();
      parts.resize(forward_rounds(own), last);
    }
    const int n = static_cast<int>(parts.size());
    std::vector<runtime::tensor_batch> outs;
    sends_in_flight sends;
    pass_clock clock{pipe_log};
    const auto schedule = value_or_throw(runtime::forward_only(pp.size, n));
    const auto& actions = schedule[static_cast<size_t>(pp.rank)];
    receives_ahead received{*this, actions, parts, clock};
    for (size_t k = 0; k < actions.size(); ++k) {
      const auto& a = actions[k];
      const auto& part = parts[static_cast<size_t>(a.micro_batch)];
      auto input = received.take(k);
      if (pp.last()) {
        stage_input = input;
        outs.push_back(fn(part));
        stage_input = at::Tensor();
      } else {
        forward_on(part, a.micro_batch, input, sends);
      }
      pipe_log.actions.push_back(a);
    }
    clock.wait([&] { sends.wait_all(); });
    clock.done();
    if (outs.size() > own)
      outs.resize(own);
    return outs;
  }

  // One optimizer step's passes over `parts` under 1F1B: the last stage's
  // loss of part i is weighted by weights[i] and its metrics land in
  // metrics[i].
  template <class Loss>
  void pipeline_step(const std::vector<runtime::tensor_batch>& parts,
                     const std::vector<double>& weights, Loss&& loss_of,
                     std::vector<metric_map>& metrics, bool in_backward) {
    const auto& pp = model->pp();
    const int n = static_cast<int>(parts.size());
    std::vector<at::Tensor> inputs(parts.size()), outputs(parts.size());
    sends_in_flight sends;
    pass_clock clock{pipe_log};
    const auto schedule = value_or_throw(runtime::one_f_one_b(pp.size, n));
    const auto& actions = schedule[static_cast<size_t>(pp.rank)];
    receives_ahead received{*this, actions, parts, clock};
    for (size_t k = 0; k < actions.size(); ++k) {
      const auto& a = actions[k];
      const auto i = static_cast<size_t>(a.micro_batch);
      auto got = received.take(k);
      if (a.op == runtime::pipe_action::forward) {
        inputs[i] = got.defined() ? got.requires_grad_() : got;
        if (pp.last()) {
          stage_input = inputs[i];
          auto part = loss_of(parts[i]);
          stage_input = at::Tensor();
          outputs[i] = part.loss * weights[i];
          metrics[i] = std::move(part.metrics);
        } else {
          outputs[i] = forward_on(parts[i], a.micro_batch, inputs[i], sends);
        }
      } else {
        if (pp.last())
          outputs[i].backward();
        else
          outputs[i].backward(got);
        if (in_backward)
          value_or_throw(strategy->backward_done());
        if (!pp.first())
          sends.start(*pp.group, inputs[i].grad(), pp.rank - 1, 2 * a.micro_batch + 1);
        inputs[i] = at::Tensor();
        outputs[i] = at::Tensor();
      }
      pipe_log.actions.push_back(a);
    }
    clock.wait([&] { sends.wait_all(); });
    clock.done();
  }

  // The last stage's `b` on every stage of the pipeline.
  runtime::tensor_batch from_last_stage(runtime::tensor_batch b) {
    const auto& pp = model->pp();
    std::vector<char> buf;
    if (pp.last()) {
      caf::binary_serializer sink{nullptr, buf};
      if (auto err = sink(b))
        throw error_exception(make_error(errc::internal, "pipeline: serialising the result"));
    }
    std::string bytes(buf.begin(), buf.end());
    value_or_throw(runtime::broadcast_bytes(*pp.group, bytes, pp.size - 1));
    if (pp.last())
      return b;
    runtime::tensor_batch out;
    caf::binary_deserializer source{nullptr, bytes.data(), bytes.size()};
    if (auto err = source(out))
      throw error_exception(make_error(errc::corrupted, "pipeline: the last stage's result"));
    return out;
  }

  // The last stage's metrics on every stage (as one-element tensors).
  metric_map from_last_stage(metric_map m) {
    if (!pipelined())
      return m;
    runtime::tensor_batch b;
    for (const auto& [k, v] : m)
      value_or_throw(b.set(k, torch::tensor({v}, torch::kDouble)));
    metric_map out;
    const auto agreed = from_last_stage(std::move(b));
    for (const auto& [k, t] : agreed.tensors())
      out[k] = t[0].item<double>();
    return out;
  }

  // NOTE [micro-batches]: an optimizer step over a (rank's share of a)
  // minibatch computes it a micro-batch at a time and accumulates the
  // gradients: micro-batch i's loss — a mean over its own loss units
  // (tokens or rows) — is weighted by its units over the group's units for
  // the whole minibatch (share · units_i / units of the rank), so the summed
  // gradient is the minibatch's whatever the micro-batch size or the DP
  // split; an `additive` loss (NOTE [additive aggregation] in
  // kernels/masked.hpp: a sum over tokens by a constant) is the sum of its
  // parts, each weighted 1, and so are its metrics (over the micro-batches,
  // then over the ranks). Then the strategy syncs, clips and steps once. Each metric is the
  // units-weighted mean over the micro-batches (token-weighted for
  // `token_keys`), then reduced over the group (group_metrics). A strategy
  // that communicates during the passes (zero2, zero3) needs as many passes
  // on every rank: the ranks agree on the most micro-batches first, and one
  // with fewer runs its last again at weight 0 (its metrics not counted).
  struct micro_part {
    at::Tensor loss;
    metric_map metrics;
  };
  template <class Units, class Loss>
  std::pair<step_result, metric_map>
  accumulate(const runtime::tensor_batch& batch, Units&& units_of, Loss&& loss_of,
             std::initializer_list<const char*> token_keys = {}, bool additive = false) {
    auto parts = micro_batches(batch).parts;
    std::vector<std::pair<double, double>> units;
    double rank_units = 0, rank_tokens = 0;
    for (const auto& p : parts) {
      units.push_back(units_of(p));
      rank_units += units.back().first;
      rank_tokens += units.back().second;
    }
    double share = 1, token_share = 1;
    if (dp)
      std::tie(share, token_share) = dp_shares(rank_units, rank_tokens);
    // An additive loss weighs each part 1; its metrics are each rank's sum,
    // scaled by 1 / share so the group's share-weighted reduction sums them.
    const double loss_share = additive ? 1.0 : share;
    const double sum_scale = share > 0 ? 1.0 / share : 0.0;
    // A strategy that reduces (or gathers) during the passes needs as many
    // of them on every rank: one with fewer micro-batches runs its last
    // again at weight 0 for the rest.
    const bool in_backward = strategy->reduces_in_backward();
    const size_t rounds = in_backward && dp ? most_micro_batches(parts.size()) : parts.size();
    strategy->zero_grad();
    metric_map local;
    std::vector<double> weights, token_weights;
    for (size_t i = 0; i < parts.size(); ++i) {
      const double n = static_cast<double>(parts.size());
      weights.push_back(additive ? 1.0 : rank_units > 0 ? units[i].first / rank_units : 1 / n);
      token_weights.push_back(rank_tokens > 0 ? units[i].second / rank_tokens : 1 / n);
    }
    auto add_metrics = [&](size_t i, const metric_map& m) {
      for (const auto& [k, v] : m) {
        if (is_max_key(k)) {
          auto [it, fresh] = local.emplace(k, v);
          it->second = fresh ? v : std::max(it->second, v);
        } else {
          local[k] += v * (is_token_key(k, token_keys) ? token_weights[i]
                           : additive                  ? sum_scale
                                                       : weights[i]);
        }
      }
    };
    if (pipelined()) {
      // The same passes on every rank: the rounds beyond this rank's parts
      // run its last again at weight 0.
      std::vector<double> scaled;
      for (auto w : weights)
        scaled.push_back(loss_share * w);
      while (parts.size() < rounds) {
        parts.push_back(parts.back());
        scaled.push_back(0.0);
      }
      std::vector<metric_map> metrics(parts.size());
      pipeline_step(parts, scaled, loss_of, metrics, in_backward);
      for (size_t i = 0; i < weights.size(); ++i)
        add_metrics(i, metrics[i]);
    } else {
      for (size_t i = 0; i < parts.size(); ++i) {
        auto part = loss_of(parts[i]);
        (part.loss * (loss_share * weights[i])).backward();
        if (in_backward)
          value_or_throw(strategy->backward_done());
        add_metrics(i, part.metrics);
      }
      for (auto i = parts.size(); i < rounds; ++i) {
        (loss_of(parts.back()).loss * 0.0).backward(); // the same passes, nothing learned
        value_or_throw(strategy->backward_done());
      }
    }
    sum_tied_gradients(); // NOTE [tied embedding under PP]
    value_or_throw(strategy->sync_gradients());
    const double norm = value_or_throw(strategy->clip_gradients(opts->grad_clip));
    const double lr = next_lr();
    value_or_throw(strategy->step(lr));
    ++steps;
    return {{norm, lr, share, token_share}, std::move(local)};
  }

  // NOTE [data-parallel training]: a DP rank holds a whole replica. Its
  // loss over its share of a minibatch is weighted by (local units / the
  // group's units) — units being tokens for token-mean, rows for the
  // sequence-mean modes — so the summed gradients are the gradients of the
  // whole minibatch's loss, and every rank clips and steps identically.
  std::shared_ptr<data_parallel_group> dp;

  // The most micro-batches any rank of the group has for this step.
  size_t most_micro_batches(size_t mine) {
    auto t = torch::tensor({static_cast<int64_t>(mine)}, torch::kLong);
    value_or_throw(dp->group.all_reduce(t, runtime::reduce_op::max));
    return static_cast<size_t>(t.item<int64_t>());
  }

  // This rank's shares of the minibatch's loss units and of its tokens.
  std::pair<double, double> dp_shares(double units, double tokens) {
    auto t = torch::tensor({units, tokens}, torch::kDouble);
    value_or_throw(dp->group.all_reduce_sum(t));
    auto u = t[0].item<double>(), n = t[1].item<double>();
    return {u > 0 ? units / u : 0.0, n > 0 ? tokens / n : 0.0};
  }

  std::vector<runtime::tensor_batch> minibatches(const runtime::tensor_batch& batch, int64_t epochs,
                                                 int64_t parts, uint64_t seed, bool shuffle) {
    return value_or_throw(make_minibatches(batch, epochs, parts, seed, shuffle));
  }
};

metric_map train_engine::impl::group_metrics(metric_map m, const step_result& r,
                                             std::initializer_list<const char*> token_keys) {
  if (!dp || m.empty()) // empty: a pipeline stage before the last (every DP rank of it)
    return m;
  // Every rank reports the same keys: the sums in one all-reduce, the
  // maxima in another.
  std::vector<double> sums, maxima;
  for (const auto& [k, x] : m) {
    if (is_max_key(k))
      maxima.push_back(x);
    else
      sums.push_back(x * (is_token_key(k, token_keys) ? r.token_share : r.share));
  }
  auto s = torch::tensor(sums, torch::kDouble);
  value_or_throw(dp->group.all_reduce_sum(s));
  auto x = torch::tensor(maxima, torch::kDouble);
  if (!maxima.empty())
    value_or_throw(dp->group.all_reduce(x, runtime::reduce_op::max));
  int64_t i = 0, j = 0;
  for (auto& [k, v] : m)
    v = is_max_key(k) ? x[j++].item<double>() : s[i++].item<double>();
  return m;
}

expected<std::vector<runtime::tensor_batch>> make_minibatches(const runtime::tensor_batch& batch,
                                                              int64_t epochs, int64_t parts,
                                                              uint64_t seed, bool shuffle) {
  if (parts < 1 || parts > batch.size())
    return make_error(errc::invalid_argument, "minibatches " + std::to_string(parts) +
                                                  " for a batch of " + std::to_string(batch.size()));
  if (epochs < 1)
    return make_error(errc::invalid_argument, "epochs must be >= 1, got " + std::to_string(epochs));
  return guarded("minibatches", [&]() -> expected<std::vector<runtime::tensor_batch>> {
    std::vector<runtime::tensor_batch> out;
    for (int64_t e = 0; e < epochs; ++e) {
      auto shuffled = batch;
      if (shuffle) {
        auto perm = runtime::seeded_permutation(batch.size(), seed + static_cast<uint64_t>(e) * 0x51ED27ULL);
        auto s = batch.select(torch::tensor(perm, torch::kLong));
        if (!s)
          return s.error();
        shuffled = std::move(*s);
      }
      auto mbs = shuffled.split(parts);
      if (!mbs)
        return mbs.error();
      for (auto& mb : *mbs)
        out.push_back(std::move(mb));
    }
    return out;
  });
}

namespace {

// Loss units of a minibatch under `agg`: valid tokens (token-mean) or rows
// with a valid token (the sequence-mean modes).
double tokens_of(const at::Tensor& mask) { return mask.to(torch::kDouble).sum().item<double>(); }

double loss_units(const at::Tensor& mask, kernels::loss_agg_mode agg) {
  if (agg == kernels::loss_agg_mode::token_mean)
    return tokens_of(mask);
  return (mask.to(torch::kDouble).sum(1) > 0).to(torch::kDouble).sum().item<double>();
}

// seq-mean-token-sum-norm's divisor for a whole update of `batch`: the
// given factor, or (0) the batch's response columns — fixed before the batch
// is cut into minibatches, micro-batches or DP shares (NOTE [additive
// aggregation]), which may trim columns.
double update_scale_factor(kernels::loss_agg_mode agg, double factor,
                           const runtime::tensor_batch& batch) {
  if (agg != kernels::loss_agg_mode::seq_mean_token_sum_norm || factor != 0)
    return factor;
  return static_cast<double>(need(batch, "response_mask").size(1));
}

// A preference batch's loss units: its pairs (counted for both).
std::pair<double, double> pair_units(const runtime::tensor_batch& b) {
  auto n = static_cast<double>(b.size());
  return {n, n};
}

// A batch's (loss units under `agg`, valid response tokens).
auto units_with(kernels::loss_agg_mode agg) {
  return [agg](const runtime::tensor_batch& b) {
    auto mask = need(b, "response_mask");
    return std::pair{loss_units(mask, agg), tokens_of(mask)};
  };
}

} // namespace

train_engine::train_engine() : impl_(std::make_unique<impl>()) {}
train_engine::~train_engine() {
  if (impl_->model)
    impl_->model->set_layer_hooks(nullptr);
  if (!impl_->offloaded.empty()) {
    std::remove(impl_->offloaded.c_str());
    std::remove((impl_->offloaded + ".params").c_str()); // zero3's parameter shards
  }
  if (!impl_->weights_file.empty())
    std::remove(impl_->weights_file.c_str());
}

expected<std::unique_ptr<train_engine>> train_engine::make(models::llama_model model,
                                                           std::optional<optimizer_options> optim) {
  if (optim) {
    if (!(optim->lr > 0) || optim->eps <= 0 || optim->grad_clip < 0 || optim->weight_decay < 0)
      return make_error(errc::invalid_argument,
                        "train_engine: optimizer needs lr > 0, eps > 0, grad_clip >= 0, "
                        "weight_decay >= 0");
  }
  return guarded("train_engine::make", [&]() -> expected<std::unique_ptr<train_engine>> {
    std::unique_ptr<train_engine> e{new train_engine()};
    e->impl_->model = std::move(model);
    for (const auto& p : e->impl_->model->parameters())
      e->impl_->shapes.push_back(p.sizes().vec());
    e->impl_->opts = optim;
    if (optim) {
      e->impl_->model->train();
      e->impl_->strategy = value_or_throw(training_strategy::make(
          e->impl_->model->parameters(), *optim, nullptr, e->impl_->with_lines({})));
    } else {
      e->impl_->model->eval();
      for (auto& p : e->impl_->model->parameters())
        p.set_requires_grad(false);
    }
    return e;
  });
}

bool train_engine::trainable() const {
  return impl_->strategy != nullptr;
}

expected<void> train_engine::join_data_parallel(std::shared_ptr<data_parallel_group> group,
                                                const strategy_options& options) {
  auto& d = *impl_;
  if (!group)
    return make_error(errc::invalid_argument, "join_data_parallel: no group");
  if (d.dp)
    return make_error(errc::invalid_argument, "join_data_parallel: already in a group");
  if (!(options.bucket_mb > 0))
    return make_error(errc::invalid_argument, "join_data_parallel: bucket_mb must be > 0");
  if (!d.strategy && options.kind != dp_strategy::ddp)
    return make_error(errc::invalid_argument,
                      "join_data_parallel: " + std::string{to_string(options.kind)} +
                          " shards training state, and this engine has "
                          "no optimizer (a frozen model)");
  if (d.steps > 0 || !d.offloaded.empty())
    return make_error(errc::invalid_argument,
                      "join_data_parallel: join before the first optimizer step");
  if (d.model->pp().active() && d.model->pp().group != group->pp.get())
    return make_error(errc::invalid_argument,
                      "join_data_parallel: the model's pipeline stage is not of the group's PP "
                      "line (make it with stage_of over group->pp)");
  if (d.tied_across_stages() &&
      (options.kind == dp_strategy::zero2 || options.kind == dp_strategy::zero3))
    return make_error(errc::unsupported,
                      "join_data_parallel: a tied embedding under pipeline parallelism takes ddp "
                      "or zero1 (" +
                          std::string{to_string(options.kind)} +
                          " reduces the gradients during backward, before the first and the last "
                          "stage can add their copies' gradients)");
  return guarded("join_data_parallel", [&]() -> expected<void> {
    if (d.tied_across_stages()) // NOTE [tied embedding under PP]: equal copies
      d.exchange_tied(d.tied_parameter(), true);
    auto params = d.model->parameters();
    if (auto ok = runtime::broadcast_parameters(params, group->group, 0); !ok)
      return with_prefix(ok.error(), "broadcasting the parameters from rank 0");
    if (d.strategy) {
      auto s = training_strategy::make(params, *d.opts, &group->group, d.with_lines(options),
                                       layer_parameters(d.model));
      if (!s)
        return s.error();
      d.model->set_layer_hooks(nullptr);
      d.strategy = std::move(*s);
      d.model->set_layer_hooks(d.strategy->layer_hooks());
    }
    if (d.pipelined())
      d.stage_layouts = d.exchange_stage_layouts();
    d.dp = std::move(group);
    return {};
  });
}

expected<int64_t> train_engine::offload_optimizer(const std::string& path) {
  auto& d = *impl_;
  if (!d.strategy || !d.offloaded.empty())
    return int64_t{0};
  return guarded("offload_optimizer", [&]() -> expected<int64_t> {
    // zero3 (parameters sharded at rest: it has layer hooks) offloads its
    // parameter shards too, before its first step as well.
    const bool state = d.strategy->optimizer_bytes() > 0 || d.strategy->layer_hooks() != nullptr;
    auto bytes = value_or_throw(d.strategy->release(path));
    if (state)
      d.offloaded = path;
    return bytes;
  });
}

bool train_engine::optimizer_offloaded() const { return !impl_->offloaded.empty(); }

expected<int64_t> train_engine::offload_weights(const std::string& path) {
  auto& d = *impl_;
  if (d.strategy || d.weights_out)
    return int64_t{0};
  if (!d.weights_file.empty() && d.weights_file != path)
    return make_error(errc::invalid_argument, "offload_weights: the weights were offloaded to " +
                                                  d.weights_file + " before, not " + path);
  return guarded("offload_weights", [&]() -> expected<int64_t> {
    auto named = d.model->named_parameters();
    if (d.weights_file.empty()) {
      // Written once (temp, fsync, rename: never a partial file).
      runtime::tensor_map tensors;
      for (const auto& p : named)
        tensors.emplace(p.key(), p.value().detach());
      if (auto ok = runtime::save_safetensors(path, tensors); !ok)
        return ok.error();
      d.weights_file = path;
      for (const auto& p : named)
        d.weight_shapes[p.key()] = p.value().sizes().vec();
    }
    int64_t bytes = 0;
    torch::NoGradGuard no_grad;
    for (auto& p : d.model->parameters()) {
      bytes += p.numel() * static_cast<int64_t>(p.element_size());
      p.set_(at::empty({0}, p.options()));
    }
    d.weights_out = true;
    return bytes;
  });
}

bool train_engine::weights_offloaded() const { return impl_->weights_out; }

int train_engine::data_parallel_size() const { return impl_->dp ? impl_->dp->group.size() : 1; }
dp_strategy train_engine::strategy() const {
  return impl_->strategy ? impl_->strategy->kind() : dp_strategy::ddp;
}
expected<void> train_engine::set_micro_batch_rows(int64_t rows) {
  if (rows < 0)
    return make_error(errc::invalid_argument,
                      "micro_batch_rows must be >= 0 (0 = the whole batch), got " +
                          std::to_string(rows));
  impl_->micro_rows = rows;
  return {};
}
expected<void> train_engine::set_precision(precision p) {
  auto& d = *impl_;
  if (p == compute_precision())
    return {};
  if (p == precision::fp32)
    return make_error(
        errc::invalid_argument,
        "set_precision: the weights are bf16 already (the rounding cannot be undone)");
  if (d.dp || d.steps > 0 || !d.offloaded.empty() || d.weights_out)
    return make_error(errc::invalid_argument,
                      "set_precision: set it before join_data_parallel, the first step and "
                      "any offload");
  return guarded("set_precision", [&] {
    torch::NoGradGuard no_grad;
    d.model->set_layer_hooks(nullptr);
    d.strategy.reset(); // its flat buffers hold the fp32 weights
    for (auto& param : d.model->parameters())
      param.set_data(param.to(at::kBFloat16));
    d.model->drop_decode_panels();
    if (d.opts)
      d.strategy = value_or_throw(
          training_strategy::make(d.model->parameters(), *d.opts, nullptr, d.with_lines({})));
  });
}

precision train_engine::compute_precision() const {
  const auto params = impl_->model->parameters();
  return !params.empty() && params.front().scalar_type() == at::kBFloat16 ? precision::bf16
                                                                          : precision::fp32;
}

expected<void> train_engine::set_micro_batch_tokens(int64_t tokens) {
  if (tokens < 0)
    return make_error(errc::invalid_argument,
                      "micro_batch_tokens must be >= 0 (0 = off), got " + std::to_string(tokens));
  impl_->micro_tokens = tokens;
  return {};
}
expected<void> train_engine::set_batch_invariant(bool on) {
  if (on)
    if (auto why = models::batch_invariant_unsupported(*impl_->model); !why.empty())
      return make_error(errc::unsupported, "batch_invariant: " + why);
  impl_->batch_invariant = on;
  return {};
}

expected<void> train_engine::set_pipeline_micro_batches(int64_t n) {
  if (n < 0)
    return make_error(errc::invalid_argument,
                      "pp_micro_batches must be >= 0 (0 = as many as stages), got " +
                          std::to_string(n));
  impl_->pipe_micro = n;
  return {};
}

train_engine::pipeline_pass train_engine::last_pipeline_pass() const {
  return impl_->pipe_log;
}

int64_t train_engine::optimizer_state_bytes() const {
  return impl_->strategy && impl_->offloaded.empty() ? impl_->strategy->optimizer_bytes() : 0;
}
int64_t train_engine::steps() const { return impl_->steps; }
const models::llama_model& train_engine::model() const { return impl_->model; }

expected<runtime::tensor_batch> train_engine::log_probs(const runtime::tensor_batch& batch,
                                                        double temperature, bool with_entropy) {
  if (impl_->model->head() != models::head_kind::lm)
    return make_error(errc::invalid_argument, "log_probs: the model has no lm head");
  // It arrives as a bare double (NOTE [wire floats] in runtime/wire_float.hpp).
  if (!(std::isfinite(temperature) && temperature > 0))
    return make_error(errc::invalid_argument,
                      "log_probs: temperature must be finite and > 0, got " +
                          std::to_string(temperature));
  if (auto ok = impl_->make_resident(); !ok)
    return ok.error();
  return guarded("log_probs", [&]() -> expected<runtime::tensor_batch> {
    torch::NoGradGuard no_grad;
    kernels::logits_options lo;
    lo.temperature = temperature;
    return impl_->by_micro_batches(batch, [&](const runtime::tensor_batch& mb) {
      runtime::tensor_batch out;
      if (impl_->batch_invariant) { // NOTE [true on-policy]
        if (with_entropy)
          value_or_throw(out.set("entropy", impl_->next_token_stats(mb, lo, true).entropy));
        value_or_throw(out.set("log_probs", impl_->invariant_log_probs(mb, temperature)));
        return out;
      }
      auto r = impl_->next_token_stats(mb, lo, with_entropy);
      if (with_entropy)
        value_or_throw(out.set("entropy", r.entropy));
      value_or_throw(out.set("log_probs", r.log_probs));
      return out;
    });
  });
}

expected<runtime::tensor_batch> train_engine::values(const runtime::tensor_batch& batch) {
  if (impl_->model->head() != models::head_kind::value)
    return make_error(errc::invalid_argument, "values: the model has no value head");
  if (auto ok = impl_->make_resident(); !ok)
    return ok.error();
  return guarded("values", [&]() -> expected<runtime::tensor_batch> {
    torch::NoGradGuard no_grad;
    return impl_->by_micro_batches(batch, [&](const runtime::tensor_batch& mb) {
      auto v = impl_->run_model(mb);
      runtime::tensor_batch out;
      value_or_throw(out.set("values", v.narrow(1, 0, v.size(1) - 1).contiguous()));
      return out;
    });
  });
}

expected<runtime::tensor_batch> train_engine::scores(const runtime::tensor_batch& batch) {
  if (impl_->model->head() != models::head_kind::reward)
    return make_error(errc::invalid_argument, "scores: the model has no reward head");
  if (auto ok = impl_->make_resident(); !ok)
    return ok.error();
  return guarded("scores", [&]() -> expected<runtime::tensor_batch> {
    torch::NoGradGuard no_grad;
    return impl_->by_micro_batches(batch, [&](const runtime::tensor_batch& mb) {
      auto s = impl_->run_model(mb);
      runtime::tensor_batch out;
      value_or_throw(out.set("scores", s.to(torch::kFloat)));
      return out;
    });
  });
}

expected<metric_map> train_engine::update_policy(const runtime::tensor_batch& batch,
                                                 const policy_update_options& o) {
  if (auto ok = impl_->require_trainable("update_policy"); !ok)
    return ok.error();
  if (o.lr < 0)
    return make_error(errc::invalid_argument, "update_policy: lr must be >= 0 (0 = keep)");
  if (o.lr > 0)
    impl_->opts->lr = o.lr;
  if (auto ok = keep_state_before_update(); !ok)
    return with_prefix(ok.error(), "update_policy");
  return guarded("update_policy", [&]() -> expected<metric_map> {
    metric_sum sums;
    auto spec = o.loss;
    spec.options.loss_scale_factor =
        update_scale_factor(spec.options.agg, spec.options.loss_scale_factor, batch);
    const auto agg = kernels::effective_agg(spec);
    kernels::logits_options lo;
    lo.temperature = o.temperature;
    bool first = true; // the first minibatch: NOTE [first-minibatch contract]
    auto loss_of = [&](const runtime::tensor_batch& mb) {
      auto lpe = impl_->next_token_stats(mb, lo, true);
      if (impl_->batch_invariant) // NOTE [true on-policy]: the value exactly, ATen's gradient
        lpe.log_probs =
            lpe.log_probs - lpe.log_probs.detach() + impl_->invariant_log_probs(mb, o.temperature);
      kernels::actor_loss_inputs in{lpe.log_probs,
                                    need(mb, "old_log_probs"),
                                    need(mb, "advantages"),
                                    need(mb, "response_mask"),
                                    lpe.entropy,
                                    {}};
      if (spec.kl_coef > 0)
        in.ref_log_probs = need(mb, "ref_log_probs");
      auto al = value_or_throw(kernels::actor_loss(in, spec));
      impl::micro_part part{al.loss, {}};
      auto& m = part.metrics;
      if (al.kl_loss.defined())
        m["actor/kl_loss"] = item(al.kl_loss);
      m["actor/pg_loss"] = item(al.pg.loss);
      m["actor/pg_clipfrac"] = item(al.pg.pg_clipfrac);
      m["actor/pg_clipfrac_lower"] = item(al.pg.pg_clipfrac_lower);
      m["actor/ppo_kl"] = item(al.pg.ppo_kl);
      m["actor/entropy"] = item(al.entropy);
      if (first)
        add_first_minibatch_metrics(m, lpe.log_probs.detach(), in.old_log_probs, in.mask);
      return part;
    };
    const auto token_keys = {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl",
                             "actor/first_minibatch/logprob_abs_diff_mean",
                             "actor/first_minibatch/ppo_kl"};
    for (auto& mb : impl_->minibatches(batch, o.epochs, o.minibatches, o.shuffle_seed, o.shuffle)) {
      auto [r, m] =
          impl_->accumulate(mb, units_with(agg), loss_of, token_keys, kernels::additive(agg));
      first = false;
      m["actor/grad_norm"] = r.grad_norm;
      m["actor/lr"] = r.lr;
      sums.add(impl_->group_metrics(std::move(m), r, token_keys));
    }
    return impl_->from_last_stage(sums.mean());
  });
}

expected<metric_map> train_engine::update_critic(const runtime::tensor_batch& batch,
                                                 const critic_update_options& o) {
  if (auto ok = impl_->require_trainable("update_critic"); !ok)
    return ok.error();
  if (impl_->model->head() != models::head_kind::value)
    return make_error(errc::invalid_argument, "update_critic: the model has no value head");
  if (auto ok = keep_state_before_update(); !ok)
    return with_prefix(ok.error(), "update_critic");
  return guarded("update_critic", [&]() -> expected<metric_map> {
    metric_sum sums;
    kernels::value_loss_options vo;
    vo.agg = o.loss_agg;
    vo.loss_scale_factor = update_scale_factor(o.loss_agg, o.loss_scale_factor, batch);
    if (o.value_clip > 0)
      vo.clip = o.value_clip;
    else
      vo.clip = std::nullopt;
    auto loss_of = [&](const runtime::tensor_batch& mb) {
      auto v = impl_->run_model(mb);
      v = v.narrow(1, 0, v.size(1) - 1);
      auto vl = value_or_throw(kernels::value_loss(v, need(mb, "values"), need(mb, "returns"),
                                                   need(mb, "response_mask"), vo));
      return impl::micro_part{
          vl.loss,
          {{"critic/vf_loss", item(vl.loss)}, {"critic/vf_clipfrac", item(vl.vf_clipfrac)}}};
    };
    const auto token_keys = {"critic/vf_clipfrac"};
    for (auto& mb : impl_->minibatches(batch, o.epochs, o.minibatches, o.shuffle_seed, o.shuffle)) {
      auto [r, m] = impl_->accumulate(mb, units_with(o.loss_agg), loss_of, token_keys,
                                      kernels::additive(o.loss_agg));
      m["critic/grad_norm"] = r.grad_norm;
      m["critic/lr"] = r.lr;
      sums.add(impl_->group_metrics(std::move(m), r, token_keys));
    }
    return impl_->from_last_stage(sums.mean());
  });
}

expected<metric_map> train_engine::sft_step(const runtime::tensor_batch& batch) {
  if (auto ok = impl_->require_trainable("sft_step"); !ok)
    return ok.error();
  return guarded("sft_step", [&]() -> expected<metric_map> {
    auto loss_of = [&](const runtime::tensor_batch& mb) {
      auto lp = impl_->next_token_stats(mb, {}, false).log_probs;
      auto loss = -value_or_throw(kernels::masked_mean(lp, need(mb, "response_mask")));
      return impl::micro_part{loss, {{"sft/loss", item(loss)}}};
    };
    auto [r, m] = impl_->accumulate(batch, units_with(kernels::loss_agg_mode::token_mean), loss_of);
    m["sft/grad_norm"] = r.grad_norm;
    m["sft/lr"] = r.lr;
    return impl_->from_last_stage(impl_->group_metrics(std::move(m), r));
  });
}

expected<metric_map> train_engine::rm_step(const runtime::tensor_batch& batch) {
  if (auto ok = impl_->require_trainable("rm_step"); !ok)
    return ok.error();
  if (impl_->model->head() != models::head_kind::reward)
    return make_error(errc::invalid_argument, "rm_step: the model has no reward head");
  return guarded("rm_step", [&]() -> expected<metric_map> {
    auto loss_of = [&](const runtime::tensor_batch& mb) {
      auto [rc, rr] = impl_->pair_scores(mb);
      auto margin = rc - rr;
      auto loss = -torch::log_sigmoid(margin).mean();
      return impl::micro_part{loss,
                              {{"rm/loss", item(loss)},
                               {"rm/accuracy", item((margin > 0).to(torch::kFloat).mean())},
                               {"rm/margin", item(margin.mean())}}};
    };
    auto [r, m] = impl_->accumulate(batch, pair_units, loss_of);
    m["rm/grad_norm"] = r.grad_norm;
    m["rm/lr"] = r.lr;
    return impl_->from_last_stage(impl_->group_metrics(std::move(m), r));
  });
}

namespace {

// A preference batch's chosen rows, then its rejected ones, as one sequence
// batch (NOTE [sequence batches]).
runtime::tensor_batch pair_sequences(const runtime::tensor_batch& b) {
  runtime::tensor_batch out;
  auto both = [&](const char* name, const std::string& chosen, const std::string& rejected) {
    value_or_throw(out.set(name, torch::cat({need(b, chosen), need(b, rejected)}, 0)));
  };
  both("input_ids", "chosen_ids", "rejected_ids");
  both("attention_mask", "chosen_mask", "rejected_mask");
  both("response_mask", "chosen_response_mask", "rejected_response_mask");
  return out;
}

} // namespace

expected<metric_map> train_engine::dpo_step(const runtime::tensor_batch& batch,
                                            const dpo_step_options& o) {
  if (auto ok = impl_->require_trainable("dpo_step"); !ok)
    return ok.error();
  if (impl_->model->head() != models::head_kind::lm)
    return make_error(errc::invalid_argument, "dpo_step: the model has no lm head");
  return guarded("dpo_step", [&]() -> expected<metric_map> {
    const bool average = kernels::length_averaged(o.loss.loss);
    auto loss_of = [&](const runtime::tensor_batch& mb) {
      auto seq = pair_sequences(mb);
      auto lp = impl_->next_token_stats(seq, {}, false).log_probs;
      auto logps =
          value_or_throw(kernels::sequence_log_probs(lp, need(seq, "response_mask"), average));
      const auto n = mb.size();
      auto chosen = logps.narrow(0, 0, n), rejected = logps.narrow(0, n, n);
      auto d = value_or_throw(kernels::dpo_loss(chosen, rejected, need(mb, "ref_chosen_logps"),
                                                need(mb, "ref_rejected_logps"), o.loss));
      auto margin = d.chosen_rewards - d.rejected_rewards;
      return impl::micro_part{d.loss,
                              {{"dpo/loss", item(d.loss)},
                               {"rewards/chosen", item(d.chosen_rewards.mean())},
                               {"rewards/rejected", item(d.rejected_rewards.mean())},
                               {"rewards/accuracies", item((margin > 0).to(torch::kFloat).mean())},
                               {"rewards/margins", item(margin.mean())},
                               {"logps/chosen", item(chosen.detach().mean())},
                               {"logps/rejected", item(rejected.detach().mean())}}};
    };
    auto [r, m] = impl_->accumulate(batch, pair_units, loss_of);
    m["dpo/grad_norm"] = r.grad_norm;
    m["dpo/lr"] = r.lr;
    return impl_->from_last_stage(impl_->group_metrics(std::move(m), r));
  });
}

expected<metric_map> train_engine::rm_eval(const runtime::tensor_batch& batch) {
  if (impl_->model->head() != models::head_kind::reward)
    return make_error(errc::invalid_argument, "rm_eval: the model has no reward head");
  if (auto ok = impl_->make_resident(); !ok)
    return ok.error();
  return guarded("rm_eval", [&]() -> expected<metric_map> {
    torch::NoGradGuard no_grad;
    auto margins = impl_->by_micro_batches(batch, [&](const runtime::tensor_batch& mb) {
      auto [rc, rr] = impl_->pair_scores(mb);
      runtime::tensor_batch out;
      value_or_throw(out.set("margin", rc - rr));
      return out;
    });
    auto margin = need(margins, "margin");
    return metric_map{{"rm/eval_loss", item(-torch::log_sigmoid(margin).mean())},
                      {"rm/eval_accuracy", item((margin > 0).to(torch::kFloat).mean())}};
  });
}

std::vector<runtime::tensor_spec> train_engine::export_layout() const {
  auto& d = *impl_;
  if (!d.pipelined())
    return d.own_layout();
  if (d.stage_layouts.empty())
    throw error_exception(make_error(
        errc::invalid_argument, "export_layout: a pipeline stage exports after joining its group"));
  std::vector<runtime::tensor_spec> out; // NOTE [pipeline export]
  for (const auto& stage : d.stage_layouts)
    out.insert(out.end(), stage.begin(), stage.end());
  return out;
}

expected<void> train_engine::export_weights_to(const runtime::tensor_sink& put) const {
  if (auto ok = impl_->make_resident(); !ok)
    return ok.error();
  const auto& pp = impl_->model->pp();
  if (pp.active() && (!pp.first() || impl_->stage_layouts.empty()))
    return make_error(errc::invalid_argument,
                      "export_weights: the first pipeline stage exports, after joining its group "
                      "(the others call gather_weights)");
  return guarded("export_weights", [&] {
    auto params = impl_->model->parameters();
    size_t k = 0;
    // NOTE [sync staging]: what the export makes — a TP gather's working
    // set, a later stage's tensor received — is held while the transport
    // copies it; the largest is the spike beyond the copy.
    int64_t made = 0;
    const auto& tp = impl_->model->tp();
    const auto& names = impl_->names();
    const auto& config = impl_->model->config();
    const auto unit = impl_->by_export_units([&](size_t i) {
      auto t = impl_->whole(i, params[i]);
      if (tp.active())
        made = std::max(
            made, models::tp_gather_peak_bytes(names.at(i), config, tp,
                                               t.numel() * static_cast<int64_t>(t.element_size())));
      put(k++, t);
    });
    auto received = [&](size_t at, const at::Tensor& t) {
      made = std::max(made, t.numel() * static_cast<int64_t>(t.element_size()));
      put(at, t);
    };
    if (pp.active())
      impl_->pipeline_export(received, k);
    impl_->export_spike = unit + made;
  });
}

std::map<std::string, at::Tensor> train_engine::export_weights() const {
  const auto layout = export_layout();
  std::map<std::string, at::Tensor> out;
  value_or_throw(export_weights_to([&](size_t k, const at::Tensor& t) {
    out.emplace(layout[k].name, t.to(at::kCPU).contiguous().clone());
  }));
  return out;
}

int64_t train_engine::export_spike_bytes() const {
  return impl_->export_spike;
}

expected<void> train_engine::save_pretrained(const std::string& dir) const {
  if (auto ok = impl_->make_resident(); !ok)
    return ok.error();
  auto tensors = guarded("save_pretrained", [&] { return export_weights(); });
  if (!tensors)
    return tensors.error();
  return models::save_exported(impl_->model, dir, *tensors);
}

expected<int64_t> train_engine::gather_weights() const {
  if (auto ok = impl_->make_resident(); !ok)
    return ok.error();
  // An export's part on a rank that exports nothing: the same gathers.
  return guarded("gather_weights", [&] {
    auto params = impl_->model->parameters();
    int64_t bytes = 0;
    const bool gathers = impl_->strategy && impl_->strategy->layer_hooks();
    const auto& pp = impl_->model->pp();
    size_t j = 0;
    impl_->by_export_units([&](size_t i) {
      if (!impl_->exported(i))
        return;
      auto t = impl_->whole(i, params[i]); // the TP group's gather (NOTE [tensor parallelism])
      if (gathers || impl_->model->tp().active())
        bytes += t.numel() * static_cast<int64_t>(t.element_size());
      // NOTE [pipeline export]: a later stage's tensors go to the first.
      if (pp.active() && !pp.first())
        value_or_throw(pp.group->send(t.contiguous(), 0, impl::export_tag + static_cast<int>(j)));
      ++j;
    });
    if (pp.active() && pp.first())
      impl_->pipeline_export(nullptr, 0); // received and dropped: another replica exports
    return bytes;
  });
}

// NOTE [peer state]: under ddp every rank holds the whole training state,
// so a surviving rank can hand a restarted one the state it needs. When the
// lost rank interrupted an update, the survivors may have stepped part of
// it (up to the collective the lost rank never came to), and the phase
// runs again from the start: so each update first keeps the state as it
// was, and the survivor hands over that copy. Kept in memory, one copy of
// each tensor (a memory copy per update, not a serialisation: that cost
// 3x a step; docs/benchmarks.md, issue 33), replaced by the next update,
// serialised only when a peer asks for it.
expected<void> train_engine::keep_state_before_updates(bool on) {
  auto& d = *impl_;
  if (on && !d.strategy)
    return make_error(errc::invalid_argument,
                      "keep_state_before_updates: a frozen engine has no training state");
  if (on &&
      (d.strategy->kind() != dp_strategy::ddp || d.model->tp().active() || d.model->pp().active()))
    return make_error(errc::unsupported,
                      "keep_state_before_updates: a rank holds the whole state under ddp only "
                      "(this one holds a shard or a part of the model)");
  d.keep_before_update = on;
  if (!on)
    d.before_update.reset();
  return {};
}

expected<void> train_engine::keep_state_before_update() {
  auto& d = *impl_;
  if (!d.keep_before_update)
    return {};
  if (auto ok = d.make_resident(); !ok)
    return ok.error();
  return guarded("keeping the state before the update", [&]() -> expected<void> {
    auto now = d.strategy->whole_state();
    if (!now)
      return now.error();
    for (const auto& p : d.model->named_parameters())
      now->emplace_back("param/" + p.key(), p.value().detach());
    now->emplace_back("steps", torch::tensor(d.steps, torch::kLong));
    torch::NoGradGuard no_grad;
    // Into the last update's copy when it has the same layout: a memory
    // copy without new pages (fresh ones cost their page faults each time).
    auto& kept = d.before_update;
    bool same = kept && kept->size() == now->size();
    for (size_t i = 0; same && i < now->size(); ++i)
      same = (*kept)[i].first == (*now)[i].first &&
             (*kept)[i].second.sizes() == (*now)[i].second.sizes() &&
             (*kept)[i].second.scalar_type() == (*now)[i].second.scalar_type();
    if (same) {
      for (size_t i = 0; i < now->size(); ++i)
        (*kept)[i].second.copy_((*now)[i].second);
      return {};
    }
    for (auto& [key, t] : *now)
      t = t.clone();
    kept = std::move(*now);
    return {};
  });
}

expected<std::string> train_engine::state_before_update() const {
  if (!impl_->before_update)
    return save_state();
  return guarded("state_before_update", [&]() -> expected<std::string> {
    torch::serialize::OutputArchive archive;
    for (const auto& [key, t] : *impl_->before_update)
      archive.write(key, t);
    return archive_bytes(archive);
  });
}

expected<void> train_engine::die_in_collective(int64_t nth, std::function<void()> die) {
  auto& d = *impl_;
  if (!d.dp)
    return make_error(errc::invalid_argument, "die_in_collective: the engine is in no DP group");
  if (nth < 1)
    return make_error(errc::invalid_argument, "die_in_collective: nth counts from 1");
  d.dp->group = runtime::dying_at(std::move(d.dp->group), nth, std::move(die));
  return {};
}

expected<std::string> train_engine::save_state() const {
  if (auto ok = impl_->make_resident(); !ok)
    return ok.error();
  return guarded("save_state", [&]() -> expected<std::string> {
    // Parameters under flat names, so loading can check every shape first.
    torch::serialize::OutputArchive archive;
    impl_->with_whole_parameters(false, [&] {
      for (const auto& p : impl_->model->named_parameters())
        archive.write("param/" + p.key(), p.value().detach());
      return 0;
    });
    if (impl_->strategy)
      value_or_throw(impl_->strategy->save_state(archive));
    archive.write("steps", torch::tensor(impl_->steps, torch::kLong));
    return archive_bytes(archive);
  });
}

// NOTE [sharded state]: a shard file holds "shard/segments" ([K, 2]:
// offset and length in the canonical layout), "shard/params" and, after the
// first step, "shard/exp_avg" and "shard/exp_avg_sq" (the segments' values
// end to end) and, for bf16 weights, "shard/master" (NOTE [mixed
// precision]), "shard/total" (the layout's elements), "optimizer/step" and
// "steps".
expected<std::string> train_engine::save_shard() const {
  if (auto ok = impl_->make_resident(); !ok)
    return ok.error();
  if (!impl_->strategy)
    return make_error(errc::invalid_argument, "save_shard: a frozen engine has no training state");
  return guarded("save_shard", [&]() -> expected<std::string> {
    auto part = value_or_throw(impl_->strategy->state_shard());
    torch::serialize::OutputArchive archive;
    const auto k = static_cast<int64_t>(part.segments.size() / 2);
    archive.write("shard/segments", torch::tensor(part.segments, torch::kLong).view({k, 2}));
    archive.write("shard/params", part.params);
    if (part.exp_avg.defined()) {
      archive.write("shard/exp_avg", part.exp_avg);
      archive.write("shard/exp_avg_sq", part.exp_avg_sq);
    }
    if (part.master.defined())
      archive.write("shard/master", part.master);
    archive.write("shard/total", torch::tensor(part.total, torch::kLong));
    archive.write("optimizer/step", torch::tensor(part.step, torch::kLong));
    archive.write("steps", torch::tensor(impl_->steps, torch::kLong));
    return archive_bytes(archive);
  });
}

namespace {

// The whole training state from its shards (NOTE [sharded state]), as a
// load_state archive of `like` (the canonical layout's parameters).
class shard_assembly {
public:
  explicit shard_assembly(const std::vector<std::pair<std::string, at::Tensor>>& like)
      : like_(like) {
    for (const auto& [name, p] : like)
      total_ += p.numel();
    covered_ = at::zeros({total_}, at::kByte);
  }

  expected<void> add(size_t i, const std::string& bytes) {
    const auto where = "load_shards: shard " + std::to_string(i);
    torch::serialize::InputArchive a;
    a.load_from(bytes.data(), bytes.size());
    at::Tensor seg, t, st, sp;
    at::Tensor parts[4]; // indexed like names
    if (!a.try_read("shard/segments", seg) || !a.try_read("shard/params", parts[0]) ||
        !a.try_read("shard/total", t) || !a.try_read("optimizer/step", st) ||
        !a.try_read("steps", sp))
      return make_error(errc::corrupted, where + " is not a training-state shard");
    if (t.item<int64_t>() != total_)
      return make_error(errc::shape_mismatch,
                        where + " is of a model of " + std::to_string(t.item<int64_t>()) +
                            " parameters, this one has " + std::to_string(total_));
    for (int k = 1; k < 4; ++k)
      a.try_read("shard/" + std::string{names[k]}, parts[k]);
    if (seg.size(0) > 0)
      for (int k = 1; k < 4; ++k) {
        const int has = parts[k].defined();
        if (present_[k] >= 0 && present_[k] != has)
          return make_error(errc::corrupted,
                            where + ": some shards have " + names[k] + ", others not");
        present_[k] = has;
      }
    if ((step_ >= 0 && step_ != st.item<int64_t>()) ||
        (steps_ >= 0 && steps_ != sp.item<int64_t>()))
      return make_error(errc::corrupted, where + " is of another step than shard 0");
    step_ = st.item<int64_t>();
    steps_ = sp.item<int64_t>();
    const auto* s = seg.contiguous().data_ptr<int64_t>();
    for (int64_t k = 0, at_ = 0; k < seg.size(0); ++k) {
      const int64_t off = s[2 * k], len = s[2 * k + 1];
      if (off < 0 || len < 0 || off + len > total_ || at_ + len > parts[0].numel())
        return make_error(errc::corrupted,
                          where + ": segment " + std::to_string(k) + " lies outside the layout");
      for (int n = 0; n < 4; ++n)
        if (parts[n].defined())
          whole(n, parts[n]).narrow(0, off, len).copy_(parts[n].narrow(0, at_, len));
      covered_.narrow(0, off, len).add_(1);
      at_ += len;
    }
    return {};
  }

  expected<std::string> archive() {
    auto once = covered_.eq(1);
    if (!once.all().item<bool>()) {
      const auto first = once.logical_not().nonzero()[0][0].item<int64_t>();
      return make_error(errc::corrupted,
                        "load_shards: the shards do not cover the state once each: element " +
                            std::to_string(first) + " of " + std::to_string(total_) + " is " +
                            (covered_[first].item<int>() == 0 ? "missing" : "given twice"));
    }
    torch::serialize::OutputArchive out;
    int64_t at_ = 0;
    const auto& params = whole(0, like_.front().second);
    for (const auto& [name, p] : like_) {
      out.write("param/" + name, params.narrow(0, at_, p.numel()).view(p.sizes()));
      at_ += p.numel();
    }
    out.write("optimizer/step", torch::tensor(step_, torch::kLong));
    for (int k = 1; k < 4; ++k)
      if (present_[k] == 1)
        out.write("optimizer/" + std::string{names[k]}, wholes_[k]);
    out.write("steps", torch::tensor(steps_, torch::kLong));
    std::ostringstream bytes;
    out.save_to(bytes);
    return bytes.str();
  }

private:
  static constexpr const char* names[4] = {"params", "exp_avg", "exp_avg_sq", "master"};

  // The whole of part n, made in the dtype of its first shard.
  at::Tensor& whole(int n, const at::Tensor& like) {
    if (!wholes_[n].defined())
      wholes_[n] = at::zeros({total_}, like.options().requires_grad(false));
    return wholes_[n];
  }

  const std::vector<std::pair<std::string, at::Tensor>>& like_;
  int64_t total_ = 0;
  at::Tensor covered_;
  at::Tensor wholes_[4];
  int present_[4] = {-1, -1, -1, -1}; // unknown, 0 or 1: every shard alike
  int64_t step_ = -1, steps_ = -1;
};

expected<std::string> assemble_shards(const std::vector<std::string>& shards,
                                      const std::vector<std::pair<std::string, at::Tensor>>& like) {
  if (shards.empty())
    return make_error(errc::invalid_argument, "load_shards: no shards");
  shard_assembly assembly{like};
  for (size_t i = 0; i < shards.size(); ++i)
    if (auto ok = assembly.add(i, shards[i]); !ok)
      return ok.error();
  return assembly.archive();
}

} // namespace

expected<void> train_engine::load_shards(const std::vector<std::string>& shards) {
  if (auto ok = impl_->make_resident(); !ok)
    return ok.error();
  auto whole = guarded("load_shards", [&]() -> expected<std::string> {
    std::vector<std::pair<std::string, at::Tensor>> like;
    impl_->with_whole_parameters(false, [&] {
      for (const auto& p : impl_->model->named_parameters())
        like.emplace_back(p.key(), at::empty(p.value().sizes(), p.value().options()));
      return 0;
    });
    return assemble_shards(shards, like);
  });
  if (!whole)
    return whole.error();
  return load_state(*whole);
}

expected<void> train_engine::load_state(const std::string& bytes) {
  if (auto ok = impl_->make_resident(); !ok)
    return ok.error();
  // Into whole parameters (zero3 gathers them), which become the shards.
  return guarded("load_state", [&]() -> expected<void> {
    return impl_->with_whole_parameters(true, [&]() -> expected<void> {
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size());
      // Every parameter must be present with its shape before any is
      // written: a state of another model is refused, the engine untouched.
      // The values are the fp32 masters where the state has them (NOTE
      // [mixed precision]); either loads at either precision.
      at::Tensor masters;
      archive.try_read("optimizer/master", masters);
      std::vector<std::pair<at::Tensor, at::Tensor>> copies;
      int64_t at_ = 0;
      for (const auto& p : impl_->model->named_parameters()) {
        at::Tensor t;
        if (!archive.try_read("param/" + p.key(), t))
          return make_error(errc::corrupted, "load_state: the state has no parameter " + p.key());
        if (t.sizes() != p.value().sizes() || !at::isFloatingType(t.scalar_type()))
          return make_error(errc::shape_mismatch,
                            "load_state: parameter " + p.key() + " has shape " +
                                c10::str(t.sizes()) + " in the state, " +
                                c10::str(p.value().sizes()) + " in the model");
        if (masters.defined() && at_ + t.numel() <= masters.numel())
          t = masters.narrow(0, at_, t.numel()).view(t.sizes());
        at_ += t.numel();
        copies.emplace_back(p.value(), t);
      }
      // The optimizer state next (a state without one is refused before
      // any parameter is written), then the parameters.
      if (impl_->strategy)
        value_or_throw(impl_->strategy->load_state(archive));
      {
        torch::NoGradGuard no_grad;
        for (auto& [param, t] : copies)
          param.copy_(t);
      }
      at::Tensor steps;
      archive.read("steps", steps);
      impl_->steps = steps.item<int64_t>();
      return {};
    });
  });
}

} // namespace troupe::actors::train
