#include "actors/train/training_strategy.hpp"

#include "runtime/collectives.hpp"
#include "runtime/gradient_reducer.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <cmath>

namespace troupe::actors::train {

training_strategy::~training_strategy() = default;

namespace {

// torch's clip_grad_norm_ rule on a norm already computed.
double clip_coefficient(double norm, double max_norm) {
  return max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
}

// The AdamW of what a rank updates, and its state in files and archives:
// what the strategies share.
class adam_strategy : public training_strategy {
public:
  int64_t optimizer_bytes() const override {
    int64_t bytes = 0;
    for (const auto& [key, st] : optim_->state()) {
      const auto& a = static_cast<const torch::optim::AdamWParamState&>(*st);
      for (const auto* t : {&a.exp_avg(), &a.exp_avg_sq(), &a.max_exp_avg_sq()})
        if (t->defined())
          bytes += t->numel() * static_cast<int64_t>(t->element_size());
    }
    return bytes;
  }

  expected<void> offload_state(const std::string& path) override {
    return guarded("offloading the optimizer state", [&]() -> expected<void> {
      torch::serialize::OutputArchive a;
      optim_->save(a);
      a.save_to(path);
      optim_->state().clear();
      return {};
    });
  }

  expected<void> reload_state(const std::string& path) override {
    return guarded("reloading the offloaded optimizer state", [&]() -> expected<void> {
      torch::serialize::InputArchive a;
      a.load_from(path);
      optim_->load(a);
      return {};
    });
  }

protected:
  adam_strategy(std::vector<at::Tensor> updated, const optimizer_options& o) {
    torch::optim::AdamWOptions a(o.lr);
    a.betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay);
    optim_ = std::make_unique<torch::optim::AdamW>(std::move(updated), a);
  }

  void adam_step(double lr) {
    for (auto& group : optim_->param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    optim_->step();
  }

  std::unique_ptr<torch::optim::AdamW> optim_;
};

// ---- ddp ---------------------------------------------------------------------------

class ddp_strategy final : public adam_strategy {
public:
  ddp_strategy(std::vector<at::Tensor> params, const optimizer_options& o,
               std::optional<runtime::gradient_reducer> reducer)
      : adam_strategy(params, o), params_(std::move(params)), reducer_(std::move(reducer)) {}

  dp_strategy kind() const override { return dp_strategy::ddp; }

  void zero_grad() override { optim_->zero_grad(); }

  expected<void> sync_gradients() override {
    return reducer_ ? reducer_->all_reduce(1.0) : expected<void>{};
  }

  expected<double> clip_gradients(double max_norm) override {
    return guarded("clip_gradients", [&]() -> expected<double> {
      if (max_norm > 0)
        return torch::nn::utils::clip_grad_norm_(params_, max_norm);
      double sq = 0;
      for (const auto& p : params_)
        if (p.grad().defined())
          sq += p.grad().pow(2).sum().item<double>();
      return std::sqrt(sq);
    });
  }

  expected<void> step(double lr) override {
    return guarded("optimizer step", [&] { adam_step(lr); });
  }

  expected<void> save_state(torch::serialize::OutputArchive& archive) const override {
    return guarded("saving the optimizer state", [&] {
      torch::serialize::OutputArchive a;
      optim_->save(a);
      archive.write("optimizer", a);
    });
  }

  expected<void> load_state(torch::serialize::InputArchive& archive) override {
    return guarded("loading the optimizer state", [&]() -> expected<void> {
      torch::serialize::InputArchive a;
      if (!archive.try_read("optimizer", a))
        return make_error(errc::corrupted, "load_state: the state has no optimizer");
      optim_->load(a);
      return {};
    });
  }

private:
  std::vector<at::Tensor> params_;
  std::optional<runtime::gradient_reducer> reducer_;
};

// ---- zero1 -------------------------------------------------------------------------

// The model's parameters moved into one flat buffer padded to a multiple of
// the DP size (each parameter becomes a view of its range), and this rank's
// shard of it.
struct flat_shards {
  std::vector<at::Tensor> params;
  std::vector<int64_t> offsets; // of each parameter in the flat buffer
  at::Tensor flat;              // [padded]
  int64_t shard = 0;            // elements a rank
  int rank = 0;

  flat_shards(std::vector<at::Tensor> ps, int world, int r) : params(std::move(ps)), rank(r) {
    int64_t total = 0;
    for (const auto& p : params) {
      offsets.push_back(total);
      total += p.numel();
    }
    shard = (total + world - 1) / world;
    flat = at::zeros({shard * world}, params.front().options().requires_grad(false));
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      auto& p = params[i];
      auto range = flat.narrow(0, offsets[i], p.numel());
      range.copy_(p.reshape({-1}));
      p.set_(range.view(p.sizes()));
    }
  }

