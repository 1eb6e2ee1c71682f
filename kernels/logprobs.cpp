#include "kernels/logprobs.hpp"

#include "kernels/detail.hpp"
#include "runtime/collectives.hpp"
#include "runtime/torch_guard.hpp"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace troupe::kernels {

// NOTE [chunked logsumexp]
// Each row keeps a running max m, a running Σ exp(x − m) = s and, for the
// entropy, t = Σ exp(x − m)·(x − m). A chunk with max m_c moves the reference
// to m' = max(m, m_c) and rescales by α = exp(m − m'):
//   s' = α·s + Σ_c exp(x − m'),   t' = α·(t + (m − m')·s) + Σ_c exp(x − m')·(x − m').
// Then lse = m + log s and H = lse − Σ p·x = log s − t / s. The running max
// starts at the lowest finite value and entropy terms clamp x to it, so −inf
// logits (masked vocabulary) give exp(·) = 0 and never 0·inf = NaN.
// On CPU, rows are cut into tiles of about kTileElems elements per chunk so
// the temporaries stay in cache and tiles run in parallel.

namespace {

// Elements of one row tile × chunk: on CPU sized for L2, on a GPU large
// enough to fill the device while bounding the temporaries (64 MiB fp32).
constexpr int64_t kTileElems = int64_t{1} << 15;
constexpr int64_t kDeviceTileElems = int64_t{1} << 24;

struct plan {
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t chunk = 1;
  int64_t row_tile = 1;
  double inv_temp = 1.0;
  double lowest = 0.0;
  at::ScalarType type = at::kFloat;
  bool cpu = true;
};

plan make_plan(const at::Tensor& logits2d, int64_t chunk_size, double inv_temp) {
  plan p;
  p.rows = logits2d.size(0);
  p.vocab = logits2d.size(1);
  p.chunk = std::max<int64_t>(1, std::min(chunk_size, p.vocab));
  p.cpu = logits2d.device().is_cpu();
  p.row_tile = std::max<int64_t>(1, (p.cpu ? kTileElems : kDeviceTileElems) / p.chunk);
  p.inv_temp = inv_temp;
  p.type = logits2d.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  p.lowest = p.type == at::kDouble ? std::numeric_limits<double>::lowest()
                                   : static_cast<double>(std::numeric_limits<float>::lowest());
  return p;
}

// Calls f(r0, r1) for every row tile; CPU tiles run in parallel with the
// caller's thread-local state (grad mode, ...), other devices in sequence.
template <class F>
void for_row_tiles(const plan& p, F&& f) {
  auto body = [&](int64_t begin, int64_t end) {
    for (int64_t r0 = begin; r0 < end; r0 += p.row_tile)
      f(r0, std::min(end, r0 + p.row_tile));
  };
  if (!p.cpu) {
    body(0, p.rows);
    return;
  }
  at::ThreadLocalState state;
  at::parallel_for(0, p.rows, p.row_tile, [&](int64_t begin, int64_t end) {
    at::ThreadLocalStateGuard guard{state};
    body(begin, end);
  });
}

// logits2d[r0:r1, c0:c1] / τ in the compute dtype.
at::Tensor load_chunk(const at::Tensor& logits2d, const plan& p, int64_t r0, int64_t r1, int64_t c0,
                      int64_t c1) {
  auto x = logits2d.slice(0, r0, r1).slice(1, c0, c1);
  if (x.scalar_type() != p.type)
    x = x.to(p.type);
  if (p.inv_temp != 1.0)
    x = x * p.inv_temp;
  return x;
}

// Gathered logits / τ of rows r0:r1, compute dtype, [r1 − r0].
at::Tensor gather_tokens(const at::Tensor& logits2d, const at::Tensor& tokens1d, const plan& p,
                         int64_t r0, int64_t r1) {
  auto x = logits2d.slice(0, r0, r1).gather(1, tokens1d.slice(0, r0, r1).unsqueeze(1)).squeeze(1);
  x = x.to(p.type);
  return p.inv_temp != 1.0 ? x * p.inv_temp : x;
}

struct row_stats {
  at::Tensor log_probs; // [rows] or undefined
  at::Tensor entropy;   // [rows] or undefined
  at::Tensor lse;       // [rows]
};

// See NOTE [chunked logsumexp]. tokens1d may be undefined.
row_stats chunked_forward(const at::Tensor& logits2d, const at::Tensor& tokens1d, bool want_entropy,
                          const plan& p) {
  auto opts = logits2d.options().dtype(p.type);
  row_stats out;
  out.lse = at::empty({p.rows}, opts);
  if (tokens1d.defined())
    out.log_probs = at::empty({p.rows}, opts);
  if (want_entropy)
    out.entropy = at::empty({p.rows}, opts);
  for_row_tiles(p, [&](int64_t r0, int64_t r1) {
    int64_t n = r1 - r0;
    auto m = at::full({n}, p.lowest, opts);
    auto s = at::zeros({n}, opts);
    auto t = want_entropy ? at::zeros({n}, opts) : at::Tensor{};
    for (int64_t c0 = 0; c0 < p.vocab; c0 += p.chunk) {
      int64_t c1 = std::min(p.vocab, c0 + p.chunk);
      auto x = load_chunk(logits2d, p, r0, r1, c0, c1);
      auto m_new = at::maximum(m, x.amax(1));
      auto shift = m - m_new;
      auto alpha = shift.exp();
      auto d = x - m_new.unsqueeze(1);
      if (want_entropy) {
        d.clamp_min_(p.lowest);
        auto e = d.exp();
        auto s_chunk = e.sum(1);
        e.mul_(d);
        t = alpha * (t + shift * s) + e.sum(1);
        s = alpha * s + s_chunk;
      } else {
        s = alpha * s + d.exp_().sum(1);
      }
      m = m_new;
    }
    auto log_s = s.log();
    out.lse.slice(0, r0, r1).copy_(m + log_s);
    if (tokens1d.defined())
      out.log_probs.slice(0, r0, r1).copy_(gather_tokens(logits2d, tokens1d, p, r0, r1) - m -
                                           log_s);
    if (want_entropy)
      out.entropy.slice(0, r0, r1).copy_(log_s - t / s);
  });
  return out;
}

// d/dlogits of Σ g_lp·log p(token) + Σ g_h·H, one chunk at a time:
// d log p_k / dx = onehot_k − p,  dH/dx = −p·(x − μ) with μ = Σ p·x = lse − H.
at::Tensor chunked_backward(const at::Tensor& logits2d, const at::Tensor& tokens1d,
                            const at::Tensor& lse, const at::Tensor& entropy,
                            const at::Tensor& grad_lp, const at::Tensor& grad_h, const plan& p) {
  auto grad = at::empty_like(logits2d, at::MemoryFormat::Contiguous);
  bool with_lp = grad_lp.defined() && tokens1d.defined();
  bool with_h = grad_h.defined() && entropy.defined();
  if (!with_lp && !with_h) {
    grad.zero_();
    return grad;
  }
  auto mu = with_h ? lse - entropy : at::Tensor{};
  for_row_tiles(p, [&](int64_t r0, int64_t r1) {
    auto lse_t = lse.slice(0, r0, r1).unsqueeze(1);
    auto g_lp = with_lp ? grad_lp.slice(0, r0, r1).to(p.type) : at::Tensor{};
    auto g_h = with_h ? grad_h.slice(0, r0, r1).to(p.type).unsqueeze(1) : at::Tensor{};
    auto mu_t = with_h ? mu.slice(0, r0, r1).unsqueeze(1) : at::Tensor{};
    auto tok = with_lp ? tokens1d.slice(0, r0, r1) : at::Tensor{};
    for (int64_t c0 = 0; c0 < p.vocab; c0 += p.chunk) {
      int64_t c1 = std::min(p.vocab, c0 + p.chunk);
      auto x = load_chunk(logits2d, p, r0, r1, c0, c1);
      auto prob = (x - lse_t).exp_();
      at::Tensor g;
      if (with_h) {
        g = (x.clamp_min(p.lowest) - mu_t).mul_(prob).mul_(g_h).neg_();
        if (with_lp)
          g.sub_(prob.mul_(g_lp.unsqueeze(1)));
      } else {
        g = prob.mul_(g_lp.unsqueeze(1)).neg_();
      }
      if (with_lp) {
        auto local = tok - c0;
        auto inside = local.ge(0).logical_and_(local.lt(c1 - c0));
        auto idx = local.clamp(0, c1 - c0 - 1).unsqueeze(1);
        auto val = at::where(inside, g_lp, at::zeros({}, g_lp.options())).unsqueeze(1);
        g.scatter_add_(1, idx, val);
      }
      if (p.inv_temp != 1.0)
        g.mul_(p.inv_temp);
      grad.slice(0, r0, r1).slice(1, c0, c1).copy_(g);
    }
  });
  return grad;
}

// Custom autograd node: forward streams over V (or runs the fused CUDA
// kernel), backward recomputes the softmax chunk by chunk.
struct chunked_logprob_fn : public torch::autograd::Function<chunked_logprob_fn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::Tensor logits2d, at::Tensor tokens1d,
                                                bool has_tokens, bool want_entropy, int64_t chunk,
                                                double inv_temp) {
    auto p = make_plan(logits2d, chunk, inv_temp);
    auto logits = logits2d.detach();
    auto tokens = has_tokens ? tokens1d : at::Tensor{};
    row_stats stats;
#if defined(TROUPE_TORCH_CUDA)
    if (logits.is_cuda() && detail::cuda_logprobs_supports(logits.scalar_type())) {
      auto fused = detail::cuda_token_logprobs(logits, tokens, want_entropy, inv_temp);
      stats = row_stats{fused.log_probs, fused.entropy, fused.lse};
    } else
#endif
    {
      stats = chunked_forward(logits, tokens, want_entropy, p);
    }
    auto empty = at::empty({0}, stats.lse.options());
    auto lp = stats.log_probs.defined() ? stats.log_probs : empty;
    auto h = stats.entropy.defined() ? stats.entropy : empty.clone();
    ctx->save_for_backward({logits2d, tokens1d, stats.lse, h});
    ctx->saved_data["has_tokens"] = has_tokens;
    ctx->saved_data["want_entropy"] = want_entropy;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["inv_temp"] = inv_temp;
    ctx->set_materialize_grads(false);
    return {lp, h};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    bool has_tokens = ctx->saved_data["has_tokens"].toBool();
    bool want_entropy = ctx->saved_data["want_entropy"].toBool();
    auto p = make_plan(saved[0], ctx->saved_data["chunk"].toInt(),
                       ctx->saved_data["inv_temp"].toDouble());
    auto grad = chunked_backward(saved[0].detach(), has_tokens ? saved[1] : at::Tensor{}, saved[2],
                                 want_entropy ? saved[3] : at::Tensor{},
                                 has_tokens ? grads[0] : at::Tensor{},
                                 want_entropy ? grads[1] : at::Tensor{}, p);
    return {grad, at::Tensor{}, at::Tensor{}, at::Tensor{}, at::Tensor{}, at::Tensor{}};
  }
};

