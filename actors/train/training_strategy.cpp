#include "actors/train/training_strategy.hpp"

#include "actors/train/strategy_parts.hpp"

#include "runtime/collectives.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <cmath>

namespace troupe::actors::train {

training_strategy::~training_strategy() = default;

namespace {

using detail::flat_adam;

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

// What the strategies share: the flat parameters and gradients, the AdamW
// of this rank's shard, its state in files and archives, the clip.
class flat_strategy : public training_strategy {
public:
  void zero_grad() override { f_.zero_grads(); }

  expected<double> clip_gradients(double max_norm) override {
    return detail::clip_by_global_norm(shard_grad(), group_, max_norm, tp_norm());
  }

  // Under TP / PP, the model's lines (NOTE [tensor-parallel norm]).
  void set_lines(model_lines lines) { lines_ = std::move(lines); }

  int64_t optimizer_bytes() const override { return adam_.bytes(); }

  std::vector<std::vector<size_t>> export_units() const override {
    std::vector<size_t> all(f_.params.size());
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = i;
    return {all};
  }

  expected<int64_t> release(const std::string& path) override {
    return guarded("offloading the optimizer state", [&]() -> expected<int64_t> {
      return adam_.offload(path) + f_.release_grads() + release_own_grads();
    });
  }

  expected<void> reload_state(const std::string& path) override {
    return guarded("reloading the offloaded optimizer state", [&] { adam_.reload(path); });
  }

  // The whole model's moments (and fp32 master weights: NOTE [mixed
  // precision]), unpadded, in parameter order (the ranks' shards gathered),
  // and the step count.
  expected<void> save_state(torch::serialize::OutputArchive& archive) const override {
    auto state = named_state();
    if (!state)
      return state.error();
    for (const auto& [key, t] : *state)
      archive.write(key, t);
    return {};
  }

  expected<std::vector<std::pair<std::string, at::Tensor>>> whole_state() const override {
    if (!holds_whole_state())
      return training_strategy::whole_state();
    return named_state(); // the gather is the identity
  }

  // What save_state writes, by key (the ranks' shards gathered).
  expected<std::vector<std::pair<std::string, at::Tensor>>> named_state() const {
    std::vector<std::pair<std::string, at::Tensor>> out{
        {"optimizer/step", torch::tensor(adam_.t, torch::kLong)}};
    for (const auto& [name, part] :
         {std::pair{"exp_avg", adam_.m}, {"exp_avg_sq", adam_.v}, {"master", adam_.master}}) {
      if (!part.defined())
        continue;
      auto all = gather(part);
      if (!all)
        return with_prefix(all.error(), std::string{"gathering "} + name);
      out.emplace_back(std::string{"optimizer/"} + name, all->narrow(0, 0, f_.total));
    }
    return out;
  }

  expected<void> load_state(torch::serialize::InputArchive& archive) override {
    return guarded("loading the optimizer state", [&]() -> expected<void> {
      auto state = adam_.read_state(archive, f_.total, f_.flat.scalar_type());
      if (!state)
        return state.error();
      adam_.m = my_part(state->exp_avg);
      adam_.v = my_part(state->exp_avg_sq);
      adam_.master = my_part(state->master);
      return {};
    });
  }

  // NOTE [sharded state]: the r-th 1/N of the canonical layout, which the
  // flat buffer is (padding past its end).
  expected<shard> state_shard() const override {
    return guarded("the state's shard", [&] {
      const auto [rank, world] = position();
      const int64_t per = (f_.total + world - 1) / world;
      const int64_t lo = std::min(f_.total, rank * per), hi = std::min(f_.total, lo + per);
      shard out;
      out.step = adam_.t;
      out.total = f_.total;
      if (hi > lo)
        out.segments = {lo, hi - lo};
      out.params = f_.flat.narrow(0, lo, hi - lo).clone();
      // AdamW's tensors are whole (ddp) or this rank's shard of the padded layout.
      auto cut = [&](const at::Tensor& x) {
        if (!x.defined())
          return at::Tensor();
        return x.narrow(0, x.numel() == f_.flat.numel() ? lo : 0, hi - lo).clone();
      };
      out.exp_avg = cut(adam_.m);
      out.exp_avg_sq = cut(adam_.v);
      out.master = cut(adam_.master);
      return out;
    });
  }

protected:
  // This rank and the group's size (ddp: 0 and 1 without a group).
  virtual std::pair<int64_t, int64_t> position() const = 0;
  // Where shard_grad() starts in the flat layout.
  virtual int64_t shard_offset() const = 0;

