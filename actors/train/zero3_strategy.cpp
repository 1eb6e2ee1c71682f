// zero3: parameters, gradients and AdamW state sharded over the DP ranks.
//
// NOTE [zero3 units]: the parameters are cut into units — one a transformer
// layer, one for the rest (embeddings, final norm, head) — and each unit
// into a flat layout padded to a multiple of the DP size and cut into equal
// shards. A rank holds only its shard of every unit at rest (its shards
// side by side in one buffer, which one flat AdamW steps: NOTE [flat
// AdamW]); the model's parameters hold nothing (0 elements) until a unit is
// gathered, when they become views of the gathered unit.
// Through the model's hooks (NOTE [layer hooks] in models/llama.hpp):
//   - a forward pass gathers the rest-unit first; without a backward to
//     follow it frees it at the end, else it stays whole until the step;
//   - a layer without gradient: gathered, run, freed;
//   - a layer with gradient runs as one autograd node (layer_function):
//     forward gathers, runs without recording, frees, and keeps only its
//     input; backward gathers again, runs the layer again with gradient
//     from that input, takes the gradients of its input and its
//     parameters, reduce-scatters the parameters' gradients into this
//     rank's shard of the layer's sum, and frees — so at most about one
//     layer's whole parameters and gradients exist at a time (the cost:
//     each layer's forward runs twice, as with activation checkpointing);
//   - the rest-unit's gradients accumulate in .grad as usual and are
//     reduce-scattered after each backward (backward_done).
// Every rank runs the same passes, so every rank issues the same gathers
// and reductions in the same order (a rank with fewer micro-batches runs
// its last again at weight 0: NOTE [micro-batches] in train_engine.cpp).
// The training state has the other strategies' layout (the whole model's
// moments in parameter order), so it loads under any strategy and DP size.
#include "actors/train/strategy_parts.hpp"

#include "models/llama.hpp"
#include "runtime/collectives.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

namespace troupe::actors::train::detail {
namespace {

// One unit's part of the model (NOTE [zero3 units]).
struct unit {
  std::vector<size_t> params;   // indices into the strategy's parameters
  std::vector<int64_t> offsets; // of each in the unit's flat layout
  int64_t total = 0;            // elements, without the padding
  int64_t shard = 0;            // elements a rank
  int64_t at = 0;               // of this rank's shard in its buffers
  at::Tensor whole;             // the gathered unit, or undefined
};

class zero3_strategy;

// What a layer's autograd node keeps to run the layer again in backward.
struct layer_call : torch::CustomClassHolder {
  layer_call(std::function<at::Tensor(const at::Tensor&)> f, zero3_strategy* s, size_t l)
      : fn(std::move(f)), strategy(s), layer(l) {}
  std::function<at::Tensor(const at::Tensor&)> fn;
  zero3_strategy* strategy;
  size_t layer;
};

struct layer_function : torch::autograd::Function<layer_function> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<layer_call> call);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads);
};

[[noreturn]] void raise(const caf::error& e) {
  throw std::runtime_error(describe(e));
}

class zero3_strategy final : public training_strategy, public models::layer_hooks {
public:
  zero3_strategy(std::vector<at::Tensor> params, std::vector<std::vector<size_t>> layers,
                 const optimizer_options& o, runtime::process_group& group, model_lines lines)
      : params_(std::move(params)), group_(group), world_(group.size()), rank_(group.rank()),
        lines_(std::move(lines)) {
    adam_.o = o;
    for (const auto& p : params_)
      shapes_.push_back(p.sizes().vec());
    make_units(std::move(layers));
    // This rank's shards of the (equal) parameters; then they are freed.
    torch::NoGradGuard no_grad;
    flat_ = at::zeros({buffer_size()}, params_.front().options().requires_grad(false));
    empty_ = at::empty({0}, flat_.options());
    for (auto& u : units_) {
      auto padded = at::zeros({u.shard * world_}, flat_.options());
      for (size_t k = 0; k < u.params.size(); ++k)
        padded.narrow(0, u.offsets[k], params_[u.params[k]].numel())
            .copy_(params_[u.params[k]].reshape({-1}));
      mine(u).copy_(padded.narrow(0, rank_ * u.shard, u.shard));
      free_unit(u);
    }
  }

  dp_strategy kind() const override { return dp_strategy::zero3; }
  bool reduces_in_backward() const override { return true; }
  models::layer_hooks* layer_hooks() override { return this; }

  // ---- models::layer_hooks ----------------------------------------------------------

  void begin_forward() override { gather_or_throw(rest()); }
  void end_forward() override { free_unit(rest()); }