// KL(p ‖ q) online: per row the two logsumexps as above and
// t = Σ exp(x_p − m_p)·(x_p − x_q), so KL = t / s_p − (lse_p − lse_q).
struct kl_stats {
  at::Tensor kl, lse_p, lse_q;
};

kl_stats kl_forward(const at::Tensor& lp2d, const at::Tensor& lq2d, const plan& p) {
  auto opts = lp2d.options().dtype(p.type);
  kl_stats out{at::empty({p.rows}, opts), at::empty({p.rows}, opts), at::empty({p.rows}, opts)};
  for_row_tiles(p, [&](int64_t r0, int64_t r1) {
    int64_t n = r1 - r0;
    auto m_p = at::full({n}, p.lowest, opts);
    auto m_q = at::full({n}, p.lowest, opts);
    auto s_p = at::zeros({n}, opts);
    auto s_q = at::zeros({n}, opts);
    auto t = at::zeros({n}, opts);
    for (int64_t c0 = 0; c0 < p.vocab; c0 += p.chunk) {
      int64_t c1 = std::min(p.vocab, c0 + p.chunk);
      auto xp = load_chunk(lp2d, p, r0, r1, c0, c1).clamp_min(p.lowest);
      auto xq = load_chunk(lq2d, p, r0, r1, c0, c1).clamp_min(p.lowest);
      auto mp_new = at::maximum(m_p, xp.amax(1));
      auto mq_new = at::maximum(m_q, xq.amax(1));
      auto alpha_p = (m_p - mp_new).exp();
      auto alpha_q = (m_q - mq_new).exp();
      auto e_p = (xp - mp_new.unsqueeze(1)).exp_();
      s_p = alpha_p * s_p + e_p.sum(1);
      s_q = alpha_q * s_q + (xq - mq_new.unsqueeze(1)).exp_().sum(1);
      t = alpha_p * t + e_p.mul_(xp - xq).sum(1);
      m_p = mp_new;
      m_q = mq_new;
    }
    auto log_sp = s_p.log();
    auto log_sq = s_q.log();
    out.kl.slice(0, r0, r1).copy_(t / s_p - (m_p - m_q) - log_sp + log_sq);
    out.lse_p.slice(0, r0, r1).copy_(m_p + log_sp);
    out.lse_q.slice(0, r0, r1).copy_(m_q + log_sq);
  });
  return out;
}

