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

// The model's parameters moved into one flat buffer padded to a multiple of
// the DP size (each parameter becomes a view of its range), their gradients
// views of a flat buffer of the same layout, and this rank's shard.
struct flat_shards {
  std::vector<at::Tensor> params;
  std::vector<int64_t> offsets; // of each parameter in the flat buffers
  int64_t total = 0;            // elements without the padding
  at::Tensor flat;              // [padded]
  at::Tensor grads;             // [padded], or undefined while released
  int64_t shard = 0;            // elements a rank
  int rank = 0;

  flat_shards(std::vector<at::Tensor> ps, int world, int r) : params(std::move(ps)), rank(r) {
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

  // Zeroed gradients, each parameter's .grad a view of `grads`: backward
  // accumulates into them in place (a parameter backward does not reach
  // keeps a zero gradient, as the DP reducer gives it).
  void zero_grads() {
    if (!grads.defined())
      grads = at::zeros_like(flat);
    else
      grads.zero_();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].mutable_grad() =
          grads.narrow(0, offsets[i], params[i].numel()).view(params[i].sizes());
  }

  int64_t release_grads() {
    int64_t bytes =
        grads.defined() ? grads.numel() * static_cast<int64_t>(grads.element_size()) : 0;
    for (auto& p : params)
      p.mutable_grad() = at::Tensor();
    grads = at::Tensor();
    return bytes;
  }
};

// NOTE [flat AdamW]: AdamW over one flat tensor (a rank's shard, or the
// whole model), in torch::optim::AdamW's arithmetic: decoupled decay p ←
// p (1 − lr·wd), m ← β1 m + (1 − β1) g, v ← β2 v + (1 − β2) g², p ← p −
// lr / (1 − β1^t) · m / (sqrt(v) / sqrt(1 − β2^t) + eps). Element-wise, so
// a step of the shards is a step of the whole; its state is two tensors
// laid out like the flat parameters and one step count, which any DP size
// or strategy can cut into its own shards (NOTE [training strategies]).
struct flat_adam {
  optimizer_options o;
  at::Tensor m, v; // undefined before the first step and while offloaded
  int64_t t = 0;

  void step(at::Tensor p, const at::Tensor& g, double lr) {
    torch::NoGradGuard no_grad;
    if (!m.defined()) {
      m = at::zeros_like(p);
      v = at::zeros_like(p);
    }
    if (o.weight_decay != 0)
      p.mul_(1 - lr * o.weight_decay);
    ++t;
    const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(t));
    m.mul_(o.beta1).add_(g, 1 - o.beta1);
    v.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
    auto denom = (v.sqrt() / std::sqrt(bc2)).add_(o.eps);
    p.addcdiv_(m, denom, -lr / bc1);
  }

  int64_t bytes() const {
    return m.defined() ? 2 * m.numel() * static_cast<int64_t>(m.element_size()) : 0;
  }
};

// What the strategies share: the flat parameters and gradients, the AdamW
// of this rank's shard, its state in files and archives, the clip.
class flat_strategy : public training_strategy {
public:
  void zero_grad() override { f_.zero_grads(); }

  expected<double> clip_gradients(double max_norm) override {
    auto sq = guarded("the gradient norm",
                      [&] { return shard_grad().to(at::kDouble).pow(2).sum().reshape({1}); });
    if (!sq)
      return sq.error();
    if (group_)
      if (auto ok = group_->all_reduce_sum(*sq); !ok)
        return with_prefix(ok.error(), "summing the gradient norm over the group");
    const double norm = std::sqrt(sq->item<double>());
    if (const double c = clip_coefficient(norm, max_norm); c < 1.0)
      shard_grad().mul_(c);
    return norm;
  }

  int64_t optimizer_bytes() const override { return adam_.bytes(); }

  expected<int64_t> release(const std::string& path) override {
    return guarded("offloading the optimizer state", [&]() -> expected<int64_t> {
      int64_t bytes = adam_.bytes();
      if (bytes > 0) {
        torch::serialize::OutputArchive a;
        a.write("exp_avg", adam_.m);
        a.write("exp_avg_sq", adam_.v);
        a.save_to(path);
        adam_.m = adam_.v = at::Tensor();
      }
      return bytes + f_.release_grads() + release_own_grads();
    });
  }

  expected<void> reload_state(const std::string& path) override {
    return guarded("reloading the offloaded optimizer state", [&]() -> expected<void> {
      torch::serialize::InputArchive a;
      a.load_from(path);
      a.read("exp_avg", adam_.m);
      a.read("exp_avg_sq", adam_.v);
      return {};
    });
  }

  // The whole model's moments, unpadded, in parameter order (the ranks'
  // shards gathered), and the step count.
  expected<void> save_state(torch::serialize::OutputArchive& archive) const override {
    archive.write("optimizer/step", torch::tensor(adam_.t, torch::kLong));
    if (!adam_.m.defined())
      return {};
    for (const auto& [name, moment] : {std::pair{"exp_avg", adam_.m}, {"exp_avg_sq", adam_.v}}) {
      auto whole = gather(moment);
      if (!whole)
        return with_prefix(whole.error(), std::string{"gathering "} + name);
      archive.write(std::string{"optimizer/"} + name, whole->narrow(0, 0, f_.total));
    }
    return {};
  }