  detail::tp_norm tp_norm() {
    auto out = detail::tp_norm::of(lines_);
    const int64_t lo = shard_offset(), hi = lo + shard_grad().numel();
    for (size_t i = 0; i < f_.params.size(); ++i)
      out.add(lines_, i, 0, lo, hi, f_.offsets[i], f_.params[i].numel());
    return out;
  }

  flat_strategy(flat_shards f, const optimizer_options& o, runtime::process_group* group)
      : f_(std::move(f)), group_(group) {
    adam_.o = o;
  }

  // What this rank steps: its shard of the flat gradient after the sync.
  virtual at::Tensor& shard_grad() = 0;
  virtual int64_t release_own_grads() { return 0; }
  // The whole flat tensor of which `part` is this rank's shard.
  virtual expected<at::Tensor> gather(const at::Tensor& part) const = 0;
  /// This rank's AdamW holds the whole model's state (gather is the identity).
  virtual bool holds_whole_state() const { return false; }

  // What this rank keeps of an unpadded whole (undefined: none): its
  // shard, padded with zeros — the whole for ddp, whose shard it is.
  at::Tensor my_part(const at::Tensor& whole) const {
    if (!whole.defined())
      return {};
    auto padded = at::zeros({f_.flat.numel()}, whole.options());
    padded.narrow(0, 0, f_.total).copy_(whole.reshape({-1}));
    return f_.mine(padded).clone();
  }

  flat_shards f_;
  runtime::process_group* group_;
  flat_adam adam_;
  model_lines lines_;
};

// ---- ddp ---------------------------------------------------------------------------

class ddp_strategy final : public flat_strategy {
public:
  // The norm needs no sum over the group (flat_strategy's group stays
  // null): every rank holds all of it.
  ddp_strategy(flat_shards f, const optimizer_options& o, runtime::process_group* group,
               int64_t bucket_bytes)
      : flat_strategy(std::move(f), o, nullptr), dp_group_(group),
        bucket_(std::max<int64_t>(1, bucket_bytes / f_.flat.element_size())) {}

  dp_strategy kind() const override { return dp_strategy::ddp; }

  // NOTE [ddp buckets]: the gradients already lie in one flat buffer, so
  // they are summed in place, `bucket_mb` of it per all-reduce from the
  // back (the last parameters', which backward finishes first) — one
  // collective per bucket and no second copy of the gradients.
  expected<void> sync_gradients() override {
    if (!dp_group_ || !f_.grads.defined())
      return {};
    const int64_t n = f_.grads.numel();
    for (int64_t end = n, b = 0; end > 0; end -= bucket_, ++b) {
      const int64_t begin = std::max<int64_t>(0, end - bucket_);
      auto slice = f_.grads.narrow(0, begin, end - begin);
      if (auto ok = dp_group_->all_reduce_sum(slice); !ok)
        return with_prefix(ok.error(), "ddp: all-reducing gradient bucket " + std::to_string(b));
    }
    return {};
  }

  expected<void> step(double lr) override {
    return guarded("optimizer step", [&] { adam_.step(f_.flat, f_.grads, lr); });
  }

private:
  at::Tensor& shard_grad() override { return f_.grads; }
  int64_t shard_offset() const override { return 0; }
  expected<at::Tensor> gather(const at::Tensor& part) const override { return part; }
  bool holds_whole_state() const override { return true; }
  std::pair<int64_t, int64_t> position() const override {
    return dp_group_ ? std::pair<int64_t, int64_t>{dp_group_->rank(), dp_group_->size()}
                     : std::pair<int64_t, int64_t>{0, 1};
  }