// dKL/dx_p = p·(log p − log q − KL),  dKL/dx_q = q − p.
std::pair<at::Tensor, at::Tensor> kl_backward(const at::Tensor& lp2d, const at::Tensor& lq2d,
                                              const kl_stats& st, const at::Tensor& grad,
                                              bool want_p, bool want_q, const plan& p) {
  at::Tensor gp = want_p ? at::empty_like(lp2d, at::MemoryFormat::Contiguous) : at::Tensor{};
  at::Tensor gq = want_q ? at::empty_like(lq2d, at::MemoryFormat::Contiguous) : at::Tensor{};
  for_row_tiles(p, [&](int64_t r0, int64_t r1) {
    auto g = grad.slice(0, r0, r1).to(p.type).unsqueeze(1);
    auto kl = st.kl.slice(0, r0, r1).unsqueeze(1);
    auto lse_p = st.lse_p.slice(0, r0, r1).unsqueeze(1);
    auto lse_q = st.lse_q.slice(0, r0, r1).unsqueeze(1);
    for (int64_t c0 = 0; c0 < p.vocab; c0 += p.chunk) {
      int64_t c1 = std::min(p.vocab, c0 + p.chunk);
      auto log_p = load_chunk(lp2d, p, r0, r1, c0, c1).clamp_min(p.lowest) - lse_p;
      auto log_q = load_chunk(lq2d, p, r0, r1, c0, c1).clamp_min(p.lowest) - lse_q;
      auto prob_p = log_p.exp();
      if (want_p) {
        auto d = (log_p - log_q - kl).mul_(prob_p).mul_(g);
        if (p.inv_temp != 1.0)
          d.mul_(p.inv_temp);
        gp.slice(0, r0, r1).slice(1, c0, c1).copy_(d);
      }
      if (want_q) {
        auto d = (log_q.exp() - prob_p).mul_(g);
        if (p.inv_temp != 1.0)
          d.mul_(p.inv_temp);
        gq.slice(0, r0, r1).slice(1, c0, c1).copy_(d);
      }
    }
  });
  return {gp, gq};
}