  at::Tensor mine(const at::Tensor& whole) const { return whole.narrow(0, rank * shard, shard); }
};

class zero1_strategy final : public adam_strategy {
public:
  zero1_strategy(flat_shards f, const optimizer_options& o, runtime::process_group& group)
      : adam_strategy({f.mine(f.flat).detach().requires_grad_(true)}, o), f_(std::move(f)),
        group_(group), grads_(at::zeros_like(f_.flat)) {
    shard_param_ = optim_->param_groups().front().params().front();
    shard_param_.mutable_grad() = at::zeros({f_.shard}, f_.flat.options());
  }

  dp_strategy kind() const override { return dp_strategy::zero1; }

  void zero_grad() override {
    for (auto& p : f_.params)
      p.mutable_grad() = at::Tensor();
  }

  expected<void> sync_gradients() override {
    auto packed = guarded("zero1: packing the gradients", [&] {
      for (size_t i = 0; i < f_.params.size(); ++i) {
        const auto& p = f_.params[i];
        auto range = grads_.narrow(0, f_.offsets[i], p.numel());
        if (p.grad().defined())
          range.copy_(p.grad().reshape({-1}));
        else
          range.zero_();
      }
    });
    if (!packed)
      return packed.error();
    auto& shard_grad = shard_param_.mutable_grad();
    if (auto ok = group_.reduce_scatter(grads_, shard_grad, runtime::reduce_op::sum); !ok)
      return with_prefix(ok.error(), "zero1: reduce-scattering the gradients");
    return {};
  }

  expected<double> clip_gradients(double max_norm) override {
    auto sq = guarded("zero1: the gradient norm", [&] {
      return shard_param_.grad().to(at::kDouble).pow(2).sum().reshape({1});
    });
    if (!sq)
      return sq.error();
    if (auto ok = group_.all_reduce_sum(*sq); !ok)
      return with_prefix(ok.error(), "zero1: summing the gradient norm");
    const double norm = std::sqrt(sq->item<double>());
    const double c = clip_coefficient(norm, max_norm);
    if (c < 1.0)
      shard_param_.mutable_grad().mul_(c);
    return norm;
  }

  expected<void> step(double lr) override {
    auto stepped = guarded("zero1: optimizer step", [&] { adam_step(lr); });
    if (!stepped)
      return stepped.error();
    auto mine = shard_param_.detach().clone();
    if (auto ok = group_.all_gather(mine, f_.flat); !ok)
      return with_prefix(ok.error(), "zero1: all-gathering the parameters");
    return {};
  }

  expected<void> save_state(torch::serialize::OutputArchive&) const override {
    return make_error(errc::unsupported,
                      "save_state: zero1 holds 1/N of the optimizer state on each rank; sharded "
                      "checkpoints are not implemented yet");
  }
  expected<void> load_state(torch::serialize::InputArchive&) override {
    return make_error(errc::unsupported,
                      "load_state: sharded checkpoints (zero1) are not implemented yet");
  }

private:
  flat_shards f_;
  runtime::process_group& group_;
  at::Tensor grads_;       // the flat gradient before the reduce-scatter
  at::Tensor shard_param_; // this rank's shard of f_.flat: what AdamW updates
};

} // namespace

expected<std::unique_ptr<training_strategy>>
training_strategy::make(std::vector<at::Tensor> params, const optimizer_options& optim,
                        runtime::process_group* group, const strategy_options& options) {
  if (params.empty())
    return make_error(errc::invalid_argument, "training_strategy: no parameters");
  for (const auto& p : params)
    if (p.scalar_type() != params.front().scalar_type() || p.device() != params.front().device() ||
        !p.is_floating_point())
      return make_error(errc::unsupported,
                        "training_strategy: the parameters must share one floating dtype and "
                        "one device");
  return guarded("training_strategy", [&]() -> expected<std::unique_ptr<training_strategy>> {
    switch (options.kind) {
    case dp_strategy::ddp: {
      std::optional<runtime::gradient_reducer> reducer;
      if (group) {
        runtime::reducer_options ro;
        ro.bucket_bytes = static_cast<int64_t>(options.bucket_mb * 1024 * 1024);
        auto r = runtime::gradient_reducer::make(params, *group, ro);
        if (!r)
          return r.error();
        reducer.emplace(std::move(*r));
      }
      return std::unique_ptr<training_strategy>(
          new ddp_strategy(std::move(params), optim, std::move(reducer)));
    }
    case dp_strategy::zero1: {
      if (!group)
        return make_error(errc::invalid_argument, "training_strategy: zero1 needs a DP group");
      flat_shards f{std::move(params), group->size(), group->rank()};
      return std::unique_ptr<training_strategy>(new zero1_strategy(std::move(f), optim, *group));
    }
    case dp_strategy::zero2:
    case dp_strategy::zero3:
      break;
    }
    return make_error(errc::unsupported,
                      "training_strategy: " + std::string{to_string(options.kind)} +
                          " is not available yet");
  });
}

} // namespace troupe::actors::train
