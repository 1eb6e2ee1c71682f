#include "models/tensor_parallel.hpp"

#include "runtime/collectives.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

namespace troupe::models {

expected<tp_partition> partition_llama(const llama_config& c, runtime::process_group& group) {
  auto p = partition_llama(c, group.rank(), group.size());
  if (p && p->size > 1)
    p->group = &group;
  return p;
}

namespace {

bool has(const std::string& name, const char* part) {
  return name.find(part) != std::string::npos;
}
bool ends_with(const std::string& name, const std::string& tail) {
  return name.size() >= tail.size() &&
         name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

} // namespace

tp_slice tp_slice_of(const std::string& name, const llama_config& c, const tp_partition& p) {
  if (!p.active())
    return {};
  const int64_t hd = c.resolved_head_dim();
  const bool weight = ends_with(name, ".weight");
  if (name == "tok_embeddings.weight" || name == "output.weight")
    return {0, p.vocab0, p.vocab0 + p.vocab};
  if (has(name, ".attention.wq."))
    return {0, p.head0 * hd, (p.head0 + p.heads) * hd};
  if (has(name, ".attention.wk.") || has(name, ".attention.wv."))
    return p.kv_split ? tp_slice{0, p.kv0 * hd, (p.kv0 + p.kv_heads) * hd} : tp_slice{};
  if (has(name, ".attention.wo.") && weight)
    return {1, p.head0 * hd, (p.head0 + p.heads) * hd};
  if (has(name, ".feed_forward.w1.") || has(name, ".feed_forward.w3."))
    return {0, p.inter0, p.inter0 + p.intermediate};
  if (has(name, ".feed_forward.w2.") && weight)
    return {1, p.inter0, p.inter0 + p.intermediate};
  return {};
}

namespace {

// The sizes of every rank's part of parameter `name` along its split.
std::vector<int64_t> part_sizes(const std::string& name, const llama_config& c, int size) {
  std::vector<int64_t> sizes;
  for (int r = 0; r < size; ++r) {
    auto q = partition_llama(c, r, size);
    auto s = q ? tp_slice_of(name, c, *q) : tp_slice{};
    sizes.push_back(s.end - s.begin);
  }
  return sizes;
}

} // namespace

std::vector<int64_t> tp_full_shape(const std::string& name, std::vector<int64_t> part,
                                   const llama_config& c, const tp_partition& p) {
  auto s = tp_slice_of(name, c, p);
  if (!s.replicated() && s.dim < static_cast<int>(part.size())) {
    int64_t total = 0;
    for (auto n : part_sizes(name, c, p.size))
      total += n;
    part[static_cast<size_t>(s.dim)] = total;
  }
  return part;
}

expected<std::map<std::string, at::Tensor>>
tp_shard_weights(const std::map<std::string, at::Tensor>& full, const llama_config& c,
                 const tp_partition& p) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : full) {
    auto s = tp_slice_of(name, c, p);
    if (s.replicated()) {
      out[name] = t;
      continue;
    }
    if (s.dim >= t.dim() || s.end > t.size(s.dim))
      return make_error(errc::shape_mismatch,
                        "tp_shard_weights: " + name + " cannot hold its part [" +
                            std::to_string(s.begin) + ", " + std::to_string(s.end) +
                            ") along dimension " + std::to_string(s.dim));
    out[name] = t.narrow(s.dim, s.begin, s.end - s.begin);
  }
  return out;
}

namespace {

// The ranks' `part`s (equal but for `dim`, whose sizes are `sizes`) joined
// along `dim` in rank order. Each rank's part goes out as it lies (padded
// along `dim` to the widest only when the sizes differ), so the gathered
// buffer is [ranks, part...]: joined along the first dimension it already
// is the whole tensor (a view, nothing copied); along another, one copy
// moves the ranks' axis next to `dim`. What it holds at once: the whole
// gathered and, joining along another dimension or unequal parts, the
// whole joined (NOTE [sync staging]: the export's spike).
at::Tensor gather_along(const at::Tensor& part, int64_t dim, const std::vector<int64_t>& sizes,
                        runtime::process_group& group) {
  const int64_t widest = *std::max_element(sizes.begin(), sizes.end());
  const bool equal =
      std::all_of(sizes.begin(), sizes.end(), [&](int64_t n) { return n == widest; });
  auto send = part.contiguous();
  if (!equal) {
    auto shape = send.sizes().vec();
    shape[static_cast<size_t>(dim)] = widest;
    auto padded = torch::zeros(shape, part.options());
    padded.narrow(dim, 0, send.size(dim)).copy_(send);
    send = std::move(padded);
  }
  const auto ranks = static_cast<int64_t>(sizes.size());
  auto all = torch::empty({ranks * send.numel()}, part.options());
  value_or_throw(group.all_gather(send.reshape({-1}), all));
  auto shape = send.sizes().vec();
  shape.insert(shape.begin(), ranks);
  auto stacked = all.view(shape); // [ranks, part...]
  if (equal) {
    auto whole = send.sizes().vec();
    whole[static_cast<size_t>(dim)] *= ranks;
    return stacked.movedim(0, dim).reshape(whole); // a view when dim is 0
  }
  std::vector<at::Tensor> pieces;
  for (int64_t r = 0; r < ranks; ++r)
    pieces.push_back(stacked[r].narrow(dim, 0, sizes[static_cast<size_t>(r)]));
  return torch::cat(pieces, dim);
}

} // namespace