struct exact_kl_fn : public torch::autograd::Function<exact_kl_fn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::Tensor lp2d, at::Tensor lq2d, int64_t chunk,
                                                double inv_temp) {
    auto p = make_plan(lp2d, chunk, inv_temp);
    if (lq2d.scalar_type() == at::kDouble)
      p = make_plan(lq2d, chunk, inv_temp);
    auto st = kl_forward(lp2d.detach(), lq2d.detach(), p);
    ctx->save_for_backward({lp2d, lq2d, st.kl, st.lse_p, st.lse_q});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["inv_temp"] = inv_temp;
    return {st.kl};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto chunk = ctx->saved_data["chunk"].toInt();
    auto inv_temp = ctx->saved_data["inv_temp"].toDouble();
    auto p = make_plan(saved[0], chunk, inv_temp);
    if (saved[1].scalar_type() == at::kDouble)
      p = make_plan(saved[1], chunk, inv_temp);
    kl_stats st{saved[2], saved[3], saved[4]};
    auto [gp, gq] = kl_backward(saved[0].detach(), saved[1].detach(), st, grads[0],
                                ctx->needs_input_grad(0), ctx->needs_input_grad(1), p);
    return {gp, gq, at::Tensor{}, at::Tensor{}};
  }
};

// ---- vocab-parallel (NOTE [vocab-parallel log-probs]) -----------------------------

// The TP group an autograd node reduces over (it outlives the graph).
struct group_ref : torch::CustomClassHolder {
  explicit group_ref(runtime::process_group& g) : group(g) {}
  runtime::process_group& group;
};