  at::Tensor run_layer(size_t layer, const at::Tensor& x,
                       std::function<at::Tensor(const at::Tensor&)> fn) override {
    if (torch::GradMode::is_enabled() && x.requires_grad())
      return layer_function::apply(x, c10::make_intrusive<layer_call>(std::move(fn), this, layer));
    gather_or_throw(units_[layer]);
    auto out = fn(x);
    free_unit(units_[layer]);
    return out;
  }

  // ---- the step ---------------------------------------------------------------------

  void zero_grad() override {
    for (auto& u : units_) // what an interrupted pass left whole
      free_unit(u);
    drop_rest_grads();
    if (!grads_.defined())
      grads_ = at::zeros_like(flat_);
    else
      grads_.zero_();
  }

  expected<void> backward_done() override {
    return guarded("zero3: reducing the gradients of the embeddings and head",
                   [&]() -> expected<void> {
                     auto& u = rest();
                     std::vector<at::Tensor> g;
                     for (auto i : u.params)
                       g.push_back(params_[i].grad());
                     auto ok = reduce_into_shard(u, g);
                     drop_rest_grads();
                     return ok;
                   });
  }

  expected<void> sync_gradients() override { return {}; }

  expected<double> clip_gradients(double max_norm) override {
    return clip_by_global_norm(grads_, &group_, max_norm, tp_norm());
  }

  expected<void> step(double lr) override {
    return guarded("zero3: optimizer step", [&] {
      free_unit(rest()); // whole since the forward: stale after the step
      adam_.step(flat_, grads_, lr);
    });
  }

  // ---- whole parameters, state ------------------------------------------------------

  expected<void> gather_parameters() override {
    for (auto& u : units_)
      if (auto ok = gather(u); !ok)
        return ok;
    return {};
  }

  void release_parameters(bool keep_changes) override {
    torch::NoGradGuard no_grad;
    for (auto& u : units_) {
      if (keep_changes && u.whole.defined())
        mine(u).copy_(u.whole.narrow(0, rank_ * u.shard, u.shard));
      free_unit(u);
    }
  }

  int64_t optimizer_bytes() const override { return adam_.bytes(); }

  // NOTE [export units]: the layers', then the rest.
  std::vector<std::vector<size_t>> export_units() const override {
    std::vector<std::vector<size_t>> out;
    for (const auto& u : units_)
      out.push_back(u.params);
    return out;
  }
  expected<void> gather_unit(size_t u) override { return gather(units_.at(u)); }
  void release_unit(size_t u) override { free_unit(units_.at(u)); }

  // Co-located offload: the moments to `path`, this rank's parameter
  // shards to `path`.params (nothing is whole at rest), the gradients freed.
  expected<int64_t> release(const std::string& path) override {
    return guarded("zero3: offloading the optimizer state and parameter shards",
                   [&]() -> expected<int64_t> {
                     for (auto& u : units_) // what an interrupted pass left whole
                       free_unit(u);
                     int64_t bytes = adam_.offload(path);
                     if (grads_.defined())
                       bytes += grads_.numel() * static_cast<int64_t>(grads_.element_size());
                     grads_ = at::Tensor();
                     torch::serialize::OutputArchive a;
                     a.write("shards", flat_);
                     a.save_to(path + ".params");
                     bytes += flat_.numel() * static_cast<int64_t>(flat_.element_size());
                     flat_ = at::Tensor();
                     return bytes;
                   });
  }

  expected<void> reload_state(const std::string& path) override {
    return guarded("zero3: reloading the offloaded optimizer state and parameter shards", [&] {
      torch::serialize::InputArchive a;
      a.load_from(path + ".params");
      a.read("shards", flat_);
      std::remove((path + ".params").c_str());
      if (std::ifstream(path).good()) // no moments before the first step
        adam_.reload(path);
    });
  }

  // The whole model's moments (and fp32 masters: NOTE [mixed precision]),
  // unpadded, in parameter order (NOTE [flat AdamW]): each unit's gathered,
  // each parameter's range put in its place.
  expected<void> save_state(torch::serialize::OutputArchive& archive) const override {
    archive.write("optimizer/step", torch::tensor(adam_.t, torch::kLong));
    for (const auto& [name, part] :
         {std::pair{"exp_avg", adam_.m}, {"exp_avg_sq", adam_.v}, {"master", adam_.master}}) {
      if (!part.defined())
        continue;
      auto whole = at::empty({total_}, part.options());
      for (const auto& u : units_) {
        if (u.params.empty()) // another pipeline stage's layer
          continue;
        auto gathered = at::empty({u.shard * world_}, part.options());
        if (auto ok = group_.all_gather(part.narrow(0, u.at, u.shard), gathered); !ok)
          return with_prefix(ok.error(), std::string{"zero3: gathering "} + name);
        for (size_t k = 0; k < u.params.size(); ++k) {
          const auto n = params_numel(u.params[k]);
          whole.narrow(0, global_[u.params[k]], n).copy_(gathered.narrow(0, u.offsets[k], n));
        }
      }
      archive.write(std::string{"optimizer/"} + name, whole);
    }
    return {};
  }