expected<at::Tensor> tp_gather_weight(const at::Tensor& part, const std::string& name,
                                      const llama_config& c, const tp_partition& p) {
  auto s = tp_slice_of(name, c, p);
  if (s.replicated())
    return part;
  const auto sizes = part_sizes(name, c, p.size);
  if (part.dim() <= s.dim || part.size(s.dim) != s.end - s.begin)
    return make_error(errc::shape_mismatch,
                      "tp_gather_weight: " + name + " part has " +
                          std::to_string(part.dim() > s.dim ? part.size(s.dim) : 0) +
                          " along dimension " + std::to_string(s.dim) + ", expected " +
                          std::to_string(s.end - s.begin));
  return guarded("tp_gather_weight", [&] {
    torch::NoGradGuard no_grad;
    return gather_along(part.detach().contiguous(), s.dim, sizes, *p.group);
  });
}

int64_t tp_gather_peak_bytes(const std::string& name, const llama_config& c, const tp_partition& p,
                             int64_t whole_bytes) {
  const auto slice = tp_slice_of(name, c, p);
  if (slice.replicated())
    return 0;
  // As gather_along holds them.
  const auto sizes = part_sizes(name, c, p.size);
  const int64_t widest = *std::max_element(sizes.begin(), sizes.end());
  int64_t along = 0;
  for (auto n : sizes)
    along += n;
  const bool equal = widest * static_cast<int64_t>(sizes.size()) == along;
  if (equal)
    return slice.dim == 0 ? whole_bytes : 2 * whole_bytes;
  const int64_t per = whole_bytes / along; // bytes a slice along the joined dimension
  return per * widest + per * widest * static_cast<int64_t>(sizes.size()) + whole_bytes;
}

// ---- f, g and the gather (autograd nodes) --------------------------------------

namespace {

struct group_holder : torch::CustomClassHolder {
  explicit group_holder(const tp_partition& part) : p(part) {}
  tp_partition p;
};

c10::intrusive_ptr<group_holder> hold(const tp_partition& p) {
  return c10::make_intrusive<group_holder>(p);
}
const tp_partition& held(torch::autograd::AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<group_holder>(ctx->saved_data["tp"].toCapsule())->p;
}

at::Tensor all_reduced(const at::Tensor& x, const tp_partition& p) {
  auto out = x.contiguous().clone();
  value_or_throw(p.group->all_reduce_sum(out));
  return out;
}

struct copy_fn : torch::autograd::Function<copy_fn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<group_holder> p) {
    ctx->saved_data["tp"] = c10::IValue::make_capsule(std::move(p));
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {all_reduced(grads[0], held(ctx)), at::Tensor{}};
  }
};

struct reduce_fn : torch::autograd::Function<reduce_fn> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x,
                            c10::intrusive_ptr<group_holder> p) {
    return all_reduced(x, p->p);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor{}};
  }
};

struct gather_last_fn : torch::autograd::Function<gather_last_fn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t total, c10::intrusive_ptr<group_holder> p) {
    std::vector<int64_t> sizes;
    for (int r = 0; r < p->p.size; ++r) {
      auto [b, e] = tp_range(total, r, p->p.size);
      sizes.push_back(e - b);
    }
    auto [begin, end] = tp_range(total, p->p.rank, p->p.size);
    ctx->saved_data["begin"] = begin;
    ctx->saved_data["width"] = end - begin;
    return gather_along(x.contiguous(), x.dim() - 1, sizes, *p->p.group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto g =
        grads[0].narrow(-1, ctx->saved_data["begin"].toInt(), ctx->saved_data["width"].toInt());
    return {g, at::Tensor{}, at::Tensor{}};
  }
};

} // namespace

at::Tensor tp_copy(const at::Tensor& x, const tp_partition& p) {
  return p.active() ? copy_fn::apply(x, hold(p)) : x;
}

at::Tensor tp_reduce(const at::Tensor& x, const tp_partition& p) {
  return p.active() ? reduce_fn::apply(x, hold(p)) : x;
}

at::Tensor tp_gather_last(const at::Tensor& x, int64_t total, const tp_partition& p) {
  return p.active() ? gather_last_fn::apply(x, total, hold(p)) : x;
}

} // namespace troupe::models