// Forward: per row the largest logit over the group, then the group's sums
// of exp(x − m), exp(x − m)·(x − m) and the target's logit (only its owner has
// it), reduced in one call. Backward needs no collective: every rank holds
// the same log-probs and entropies, so the same upstream gradients, and
// differentiates its own columns: d log p / dx_j = [j = target] − p_j,
// dH / dx_j = −p_j (x_j − E_p[x]).
struct vocab_parallel_fn : public torch::autograd::Function<vocab_parallel_fn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::Tensor logits2d, at::Tensor tokens1d,
                                                int64_t vocab_start, double inv_temp,
                                                c10::intrusive_ptr<group_ref> group) {
    auto p = make_plan(logits2d, logits2d.size(1), inv_temp);
    auto x = load_chunk(logits2d.detach(), p, 0, p.rows, 0, p.vocab).clamp_min(p.lowest);
    auto m = x.amax(1);
    value_or_throw(group->group.all_reduce(m, runtime::reduce_op::max));
    auto e = (x - m.unsqueeze(1)).exp_();
    auto local = tokens1d - vocab_start;
    auto mine = (local >= 0).logical_and_(local < p.vocab);
    auto target = x.gather(1, local.clamp(0, p.vocab - 1).unsqueeze(1)).squeeze(1) * mine;
    // Σ e·(x − m), not Σ e·x: E_p[x] − m stays small where x and m are large.
    auto sums = at::stack({e.sum(1), (e * (x - m.unsqueeze(1))).sum(1), target}).contiguous();
    value_or_throw(group->group.all_reduce(sums, runtime::reduce_op::sum));
    auto log_s = sums[0].log();
    auto centred = sums[1] / sums[0]; // E_p[x] − m
    auto lse = m + log_s;
    ctx->save_for_backward({logits2d, tokens1d, lse, m, centred});
    ctx->saved_data["vocab_start"] = vocab_start;
    ctx->saved_data["inv_temp"] = inv_temp;
    ctx->set_materialize_grads(false);
    return {sums[2] - lse, log_s - centred};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& logits2d = saved[0];
    auto p = make_plan(logits2d, logits2d.size(1), ctx->saved_data["inv_temp"].toDouble());
    auto x = load_chunk(logits2d.detach(), p, 0, p.rows, 0, p.vocab).clamp_min(p.lowest);
    auto prob = (x - saved[2].unsqueeze(1)).exp();
    auto d = at::zeros_like(x);
    if (grads[0].defined()) {
      auto g = grads[0].to(p.type).unsqueeze(1);
      d -= prob * g;
      auto local = saved[1] - ctx->saved_data["vocab_start"].toInt();
      auto mine = (local >= 0).logical_and_(local < p.vocab);
      auto hit = at::zeros_like(x).scatter_(1, local.clamp(0, p.vocab - 1).unsqueeze(1),
                                            mine.to(p.type).unsqueeze(1));
      d += hit * g;
    }
    if (grads[1].defined()) // x − E_p[x] = (x − m) − (E_p[x] − m)
      d -= prob * ((x - saved[3].unsqueeze(1)) - saved[4].unsqueeze(1)) *
           grads[1].to(p.type).unsqueeze(1);
    if (p.inv_temp != 1.0)
      d *= p.inv_temp;
    return {d.to(logits2d.scalar_type()), at::Tensor{}, at::Tensor{}, at::Tensor{}, at::Tensor{}};
  }
};

// ---- argument checks --------------------------------------------------------

caf::error check_logits(std::string_view fn, std::string_view name, const at::Tensor& logits) {
  if (auto err = detail::require_floating(fn, name, logits))
    return err;
  if (logits.dim() < 2)
    return make_error(errc::shape_mismatch, std::string{fn} + ": " + std::string{name} +
                                                " has shape " + detail::shape_str(logits) +
                                                ", expected [B, T, V] (at least 2 dimensions)");
  if (logits.size(-1) < 1)
    return make_error(errc::shape_mismatch, std::string{fn} + ": " + std::string{name} +
                                                " has shape " + detail::shape_str(logits) +
                                                ", expected a non-empty vocabulary dimension");
  return {};
}