  expected<void> load_state(torch::serialize::InputArchive& archive) override {
    return guarded("loading the optimizer state", [&]() -> expected<void> {
      at::Tensor step, m, v;
      if (!archive.try_read("optimizer/step", step))
        return make_error(errc::corrupted, "load_state: the state has no optimizer");
      const bool moments = archive.try_read("optimizer/exp_avg", m);
      if (moments != archive.try_read("optimizer/exp_avg_sq", v) ||
          (moments && (m.numel() != f_.total || v.numel() != f_.total ||
                       m.scalar_type() != f_.flat.scalar_type())))
        return make_error(errc::shape_mismatch,
                          "load_state: the optimizer moments do not fit this model (" +
                              std::to_string(m.defined() ? m.numel() : 0) + " elements for " +
                              std::to_string(f_.total) + ")");
      adam_.t = step.item<int64_t>();
      if (!moments) {
        adam_.m = adam_.v = at::Tensor();
        return {};
      }
      adam_.m = my_shard(m);
      adam_.v = my_shard(v);
      return {};
    });
  }

protected:
  flat_strategy(flat_shards f, const optimizer_options& o, runtime::process_group* group)
      : f_(std::move(f)), group_(group) {
    adam_.o = o;
  }

  // What this rank steps: its shard of the flat gradient after the sync.
  virtual at::Tensor& shard_grad() = 0;
  virtual int64_t release_own_grads() { return 0; }
  // The whole flat tensor of which `part` is this rank's shard.
  virtual expected<at::Tensor> gather(const at::Tensor& part) const = 0;

  // This rank's shard of an unpadded whole, padded with zeros.
  at::Tensor my_shard(const at::Tensor& whole) const {
    auto padded = at::zeros_like(f_.flat);
    padded.narrow(0, 0, f_.total).copy_(whole.reshape({-1}));
    return f_.mine(padded).clone();
  }

  flat_shards f_;
  runtime::process_group* group_;
  flat_adam adam_;
};

// ---- ddp ---------------------------------------------------------------------------

class ddp_strategy final : public flat_strategy {
public:
  // The norm needs no sum over the group: every rank holds all of it.
  ddp_strategy(flat_shards f, const optimizer_options& o,
               std::optional<runtime::gradient_reducer> reducer)
      : flat_strategy(std::move(f), o, nullptr), reducer_(std::move(reducer)) {}

  dp_strategy kind() const override { return dp_strategy::ddp; }

  expected<void> sync_gradients() override {
    return reducer_ ? reducer_->all_reduce(1.0) : expected<void>{};
  }

  expected<void> step(double lr) override {
    return guarded("optimizer step", [&] { adam_.step(f_.flat, f_.grads, lr); });
  }

private:
  at::Tensor& shard_grad() override { return f_.grads; }
  expected<at::Tensor> gather(const at::Tensor& part) const override { return part; }

  std::optional<runtime::gradient_reducer> reducer_;
};

// ---- zero1 -------------------------------------------------------------------------

class zero1_strategy final : public flat_strategy {
public:
  zero1_strategy(flat_shards f, const optimizer_options& o, runtime::process_group& group)
      : flat_strategy(std::move(f), o, &group) {}

  dp_strategy kind() const override { return dp_strategy::zero1; }

  expected<void> sync_gradients() override {
    if (!grad_shard_.defined())
      grad_shard_ = at::zeros({f_.shard}, f_.flat.options());
    if (auto ok = group_->reduce_scatter(f_.grads, grad_shard_, runtime::reduce_op::sum); !ok)
      return with_prefix(ok.error(), "zero1: reduce-scattering the gradients");
    return {};
  }

  expected<void> step(double lr) override {
    auto stepped = guarded("zero1: optimizer step", [&] {
      adam_.step(f_.mine(f_.flat), grad_shard_, lr);
      return f_.mine(f_.flat).clone();
    });
    if (!stepped)
      return stepped.error();
    if (auto ok = group_->all_gather(*stepped, f_.flat); !ok)
      return with_prefix(ok.error(), "zero1: all-gathering the parameters");
    return {};
  }

private:
  at::Tensor& shard_grad() override { return grad_shard_; }
  int64_t release_own_grads() override {
    int64_t bytes = grad_shard_.defined()
                        ? grad_shard_.numel() * static_cast<int64_t>(grad_shard_.element_size())
                        : 0;
    grad_shard_ = at::Tensor();
    return bytes;
  }
  expected<at::Tensor> gather(const at::Tensor& part) const override {
    auto whole = at::empty_like(f_.flat);
    if (auto ok = group_->all_gather(part, whole); !ok)
      return ok.error();
    return whole;
  }

  at::Tensor grad_shard_; // the reduce-scattered sum of this rank's shard
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
      flat_shards f{std::move(params), 1, 0};
      return std::unique_ptr<training_strategy>(
          new ddp_strategy(std::move(f), optim, std::move(reducer)));
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