  runtime::process_group* dp_group_;
  int64_t bucket_; // elements
};

// ---- zero1 and zero2 ---------------------------------------------------------------

// What zero1 and zero2 share: the gradients' sum for this rank's shard
// (however it gets there), the step of the shard and the all-gather of the
// parameters.
class sharded_strategy : public flat_strategy {
public:
  expected<void> step(double lr) override {
    auto stepped = guarded(name() + ": optimizer step", [&] {
      adam_.step(f_.mine(f_.flat), grad_shard_, lr);
      return f_.mine(f_.flat).clone();
    });
    if (!stepped)
      return stepped.error();
    if (auto ok = group_->all_gather(*stepped, f_.flat); !ok)
      return with_prefix(ok.error(), name() + ": all-gathering the parameters");
    return {};
  }

protected:
  sharded_strategy(flat_shards f, const optimizer_options& o, runtime::process_group& group)
      : flat_strategy(std::move(f), o, &group) {}

  std::pair<int64_t, int64_t> position() const override { return {f_.rank, group_->size()}; }

  std::string name() const { return std::string{to_string(kind())}; }

  // The shard's gradient sum, zeroed.
  at::Tensor& zeroed_grad_shard() {
    if (!grad_shard_.defined())
      grad_shard_ = at::zeros({f_.shard}, f_.flat.options());
    else
      grad_shard_.zero_();
    return grad_shard_;
  }

  at::Tensor grad_shard_; // the summed gradient of this rank's shard

private:
  at::Tensor& shard_grad() override { return grad_shard_; }
  int64_t shard_offset() const override { return f_.rank * f_.shard; }
  int64_t release_own_grads() override {
    int64_t bytes = grad_shard_.defined()
                        ? grad_shard_.numel() * static_cast<int64_t>(grad_shard_.element_size())
                        : 0;
    grad_shard_ = at::Tensor();
    return bytes;
  }
  expected<at::Tensor> gather(const at::Tensor& part) const override {
    auto whole = at::empty({f_.flat.numel()}, part.options());
    if (auto ok = group_->all_gather(part, whole); !ok)
      return ok.error();
    return whole;
  }
};

class zero1_strategy final : public sharded_strategy {
public:
  zero1_strategy(flat_shards f, const optimizer_options& o, runtime::process_group& group)
      : sharded_strategy(std::move(f), o, group) {}

  dp_strategy kind() const override { return dp_strategy::zero1; }

  expected<void> sync_gradients() override {
    if (auto ok = group_->reduce_scatter(f_.grads, zeroed_grad_shard(), runtime::reduce_op::sum);
        !ok)
      return with_prefix(ok.error(), "zero1: reduce-scattering the gradients");
    return {};
  }
};

// NOTE [zero2 buckets]: zero2 never holds the whole gradient. The flat
// layout is cut into buckets of whole parameters (at most bucket_mb, a
// larger parameter alone), in reverse order — the order backward produces
// them; bucket 0 also holds the padding. A hook on each parameter adds its
// gradient into its bucket's buffer (made when the bucket's first gradient
// arrives) and hands the tensor on to LibTorch, whose .grad the next hook
// drops. A bucket whose parameters have all arrived is reduced, each
// rank's part of it sent straight to that rank (reduce_to_owner), which
// adds the sum into its shard's, and freed — strictly in bucket order, so
// every rank issues the same collectives in the same order even when a
// parameter gets no gradient on one of them: whatever is left is reduced
// at backward_done, after every
// backward (a rank with fewer micro-batches runs its last again at weight
// 0: NOTE [micro-batches] in train_engine.cpp).
// Peak gradient memory: the shard's sum, the buckets waiting their turn,
// one parameter's gradient.
class zero2_strategy final : public sharded_strategy {
public:
  zero2_strategy(flat_shards f, const optimizer_options& o, runtime::process_group& group,
                 int64_t bucket_bytes)
      : sharded_strategy(std::move(f), o, group) {
    make_buckets(bucket_bytes);
    for (size_t i = 0; i < f_.params.size(); ++i)
      hooks_.push_back(f_.params[i].register_hook([this, i](const at::Tensor& g) {
        arrived(i, g);
        return at::Tensor(); // LibTorch keeps g as .grad; the next hook drops it
      }));
  }
  ~zero2_strategy() override {
    for (size_t i = 0; i < hooks_.size(); ++i)
      f_.params[i].remove_hook(hooks_[i]);
  }