// `vocab` (> 0) when the logits hold a shard of it, else their last dimension.
caf::error check_tokens(std::string_view fn, const at::Tensor& logits, const at::Tensor& tokens,
                        int64_t vocab = 0) {
  if (auto err = detail::require_integral(fn, "tokens", tokens))
    return err;
  auto expected_shape = logits.sizes().slice(0, logits.dim() - 1);
  if (tokens.sizes() != expected_shape)
    return make_error(errc::shape_mismatch,
                      std::string{fn} + ": tokens has shape " + detail::shape_str(tokens) +
                          ", expected " + detail::shape_str(at::empty(expected_shape, at::kByte)) +
                          " (logits " + detail::shape_str(logits) + " without V)");
  if (auto err = detail::require_same_device(fn, "tokens", tokens, "logits", logits))
    return err;
  // Range check on CPU only: on CUDA it would synchronise; the kernel writes
  // NaN for an id outside [0, V) instead.
  if (tokens.device().is_cpu() && tokens.numel() > 0) {
    auto lo = tokens.min().item<int64_t>();
    auto hi = tokens.max().item<int64_t>();
    if (vocab <= 0)
      vocab = logits.size(-1);
    if (lo < 0 || hi >= vocab)
      return make_error(errc::out_of_range, std::string{fn} + ": tokens holds ids in [" +
                                                std::to_string(lo) + ", " + std::to_string(hi) +
                                                "], expected ids in [0, " + std::to_string(vocab) +
                                                ")");
  }
  return {};
}

caf::error check_options(std::string_view fn, const logits_options& opts) {
  if (opts.chunk_size < 1)
    return make_error(errc::invalid_argument, std::string{fn} + ": chunk_size must be >= 1, got " +
                                                  std::to_string(opts.chunk_size));
  return detail::require_range(fn, "temperature", opts.temperature, 0.0,
                               std::numeric_limits<double>::infinity(), false, false);
}

caf::error check_device(std::string_view fn, const at::Tensor& logits) {
  if (logits.device().is_cpu())
    return {};
#if defined(TROUPE_TORCH_CUDA)
  if (logits.is_cuda())
    return {};
#endif
  return detail::unsupported_device(fn, "logits", logits);
}

// Runs the autograd node over logits [..., V] flattened to [rows, V].
expected<log_probs_entropy> run_chunked(std::string_view fn, const at::Tensor& logits,
                                        const at::Tensor& tokens, bool want_entropy,
                                        const logits_options& opts) {
  return guarded(fn, [&] {
    auto lead = logits.sizes().slice(0, logits.dim() - 1).vec();
    auto vocab = logits.size(-1);
    auto logits2d = logits.reshape({-1, vocab});
    if (logits2d.stride(1) != 1)
      logits2d = logits2d.contiguous();
    bool has_tokens = tokens.defined();
    auto tokens1d = has_tokens ? tokens.reshape({-1}).to(at::kLong)
                               : at::empty({0}, logits.options().dtype(at::kLong));
    auto outs = chunked_logprob_fn::apply(logits2d, tokens1d, has_tokens, want_entropy,
                                          opts.chunk_size, 1.0 / opts.temperature);
    log_probs_entropy out;
    if (has_tokens)
      out.log_probs = outs[0].view(lead);
    if (want_entropy)
      out.entropy = outs[1].view(lead);
    return out;
  });
}

at::Tensor scaled(const at::Tensor& logits, double temperature) {
  auto type = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto x = logits.to(type);
  return temperature != 1.0 ? x / temperature : x;
}

} // namespace

expected<at::Tensor> token_log_probs(const at::Tensor& logits, const at::Tensor& tokens,
                                     const logits_options& opts) {
  constexpr std::string_view fn = "token_log_probs";
  if (auto err = check_logits(fn, "logits", logits))
    return err;
  if (auto err = detail::first_error(
          {check_tokens(fn, logits, tokens), check_options(fn, opts), check_device(fn, logits)}))
    return err;
  auto out = run_chunked(fn, logits, tokens, false, opts);
  if (!out)
    return out.error();
  return std::move(out->log_probs);
}

expected<at::Tensor> entropy_from_logits(const at::Tensor& logits, const logits_options& opts) {
  constexpr std::string_view fn = "entropy_from_logits";
  if (auto err = detail::first_error({check_logits(fn, "logits", logits), check_options(fn, opts)}))
    return err;
  if (auto err = check_device(fn, logits))
    return err;
  auto out = run_chunked(fn, logits, at::Tensor{}, true, opts);
  if (!out)
    return out.error();
  return std::move(out->entropy);
}