  expected<void> load_state(torch::serialize::InputArchive& archive) override {
    return guarded("zero3: loading the optimizer state", [&]() -> expected<void> {
      auto state = adam_.read_state(archive, total_, flat_.scalar_type());
      if (!state)
        return state.error();
      adam_.m = my_shards_of(state->exp_avg);
      adam_.v = my_shards_of(state->exp_avg_sq);
      adam_.master = my_shards_of(state->master);
      return {};
    });
  }

  // NOTE [sharded state]: this rank's shard of each unit, cut where the
  // unit's parameters meet (each a segment of the canonical layout).
  expected<shard> state_shard() const override {
    return guarded("zero3: the state's shard", [&] {
      shard out;
      out.step = adam_.t;
      out.total = total_;
      std::vector<at::Tensor> params, m, v, master;
      for (const auto& u : units_) {
        const int64_t mine_lo = rank_ * u.shard, mine_hi = mine_lo + u.shard;
        for (size_t k = 0; k < u.params.size(); ++k) {
          const int64_t lo = std::max(mine_lo, u.offsets[k]);
          const int64_t hi = std::min(mine_hi, u.offsets[k] + params_numel(u.params[k]));
          if (hi <= lo)
            continue;
          out.segments.push_back(global_[u.params[k]] + lo - u.offsets[k]);
          out.segments.push_back(hi - lo);
          const int64_t at = u.at + lo - mine_lo;
          params.push_back(flat_.narrow(0, at, hi - lo));
          if (adam_.m.defined()) {
            m.push_back(adam_.m.narrow(0, at, hi - lo));
            v.push_back(adam_.v.narrow(0, at, hi - lo));
          }
          if (adam_.master.defined())
            master.push_back(adam_.master.narrow(0, at, hi - lo));
        }
      }
      out.params = params.empty() ? at::empty({0}, flat_.options()) : at::cat(params);
      if (!m.empty()) {
        out.exp_avg = at::cat(m);
        out.exp_avg_sq = at::cat(v);
      }
      if (!master.empty())
        out.master = at::cat(master);
      return out;
    });
  }

  // ---- for layer_function -----------------------------------------------------------

  unit& layer_unit(size_t layer) { return units_[layer]; }
  const at::Tensor& param(size_t i) const { return params_[i]; }

  void gather_or_throw(unit& u) {
    if (auto ok = gather(u); !ok)
      raise(ok.error());
  }
  void free_unit(unit& u) {
    for (auto i : u.params)
      params_[i].set_data(empty_);
    u.whole = at::Tensor();
  }
  // The unit's gradients (undefined: none) summed over the group into this
  // rank's shard of them.
  expected<void> reduce_into_shard(unit& u, const std::vector<at::Tensor>& g) {
    if (u.params.empty()) // another pipeline stage's layer, or a middle stage's rest
      return {};
    torch::NoGradGuard no_grad;
    auto padded = at::zeros({u.shard * world_}, flat_.options());
    for (size_t k = 0; k < u.params.size(); ++k)
      if (g[k].defined())
        padded.narrow(0, u.offsets[k], params_numel(u.params[k])).copy_(g[k].reshape({-1}));
    auto part = at::empty({u.shard}, flat_.options());
    if (auto ok = group_.reduce_scatter(padded, part, runtime::reduce_op::sum); !ok)
      return with_prefix(ok.error(), "zero3: reduce-scattering a unit's gradients");
    grads_.narrow(0, u.at, u.shard).add_(part);
    return {};
  }

private:
  // NOTE [tensor-parallel norm]: the replicated (and counted-elsewhere)
  // parameters' elements in this rank's shards (each unit's shard is
  // [rank · shard, + shard) of its padded layout, at u.at in grads_).
  detail::tp_norm tp_norm() const {
    auto out = detail::tp_norm::of(lines_);
    for (const auto& u : units_) {
      const int64_t lo = rank_ * u.shard;
      for (size_t k = 0; k < u.params.size(); ++k)
        out.add(lines_, u.params[k], u.at, lo, lo + u.shard, u.offsets[k],
                params_numel(u.params[k]));
    }
    return out;
  }