  dp_strategy kind() const override { return dp_strategy::zero2; }
  bool reduces_in_backward() const override { return true; }

  void zero_grad() override {
    drop_param_grads();
    zeroed_grad_shard();
    for (auto& b : buckets_) {
      b.buffer = at::Tensor();
      b.arrived = 0;
    }
    next_ = 0;
    armed_ = true;
    failed_.reset();
  }

  expected<void> backward_done() override {
    if (!armed_)
      return make_error(errc::invalid_argument, "zero2: backward_done before zero_grad");
    drop_param_grads();
    auto ok = guarded("zero2: reducing the gradients", [&]() -> expected<void> {
      for (; next_ < buckets_.size(); ++next_)
        if (auto reduced = reduce_bucket(buckets_[next_]); !reduced)
          return reduced;
      return {};
    });
    for (auto& b : buckets_) {
      b.buffer = at::Tensor();
      b.arrived = 0;
    }
    next_ = 0;
    return ok;
  }

  expected<void> sync_gradients() override {
    armed_ = false;
    if (failed_)
      return *failed_;
    return {};
  }

private:
  struct bucket {
    int64_t begin = 0, end = 0; // of the flat layout
    size_t params = 0;          // how many parameters it holds
    size_t arrived = 0;         // of them, in this backward
    at::Tensor buffer;          // [end - begin] while gradients arrive
  };

  void make_buckets(int64_t bucket_bytes) {
    const int64_t per = std::max<int64_t>(1, bucket_bytes / f_.flat.element_size());
    bucket_of_.resize(f_.params.size());
    const int64_t padded = f_.flat.numel();
    for (size_t k = f_.params.size(); k-- > 0;) {
      const int64_t begin = f_.offsets[k];
      const int64_t end = k + 1 < f_.params.size() ? f_.offsets[k + 1] : padded;
      if (buckets_.empty() || (buckets_.back().end - begin > per && buckets_.back().params > 0))
        buckets_.push_back({begin, end, 0, 0, {}});
      auto& b = buckets_.back();
      b.begin = begin;
      ++b.params;
      bucket_of_[k] = buckets_.size() - 1;
    }
  }

  // Parameter i's gradient of this backward, into its bucket; then the
  // buckets whose turn it is.
  void arrived(size_t i, const at::Tensor& g) {
    if (!armed_)
      return;
    drop_param_grads();
    auto& b = buckets_[bucket_of_[i]];
    torch::NoGradGuard no_grad;
    if (!b.buffer.defined())
      b.buffer = at::zeros({b.end - b.begin}, f_.flat.options());
    b.buffer.narrow(0, f_.offsets[i] - b.begin, f_.params[i].numel()).add_(g.reshape({-1}));
    ++b.arrived;
    consumed_.push_back(i);
    for (; next_ < buckets_.size() && buckets_[next_].arrived == buckets_[next_].params; ++next_) {
      auto ok = reduce_bucket(buckets_[next_]);
      if (!ok) {
        failed_ = ok.error();
        throw std::runtime_error(describe(ok.error()));
      }
    }
  }

  // Each rank's part of the bucket summed into that rank; this rank's part
  // added into its shard's sum.
  expected<void> reduce_bucket(bucket& b) {
    torch::NoGradGuard no_grad;
    auto buffer = b.buffer.defined() ? b.buffer : at::zeros({b.end - b.begin}, f_.flat.options());
    for (int r = static_cast<int>(b.begin / f_.shard); r * f_.shard < b.end; ++r) {
      const int64_t lo = std::max(b.begin, r * f_.shard), hi = std::min(b.end, (r + 1) * f_.shard);
      auto part = buffer.narrow(0, lo - b.begin, hi - lo);
      if (auto ok = reduce_to_owner(part, r); !ok)
        return with_prefix(ok.error(),
                           "zero2: reducing a gradient bucket to rank " + std::to_string(r));
      if (r == f_.rank)
        grad_shard_.narrow(0, lo - r * f_.shard, hi - lo).add_(part);
    }
    b.buffer = at::Tensor();
    return {};
  }