expected<log_probs_entropy> token_log_probs_and_entropy(const at::Tensor& logits,
                                                        const at::Tensor& tokens,
                                                        const logits_options& opts) {
  constexpr std::string_view fn = "token_log_probs_and_entropy";
  if (auto err = check_logits(fn, "logits", logits))
    return err;
  if (auto err = detail::first_error(
          {check_tokens(fn, logits, tokens), check_options(fn, opts), check_device(fn, logits)}))
    return err;
  return run_chunked(fn, logits, tokens, true, opts);
}

expected<at::Tensor> token_log_probs_full(const at::Tensor& logits, const at::Tensor& tokens,
                                          double temperature) {
  constexpr std::string_view fn = "token_log_probs_full";
  if (auto err = check_logits(fn, "logits", logits))
    return err;
  if (auto err = detail::first_error(
          {check_tokens(fn, logits, tokens),
           check_options(fn, logits_options{.chunk_size = 1, .temperature = temperature})}))
    return err;
  return guarded(fn, [&] {
    return at::log_softmax(scaled(logits, temperature), -1)
        .gather(-1, tokens.to(at::kLong).unsqueeze(-1))
        .squeeze(-1);
  });
}

expected<at::Tensor> entropy_full(const at::Tensor& logits, double temperature) {
  constexpr std::string_view fn = "entropy_full";
  if (auto err = detail::first_error(
          {check_logits(fn, "logits", logits),
           check_options(fn, logits_options{.chunk_size = 1, .temperature = temperature})}))
    return err;
  return guarded(fn, [&] {
    auto x = scaled(logits, temperature);
    auto probs = at::softmax(x, -1);
    return at::logsumexp(x, {-1}) - (probs * x).sum(-1);
  });
}

expected<log_probs_entropy> vocab_parallel_log_probs_and_entropy(const at::Tensor& logits,
                                                                 const at::Tensor& tokens,
                                                                 int64_t vocab_start, int64_t vocab,
                                                                 runtime::process_group& group,
                                                                 const logits_options& opts) {
  constexpr std::string_view fn = "vocab_parallel_log_probs_and_entropy";
  if (auto err = check_logits(fn, "logits", logits))
    return err;
  if (vocab_start < 0 || vocab_start + logits.size(-1) > vocab)
    return make_error(errc::invalid_argument,
                      std::string{fn} + ": this rank's shard [" + std::to_string(vocab_start) +
                          ", " + std::to_string(vocab_start + logits.size(-1)) +
                          ") is not inside the vocabulary [0, " + std::to_string(vocab) + ")");
  if (auto err = detail::first_error({check_tokens(fn, logits, tokens, vocab),
                                      check_options(fn, opts), check_device(fn, logits)}))
    return err;
  return guarded(fn, [&] {
    auto lead = logits.sizes().slice(0, logits.dim() - 1).vec();
    auto logits2d = logits.reshape({-1, logits.size(-1)});
    auto outs =
        vocab_parallel_fn::apply(logits2d, tokens.reshape({-1}).to(at::kLong), vocab_start,
                                 1.0 / opts.temperature, c10::make_intrusive<group_ref>(group));
    return log_probs_entropy{outs[0].view(lead), outs[1].view(lead)};
  });
}

expected<at::Tensor> exact_kl_from_logits(const at::Tensor& logits, const at::Tensor& ref_logits,
                                          const logits_options& opts) {
  constexpr std::string_view fn = "exact_kl_from_logits";
  if (auto err = detail::first_error({check_logits(fn, "logits", logits),
                                      check_logits(fn, "ref_logits", ref_logits),
                                      check_options(fn, opts)}))
    return err;
  if (auto err = detail::first_error(
          {detail::require_same_shape(fn, "ref_logits", ref_logits, "logits", logits),
           detail::require_same_device(fn, "ref_logits", ref_logits, "logits", logits)}))
    return err;
  return guarded(fn, [&] {
    auto lead = logits.sizes().slice(0, logits.dim() - 1).vec();
    auto vocab = logits.size(-1);
    auto lp2d = logits.reshape({-1, vocab});
    auto lq2d = ref_logits.reshape({-1, vocab});
    auto outs = exact_kl_fn::apply(lp2d, lq2d, opts.chunk_size, 1.0 / opts.temperature);
    return outs[0].view(lead);
  });
}

} // namespace troupe::kernels