  void make_units(std::vector<std::vector<size_t>> layers) {
    std::vector<bool> in_layer(params_.size(), false);
    for (auto& l : layers) {
      units_.push_back({});
      units_.back().params = std::move(l);
      for (auto i : units_.back().params)
        in_layer[i] = true;
    }
    units_.push_back({}); // the rest
    for (size_t i = 0; i < params_.size(); ++i)
      if (!in_layer[i])
        units_.back().params.push_back(i);
    int64_t at = 0;
    for (auto& u : units_) {
      for (auto i : u.params) {
        u.offsets.push_back(u.total);
        u.total += params_numel(i);
      }
      u.shard = (u.total + world_ - 1) / world_;
      u.at = at;
      at += u.shard;
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      global_.push_back(total_);
      total_ += params_numel(i);
    }
  }

  int64_t buffer_size() const { return units_.back().at + units_.back().shard; }
  int64_t params_numel(size_t i) const {
    int64_t n = 1;
    for (auto d : shapes_[i])
      n *= d;
    return n;
  }
  unit& rest() { return units_.back(); }
  at::Tensor mine(const unit& u) const { return flat_.narrow(0, u.at, u.shard); }

  expected<void> gather(unit& u) {
    if (u.whole.defined() || u.params.empty())
      return {};
    auto whole = at::empty({u.shard * world_}, flat_.options());
    if (auto ok = group_.all_gather(mine(u), whole); !ok)
      return with_prefix(ok.error(), "zero3: gathering a unit's parameters");
    for (size_t k = 0; k < u.params.size(); ++k) {
      auto i = u.params[k];
      params_[i].set_data(whole.narrow(0, u.offsets[k], params_numel(i)).view(shapes_[i]));
    }
    u.whole = whole;
    return {};
  }

  void drop_rest_grads() {
    for (auto i : rest().params)
      params_[i].mutable_grad() = at::Tensor();
  }

  // This rank's shards of a whole-model tensor in parameter order, in its
  // dtype (undefined: none).
  at::Tensor my_shards_of(const at::Tensor& whole) const {
    if (!whole.defined())
      return {};
    auto out = at::zeros({flat_.numel()}, whole.options());
    for (const auto& u : units_) {
      auto padded = at::zeros({u.shard * world_}, whole.options());
      for (size_t k = 0; k < u.params.size(); ++k) {
        const auto n = params_numel(u.params[k]);
        padded.narrow(0, u.offsets[k], n).copy_(whole.narrow(0, global_[u.params[k]], n));
      }
      out.narrow(0, u.at, u.shard).copy_(padded.narrow(0, rank_ * u.shard, u.shard));
    }
    return out;
  }

  std::vector<at::Tensor> params_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> global_; // each parameter's offset in the whole model
  int64_t total_ = 0;
  std::vector<unit> units_; // the layers', then the rest
  runtime::process_group& group_;
  const int world_, rank_;
  model_lines lines_;
  at::Tensor flat_;  // this rank's shards of every unit
  at::Tensor grads_; // their summed gradients
  at::Tensor empty_; // what a freed parameter holds
  flat_adam adam_;
};

at::Tensor layer_function::forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                   c10::intrusive_ptr<layer_call> call) {
  auto& s = *call->strategy;
  auto& u = s.layer_unit(call->layer);
  s.gather_or_throw(u);
  auto out = call->fn(x);
  s.free_unit(u);
  ctx->save_for_backward({x});
  ctx->saved_data["call"] = c10::IValue::make_capsule(call);
  return out;
}

torch::autograd::variable_list layer_function::backward(torch::autograd::AutogradContext* ctx,
                                                        torch::autograd::variable_list grads) {
  auto call = c10::static_intrusive_pointer_cast<layer_call>(ctx->saved_data["call"].toCapsule());
  auto& s = *call->strategy;
  auto& u = s.layer_unit(call->layer);
  auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
  s.gather_or_throw(u);
  at::Tensor out;
  {
    torch::AutoGradMode with_grad(true);
    out = call->fn(x);
  }
  std::vector<at::Tensor> inputs{x};
  for (auto i : u.params)
    inputs.push_back(s.param(i));
  auto g = torch::autograd::grad({out}, inputs, {grads[0]}, /*retain_graph=*/false,
                                 /*create_graph=*/false, /*allow_unused=*/true);
  if (auto ok = s.reduce_into_shard(u, {g.begin() + 1, g.end()}); !ok)
    raise(ok.error());
  s.free_unit(u);
  return {g[0], at::Tensor()};
}

} // namespace

expected<std::unique_ptr<training_strategy>>
make_zero3_strategy(std::vector<at::Tensor> params, std::vector<std::vector<size_t>> layers,
                    const optimizer_options& optim, runtime::process_group& group,
                    model_lines lines) {
  return guarded("zero3", [&]() -> expected<std::unique_ptr<training_strategy>> {
    return std::unique_ptr<training_strategy>(
        new zero3_strategy(std::move(params), std::move(layers), optim, group, std::move(lines)));
  });
}

} // namespace troupe::actors::train::detail