  // `part` summed over the group into rank `owner`: the others send theirs
  // straight to it, which adds them in rank order — each rank receives
  // (N-1)/N of the gradients over a step, a reduce-scatter's volume (gloo's
  // reduce received 1.13-1.65x that: docs/benchmarks.md).
  expected<void> reduce_to_owner(at::Tensor& part, int owner) {
    constexpr int tag = 29;
    if (f_.rank != owner)
      return group_->send(part, owner, tag);
    auto incoming = at::empty_like(part);
    for (int q = 0; q < group_->size(); ++q) {
      if (q == owner)
        continue;
      if (auto ok = group_->recv(incoming, q, tag); !ok)
        return ok;
      part.add_(incoming);
    }
    return {};
  }

  // The .grad LibTorch kept of each gradient already in a bucket.
  void drop_param_grads() {
    for (auto i : consumed_)
      f_.params[i].mutable_grad() = at::Tensor();
    consumed_.clear();
  }

  std::vector<bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<unsigned> hooks_;
  std::vector<size_t> consumed_;
  size_t next_ = 0; // the next bucket to reduce
  bool armed_ = false;
  std::optional<caf::error> failed_;
};

} // namespace

expected<std::unique_ptr<training_strategy>>
training_strategy::make(std::vector<at::Tensor> params, const optimizer_options& optim,
                        runtime::process_group* group, const strategy_options& options,
                        std::vector<std::vector<size_t>> layers) {
  if (params.empty())
    return make_error(errc::invalid_argument, "training_strategy: no parameters");
  for (const auto& p : params)
    if (p.scalar_type() != params.front().scalar_type() || p.device() != params.front().device() ||
        !p.is_floating_point())
      return make_error(errc::unsupported,
                        "training_strategy: the parameters must share one floating dtype and "
                        "one device");
  const auto& lines = options.lines;
  if ((lines.tp && lines.tp_replicated.size() != params.size()) ||
      (!lines.pp_elsewhere.empty() && lines.pp_elsewhere.size() != params.size()))
    return make_error(errc::invalid_argument,
                      "training_strategy: " + std::to_string(lines.tp_replicated.size()) +
                          " tensor-parallel and " + std::to_string(lines.pp_elsewhere.size()) +
                          " pipeline flags for " + std::to_string(params.size()) + " parameters");
  if (options.kind == dp_strategy::zero3) {
    if (!group)
      return make_error(errc::invalid_argument, "training_strategy: zero3 needs a DP group");
    return detail::make_zero3_strategy(std::move(params), std::move(layers), optim, *group, lines);
  }
  if (options.kind != dp_strategy::ddp && !group)
    return make_error(errc::invalid_argument,
                      "training_strategy: " + std::string{to_string(options.kind)} +
                          " needs a DP group");
  return guarded("training_strategy", [&]() -> expected<std::unique_ptr<training_strategy>> {
    const auto bucket = static_cast<int64_t>(options.bucket_mb * 1024 * 1024);
    std::unique_ptr<flat_strategy> s;
    if (options.kind == dp_strategy::ddp)
      s.reset(new ddp_strategy(flat_shards{std::move(params), 1, 0}, optim, group, bucket));
    else if (options.kind == dp_strategy::zero1)
      s.reset(new zero1_strategy(flat_shards{std::move(params), group->size(), group->rank()},
                                 optim, *group));
    else if (options.kind == dp_strategy::zero2)
      s.reset(new zero2_strategy(flat_shards{std::move(params), group->size(), group->rank()},
                                 optim, *group, bucket));
    else
      return make_error(errc::unsupported, "training_strategy: unknown strategy");
    s->set_lines(lines);
    return std::unique_ptr<training_strategy>(std::move(s));
  });
}

} // namespace troupe::actors::train
