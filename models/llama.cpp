#include "models/llama.hpp"

#include "models/batch_invariant.hpp"

#include "kernels/cpu/fused_decode.hpp"
#include "kernels/paged_attention.hpp"
#include "models/hf_checkpoint.hpp"
#include "runtime/collectives.hpp"
#include "runtime/torch_guard.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>

namespace troupe::models {

namespace {

namespace nn = torch::nn;

/// A troupe error thrown through LibTorch-style code: a c10::Error (what
/// TORCH_CHECK throws) that keeps the error's code for run_forward_paged.
class paged_error : public c10::Error {
public:
  explicit paged_error(caf::error err)
      : c10::Error(c10::SourceLocation{"forward_paged", __FILE__, __LINE__}, describe(err)),
        err_(std::move(err)) {}
  const caf::error& error() const { return err_; }

private:
  caf::error err_;
};

void throw_if(const caf::error& err) {
  if (err)
    throw paged_error(err);
}

template <class T>
T value_or_paged_error(expected<T> x) {
  if (!x)
    throw paged_error(x.error());
  return std::move(*x);
}

/// RMSNorm computed in fp32, weight applied in the input dtype (HF's order).
struct rms_norm_impl : nn::Module {
  rms_norm_impl(int64_t dim, double eps) : eps(eps) {
    weight = register_parameter("weight", torch::ones({dim}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto xf = x.to(torch::kFloat32);
    auto normed = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps);
    return weight * normed.to(x.scalar_type());
  }
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE_IMPL(rms_norm, rms_norm_impl);

nn::Linear make_linear(int64_t in, int64_t out, bool bias) {
  return nn::Linear(nn::LinearOptions(in, out).bias(bias));
}

/// x · weightᵀ + bias. A single row on the CPU outside autograd (batch-1
/// decode) goes through a matrix-vector product, which streams the weight
/// once; the GEMM path packs (copies) the weight first and is ~1.6x slower
/// for the 32000 x 288 LM head, whose read bounds batch-1 decode.
torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& weight,
                    const torch::Tensor& bias = {}) {
  if (x.dim() == 2 && x.size(0) == 1 && x.device().is_cpu() && !torch::GradMode::is_enabled()) {
    auto y = torch::mv(weight, x[0]);
    if (bias.defined())
      y += bias;
    return y.unsqueeze(0);
  }
  return torch::linear(x, weight, bias);
}

torch::Tensor dense(const nn::Linear& layer, const torch::Tensor& x) {
  return dense(x, layer->weight, layer->bias);
}

/// RoPE cos/sin [..., head_dim] for positions [...] (HF rotate-half layout),
/// computed once per forward and shared by every layer.
struct rotary {
  torch::Tensor cos;
  torch::Tensor sin;
};

/// `inv_freq` [head_dim / 2] fp32 comes from rope_inv_freq(config).
rotary rotary_tables(const torch::Tensor& positions, const torch::Tensor& inv_freq,
                     torch::ScalarType dtype) {
  auto freqs =
      positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq.to(positions.device()); // [..., D/2]
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  auto half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

/// x [..., heads, D]; cos/sin [..., D].
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin) {
  auto c = cos.unsqueeze(-2);
  auto s = sin.unsqueeze(-2);
  return x * c + rotate_half(x) * s;
}

/// A row-parallel layer (NOTE [tensor parallelism]): the ranks' partial
/// products summed, then the (replicated) bias; `dense` without TP.
torch::Tensor row_parallel(const nn::Linear& layer, const torch::Tensor& x,
                           const tp_partition& tp) {
  if (!tp.active())
    return dense(layer, x);
  auto y = tp_reduce(dense(x, layer->weight), tp);
  return layer->bias.defined() ? y + layer->bias : y;
}

struct attention_impl : nn::Module {
  attention_impl(const llama_config& c, const tp_partition& part)
      : tp(part), n_heads(tp.active() ? tp.heads : c.num_attention_heads),
        n_kv(tp.active() ? tp.kv_heads : c.num_key_value_heads), n_kv_used(n_kv),
        head_dim(c.resolved_head_dim()) {
    auto freqs = rope_inv_freq(c);
    inv_freq = torch::tensor(std::vector<double>(freqs.begin(), freqs.end()), torch::kFloat64)
                   .to(torch::kFloat32);
    wq = register_module("wq", make_linear(c.hidden_size, n_heads * head_dim, c.qkv_bias));
    wk = register_module("wk", make_linear(c.hidden_size, n_kv * head_dim, c.qkv_bias));
    wv = register_module("wv", make_linear(c.hidden_size, n_kv * head_dim, c.qkv_bias));
    wo = register_module("wo", make_linear(n_heads * head_dim, c.hidden_size, c.o_bias));
    if (tp.active() && !tp.kv_split)
      pick_replicated_kv(c);
  }

  /// Replicated key / value heads (NOTE [tensor parallelism]): the ones this
  /// rank's query heads read, as a range when each serves the same number
  /// of them, else one per query head.
  void pick_replicated_kv(const llama_config& c) {
    const int64_t group = c.num_attention_heads / c.num_key_value_heads;
    std::vector<int64_t> of_head;
    for (int64_t h = tp.head0; h < tp.head0 + n_heads; ++h)
      of_head.push_back(h / group);
    kv_first = of_head.front();
    n_kv_used = of_head.back() - kv_first + 1;
    bool even = n_heads % n_kv_used == 0;
    for (size_t i = 0; even && i < of_head.size(); ++i)
      even = of_head[i] == kv_first + static_cast<int64_t>(i) / (n_heads / n_kv_used);
    if (!even) { // one per query head
      kv_index = torch::tensor(of_head, torch::kLong);
      n_kv_used = n_heads;
    }
  }

  /// This rank's key / value heads [..., n_kv_used, D] from those it holds.
  torch::Tensor used_kv(const torch::Tensor& kv) const {
    if (!tp.active() || tp.kv_split)
      return kv;
    if (kv_index.defined())
      return kv.index_select(-2, kv_index.to(kv.device()));
    return kv.narrow(-2, kv_first, n_kv_used);
  }

  struct projected {
    torch::Tensor q; // [..., n_heads, head_dim]
    torch::Tensor k; // [..., n_kv, head_dim]
    torch::Tensor v; // [..., n_kv, head_dim]
  };

  /// x [..., hidden] → q, k, v projections, RoPE (tables for x's positions)
  /// applied to q and k. Shared by the dense and the paged paths.
  projected project(const torch::Tensor& x, const rotary& rope) {
    auto shape = [&](int64_t heads) {
      auto s = x.sizes().vec();
      s.back() = heads;
      s.push_back(head_dim);
      return s;
    };
    auto xc = tp_copy(x, tp); // NOTE [tensor parallelism]
    auto q = dense(wq, xc).view(shape(n_heads));
    torch::Tensor k, v;
    if (!tp.active() || tp.kv_split) {
      k = dense(wk, xc).view(shape(n_kv));
      v = dense(wv, xc).view(shape(n_kv));
    } else {
      k = used_kv(tp_copy(dense(wk, x), tp).view(shape(n_kv)));
      v = used_kv(tp_copy(dense(wv, x), tp).view(shape(n_kv)));
    }
    return {apply_rotary(q, rope.cos, rope.sin), apply_rotary(k, rope.cos, rope.sin), std::move(v)};
  }

  /// x [B,T,H]; rope for positions [B,T]; key_mask [B,S] bool over all keys (cached +
  /// new); causal over new tokens: query i sees cached keys and new keys <= i.
  torch::Tensor forward(const torch::Tensor& x, const rotary& rope, const torch::Tensor& key_mask,
                        kv_cache* cache, size_t layer) {
    auto B = x.size(0);
    auto T = x.size(1);
    auto p = project(x, rope);
    auto q = p.q.transpose(1, 2); // [B, heads, T, D]
    auto k = p.k.transpose(1, 2);
    auto v = p.v.transpose(1, 2);
    int64_t past = 0;
    if (cache != nullptr) {
      past = cache->length;
      cache->keys[layer].narrow(2, past, T).copy_(k);
      cache->values[layer].narrow(2, past, T).copy_(v);
      k = cache->keys[layer].narrow(2, 0, past + T);
      v = cache->values[layer].narrow(2, 0, past + T);
    }
    auto S = past + T;
    auto group = n_heads / n_kv_used;
    // Grouped-query attention without repeating K/V: head h uses kv head h / group.
    auto qg = q.reshape({B, n_kv_used, group * T, head_dim});
    auto scores = torch::matmul(qg, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(head_dim));
    scores = scores.view({B, n_kv_used, group, T, S}).to(torch::kFloat32);
    auto opts = torch::TensorOptions().dtype(torch::kBool).device(x.device());
    auto causal = torch::ones({T, S}, opts).tril(past); // query i sees keys <= past + i
    auto allowed = causal.view({1, 1, 1, T, S}) & key_mask.view({B, 1, 1, 1, S});
    scores = scores.masked_fill(allowed.logical_not(), std::numeric_limits<float>::lowest() / 2);
    auto probs = torch::softmax(scores, -1).to(v.scalar_type());
    auto out = torch::matmul(probs.view({B, n_kv_used, group * T, S}), v); // [B,kv,G*T,D]
    out = out.view({B, n_heads, T, head_dim}).transpose(1, 2).reshape({B, T, n_heads * head_dim});
    return row_parallel(wo, out, tp);
  }

  /// x [N, hidden], rope for positions [N]: one paged step (NOTE [paged KV layout] in
  /// kernels/paged_attention.hpp); writes this layer's new K/V into `cache`.
  torch::Tensor forward_paged(const torch::Tensor& x, const rotary& rope, const paged_batch& batch,
                              paged_kv_cache& cache, size_t layer) {
    auto p = project(x, rope);
    throw_if(
        kernels::write_kv(cache.k[layer], cache.v[layer], p.k, p.v, batch.slot_mapping).error());
    auto out = value_or_paged_error(kernels::paged_attention(
        p.q, cache.k[layer], cache.v[layer], batch.block_tables, batch.context_lens,
        batch.query_start, 1.0 / std::sqrt(static_cast<double>(head_dim))));
    return row_parallel(wo, out.reshape({x.size(0), n_heads * head_dim}), tp);
  }

  tp_partition tp;
  // Query heads and key / value heads held (this rank's under TP), the
  // key / value heads the query heads read (NOTE [tensor parallelism]).
  int64_t n_heads, n_kv, n_kv_used;
  int64_t head_dim;
  int64_t kv_first = 0;   // replicated: the first used, when a range
  torch::Tensor kv_index; // replicated and uneven: each query head's
  torch::Tensor inv_freq; // not a parameter: derived from the config
  nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
};
TORCH_MODULE_IMPL(attention, attention_impl);

struct feed_forward_impl : nn::Module {
  feed_forward_impl(const llama_config& c, const tp_partition& part) : tp(part) {
    const int64_t inner = tp.active() ? tp.intermediate : c.intermediate_size;
    w1 = register_module("w1", make_linear(c.hidden_size, inner, c.mlp_bias));
    w2 = register_module("w2", make_linear(inner, c.hidden_size, c.mlp_bias));
    w3 = register_module("w3", make_linear(c.hidden_size, inner, c.mlp_bias));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto xc = tp_copy(x, tp);
    return row_parallel(w2, torch::silu(dense(w1, xc)) * dense(w3, xc), tp);
  }
  tp_partition tp;
  nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE_IMPL(feed_forward, feed_forward_impl);

struct block_impl : nn::Module {
  block_impl(const llama_config& c, const tp_partition& tp) {
    attention_norm = register_module("attention_norm", rms_norm(c.hidden_size, c.rms_norm_eps));
    attn = register_module("attention", attention(c, tp));
    ffn_norm = register_module("ffn_norm", rms_norm(c.hidden_size, c.rms_norm_eps));
    ffn = register_module("feed_forward", feed_forward(c, tp));
  }
  /// Pre-norm residual block around `attend` (the dense or the paged attention).
  template <class Attend>
  torch::Tensor run(const torch::Tensor& x, Attend&& attend) {
    auto h = x + attend(attention_norm->forward(x));
    return h + ffn->forward(ffn_norm->forward(h));
  }
  torch::Tensor forward(const torch::Tensor& x, const rotary& rope, const torch::Tensor& key_mask,
                        kv_cache* cache, size_t layer) {
    return run(x, [&](const torch::Tensor& normed) {
      return attn->forward(normed, rope, key_mask, cache, layer);
    });
  }
  torch::Tensor forward_paged(const torch::Tensor& x, const rotary& rope, const paged_batch& batch,
                              paged_kv_cache& cache, size_t layer) {
    return run(x, [&](const torch::Tensor& normed) {
      return attn->forward_paged(normed, rope, batch, cache, layer);
    });
  }
  rms_norm attention_norm{nullptr}, ffn_norm{nullptr};
  attention attn{nullptr};
  feed_forward ffn{nullptr};
};
TORCH_MODULE_IMPL(block, block_impl);

/// The RoPE tables of the model's layers (every layer has the same inv_freq).
rotary rotary_for_layer0(nn::ModuleList& layers, const torch::Tensor& positions,
                         torch::ScalarType dtype) {
  return rotary_tables(positions, layers[0]->as<block_impl>()->attn->inv_freq, dtype);
}

} // namespace

expected<head_kind> parse_head_kind(const std::string& name) {
  if (auto h = enum_from_name<head_kind>(name))
    return *h;
  return make_error(errc::invalid_argument,
                    "unknown head '" + name + "', expected one of: lm, value, reward");
}

llama_model_impl::llama_model_impl(const llama_config& config, head_kind head, tp_partition tp,
                                   pp_stage pp)
    : config_(config), head_(head), tp_(tp), pp_(pp) {
  const int64_t vocab = tp_.active() ? tp_.vocab : config.vocab_size;
  // NOTE [tied embedding under PP]: the last stage's LM head is the
  // embedding, so that stage holds a copy of it too.
  if (pp_.first() || (pp_.last() && head == head_kind::lm && config.tie_word_embeddings))
    tok_embeddings_ = register_module(
        "tok_embeddings", nn::Embedding(nn::EmbeddingOptions(vocab, config.hidden_size)));
  // NOTE [pipeline parallelism]: another stage's layer is an empty module,
  // so that the stage's parameters keep their layer numbers.
  layers_ = register_module("layers", nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    if (pp_.holds_layer(i, config.num_hidden_layers))
      layers_->push_back(block(config, tp_));
    else
      layers_->push_back(nn::Identity());
  }
  cached_kv_heads_ = layers_[pp_.active() ? pp_.layer0 : 0]->as<block_impl>()->attn->n_kv_used;
  if (pp_.last()) {
    norm_ = register_module("norm", rms_norm(config.hidden_size, config.rms_norm_eps));
    if (head == head_kind::lm && !config.tie_word_embeddings)
      output_ = register_module("output", make_linear(config.hidden_size, vocab, false));
    if (head == head_kind::value)
      score_head_ = register_module("value_head", make_linear(config.hidden_size, 1, true));
    if (head == head_kind::reward)
      score_head_ = register_module("reward_head", make_linear(config.hidden_size, 1, false));
  }
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    const auto& name = p.key();
    if (name.find("norm") != std::string::npos)
      p.value().fill_(1.0);
    else if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0)
      p.value().zero_();
    else
      p.value().normal_(0.0, 0.02);
  }
}

torch::Tensor llama_model_impl::embed(const torch::Tensor& ids) {
  if (!tp_.active())
    return tok_embeddings_->forward(ids);
  // NOTE [tensor parallelism]: the ids of this rank's part, the others zero.
  auto local = ids - tp_.vocab0;
  auto mine = (local >= 0).logical_and_(local < tp_.vocab);
  auto rows = torch::embedding(tok_embeddings_->weight, local.clamp(0, tp_.vocab - 1));
  return tp_reduce(rows * mine.unsqueeze(-1).to(rows.scalar_type()), tp_);
}

torch::Tensor llama_model_impl::any_weight() const {
  return tok_embeddings_ ? tok_embeddings_->weight : parameters().front();
}

kv_cache llama_model_impl::make_cache(int64_t batch, int64_t capacity) const {
  TORCH_CHECK(!pp_.active(), "a pipeline stage (pp ", pp_.size, ") does not decode");
  auto ref = any_weight();
  kv_cache cache;
  cache.capacity = capacity;
  auto shape = std::vector<int64_t>{batch, cached_kv_heads_, capacity, config_.resolved_head_dim()};
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    cache.keys.push_back(torch::zeros(shape, ref.options()));
    cache.values.push_back(torch::zeros(shape, ref.options()));
  }
  auto dev = ref.device();
  cache.key_mask =
      torch::zeros({batch, capacity}, torch::TensorOptions().dtype(torch::kBool).device(dev));
  cache.next_position =
      torch::zeros({batch}, torch::TensorOptions().dtype(torch::kLong).device(dev));
  return cache;
}

paged_kv_cache llama_model_impl::make_paged_cache(int64_t num_blocks, int64_t block_size) const {
  TORCH_CHECK(num_blocks >= 1 && block_size >= 1, "make_paged_cache: num_blocks (", num_blocks,
              ") and block_size (", block_size, ") must be >= 1");
  TORCH_CHECK(!pp_.active(), "a pipeline stage (pp ", pp_.size, ") does not decode");
  auto ref = any_weight();
  paged_kv_cache cache;
  cache.block_size = block_size;
  cache.num_blocks = num_blocks;
  auto shape =
      std::vector<int64_t>{num_blocks, block_size, cached_kv_heads_, config_.resolved_head_dim()};
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    cache.k.push_back(torch::zeros(shape, ref.options()));
    cache.v.push_back(torch::zeros(shape, ref.options()));
  }
  return cache;
}

namespace {

/// The least and greatest of a non-empty integer tensor: a loop over a CPU
/// int64 / int32 tensor (two reductions through the dispatcher cost ~25 us,
/// 1.5 % of a batch-1 decode step), LibTorch's reductions otherwise.
std::pair<int64_t, int64_t> int_range(const torch::Tensor& t) {
  auto scan = [&](const auto* p) {
    int64_t lo = p[0], hi = p[0];
    for (int64_t i = 1; i < t.numel(); ++i) {
      lo = std::min<int64_t>(lo, p[i]);
      hi = std::max<int64_t>(hi, p[i]);
    }
    return std::pair{lo, hi};
  };
  if (t.device().is_cpu() && t.is_contiguous()) {
    if (t.scalar_type() == torch::kLong)
      return scan(t.data_ptr<int64_t>());
    if (t.scalar_type() == torch::kInt)
      return scan(t.data_ptr<int32_t>());
  }
  return {t.min().item<int64_t>(), t.max().item<int64_t>()};
}

/// Model-level checks of a paged step (the kernels check the step metadata).
caf::error check_paged_step(const llama_config& config, head_kind head, size_t layers,
                            int64_t kv_heads, const paged_batch& batch,
                            const paged_kv_cache& cache, const torch::Tensor& logit_rows) {
  constexpr std::string_view fn = "forward_paged";
  auto fail = [&](errc code, const std::string& what) {
    return make_error(code, std::string{fn} + ": " + what);
  };
  auto dims = [](torch::IntArrayRef sizes) {
    std::ostringstream os;
    os << sizes;
    return os.str();
  };
  auto shape = [&](const torch::Tensor& t) {
    return t.defined() ? dims(t.sizes()) : std::string{"undefined"};
  };
  if (head != head_kind::lm)
    return fail(errc::unsupported,
                "needs an lm head, this model has a " + std::string{to_string(head)} + " head");
  if (cache.k.size() != layers || cache.v.size() != layers)
    return fail(errc::invalid_argument, "paged cache has " + std::to_string(cache.k.size()) +
                                            " K and " + std::to_string(cache.v.size()) +
                                            " V pools, the model has " + std::to_string(layers) +
                                            " layers");
  const std::vector<int64_t> pool{cache.num_blocks, cache.block_size, kv_heads,
                                  config.resolved_head_dim()};
  for (size_t i = 0; i < layers; ++i)
    for (const auto* t : {&cache.k[i], &cache.v[i]})
      if (!t->defined() || t->sizes() != torch::IntArrayRef{pool})
        return fail(errc::shape_mismatch,
                    "layer " + std::to_string(i) + " pool has shape " + shape(*t) +
                        ", expected [num_blocks, block_size, n_kv, head_dim] = " + dims(pool));
  const auto& ids = batch.input_ids;
  if (!ids.defined() || ids.dim() != 1 || !torch::isIntegralType(ids.scalar_type(), false))
    return fail(errc::shape_mismatch,
                "input_ids has shape " + shape(ids) + ", expected [N] integer token ids");
  using named = std::pair<const char*, const torch::Tensor*>;
  for (const auto& [name, t] : std::initializer_list<named>{{"positions", &batch.positions},
                                                            {"slot_mapping", &batch.slot_mapping}})
    if (!t->defined() || t->sizes() != ids.sizes() ||
        !torch::isIntegralType(t->scalar_type(), false))
      return fail(errc::shape_mismatch, std::string{name} + " has shape " + shape(*t) +
                                            ", expected [" + std::to_string(ids.size(0)) +
                                            "] integers like input_ids");
  const int64_t N = ids.size(0);
  if (N > 0) {
    auto [lo, hi] = int_range(ids);
    if (lo < 0 || hi >= config.vocab_size)
      return fail(errc::out_of_range, "input_ids holds ids in [" + std::to_string(lo) + ", " +
                                          std::to_string(hi) + "], outside the vocabulary [0, " +
                                          std::to_string(config.vocab_size) + ")");
  }
  if (logit_rows.defined()) {
    if (logit_rows.dim() != 1 || !torch::isIntegralType(logit_rows.scalar_type(), false))
      return fail(errc::shape_mismatch,
                  "logit_rows has shape " + shape(logit_rows) + ", expected [M] integer rows");
    if (logit_rows.numel() > 0) {
      auto [lo, hi] = int_range(logit_rows);
      if (lo < 0 || hi >= N)
        return fail(errc::out_of_range, "logit_rows holds rows in [" + std::to_string(lo) + ", " +
                                            std::to_string(hi) + "], outside [0, " +
                                            std::to_string(N) + ")");
    }
  }
  return {};
}

} // namespace

namespace {

/// A paged step's indices as the fused kernel reads them.
struct decode_indices {
  torch::Tensor tokens, positions, slots, context_lens; // [N] int64
  torch::Tensor tables;                                 // [N, W] int32
};

/// Whether a paged step is a decode step: one new token per request, the
/// logits of each (logit_rows absent or 0..N-1), its indices on the CPU.
/// Cheap: it copies nothing (NOTE [decode path report] asks it first).
bool one_token_each(const paged_batch& batch, const torch::Tensor& logit_rows) {
  auto n = batch.input_ids.numel();
  const auto& qs = batch.query_start;
  if (n == 0 || !qs.defined() || qs.numel() != n + 1 || !batch.block_tables.defined() ||
      batch.block_tables.dim() != 2 || batch.block_tables.size(0) != n ||
      !batch.context_lens.defined() || batch.context_lens.numel() != n)
    return false;
  for (const auto* t : {&batch.input_ids, &batch.positions, &batch.slot_mapping,
                        &batch.block_tables, &batch.context_lens, &qs})
    if (!t->device().is_cpu())
      return false;
  // 0, 1, ..., len - 1: one token per request, and the logits of each.
  auto is_iota = [](const torch::Tensor& t, int64_t len) {
    if (t.numel() != len)
      return false;
    auto v = t.to(torch::kCPU, torch::kLong).contiguous();
    const int64_t* p = v.data_ptr<int64_t>();
    for (int64_t i = 0; i < len; ++i)
      if (p[i] != i)
        return false;
    return true;
  };
  return is_iota(qs, n + 1) && (!logit_rows.defined() || is_iota(logit_rows, n));
}

// NOTE [mixed steps]: a step that holds both decode rows (one new token of
// a request, its logits asked for) and prefill rows (a new prompt or turn,
// or a chunk of one) is not a decode step, and the ATen path would run
// every row. Multi-turn episodes make such steps common: each episode's
// next turn reaches the engine alone, amid the others' decodes. So the
// step is cut in two: the decode rows as a decode step of their own (the
// fused kernel, when it takes them), the prefill rows through ATen; their
// logits are put back in the step's row order. The two parts write the
// K/V of different sequences, so their order does not matter. The engine
// counts such a step as a decode step, by the path its decode rows took.
struct mixed_split {
  paged_batch decode;         // one token per request, the logits of each
  paged_batch prefill;        // the other requests, whole
  torch::Tensor prefill_rows; // the logit rows asked of the prefill part, in its numbering
  torch::Tensor decode_at;    // where each part's logits go in the step's
  torch::Tensor prefill_at;
  int64_t rows = 0;

  torch::Tensor join(const torch::Tensor& d, const torch::Tensor& p) const {
    auto out = torch::empty({rows, d.size(1)}, d.options());
    out.index_copy_(0, decode_at, d);
    if (p.size(0) > 0)
      out.index_copy_(0, prefill_at, p.to(d.scalar_type()));
    return out;
  }
};

/// The two parts of a mixed step, or nullopt when the step is not one (no
/// decode rows, or nothing else) or its logit rows are not ascending rows
/// of its requests.
/// Each logit row's request (q: the step's query_start), or nullopt unless
/// the rows ascend strictly and each lies within a request's rows.
std::optional<std::vector<int64_t>> logit_row_owners(const int64_t* q, int64_t requests,
                                                     const int64_t* rows, int64_t n_rows) {
  std::vector<int64_t> owner(static_cast<size_t>(n_rows));
  for (int64_t k = 0, r = 0; k < n_rows; ++k) {
    if (k > 0 && rows[k] <= rows[k - 1])
      return std::nullopt;
    while (r < requests && rows[k] >= q[r + 1])
      ++r;
    if (r == requests || rows[k] < q[r])
      return std::nullopt;
    owner[static_cast<size_t>(k)] = r;
  }
  return owner;
}

torch::Tensor long_tensor(const std::vector<int64_t>& v) {
  return torch::tensor(v, torch::kLong);
}

/// The step of requests `reqs` of `b`: their token rows `tokens`, which
/// start at `starts` (the part's query_start).
paged_batch part_of_step(const paged_batch& b, const std::vector<int64_t>& tokens,
                         const std::vector<int64_t>& reqs, const std::vector<int64_t>& starts) {
  auto t = long_tensor(tokens), r = long_tensor(reqs);
  return paged_batch{
      b.input_ids.index_select(0, t),    b.positions.index_select(0, t),
      b.slot_mapping.index_select(0, t), b.block_tables.index_select(0, r),
      b.context_lens.index_select(0, r), long_tensor(starts).to(b.query_start.scalar_type())};
}

std::optional<mixed_split> split_mixed_step(const paged_batch& b, const torch::Tensor& logit_rows) {
  for (const auto* t : {&b.input_ids, &b.positions, &b.slot_mapping, &b.block_tables,
                        &b.context_lens, &b.query_start})
    if (!t->defined() || !t->device().is_cpu())
      return std::nullopt;
  if (b.query_start.dim() != 1 || b.query_start.numel() < 3)
    return std::nullopt;
  auto qs = b.query_start.to(torch::kLong).contiguous();
  const int64_t* q = qs.data_ptr<int64_t>();
  const int64_t requests = qs.numel() - 1;
  auto rows_t =
      (logit_rows.defined() ? logit_rows : qs.slice(0, 1) - 1).to(torch::kLong).contiguous();
  const int64_t* rows = rows_t.data_ptr<int64_t>();
  const int64_t n_rows = rows_t.numel();
  auto owner = logit_row_owners(q, requests, rows, n_rows);
  if (!owner)
    return std::nullopt;
  // A decode request: one new token, its logits asked for.
  std::vector<char> decodes(static_cast<size_t>(requests), 0);
  for (auto r : *owner)
    if (q[r + 1] - q[r] == 1)
      decodes[static_cast<size_t>(r)] = 1;
  std::vector<int64_t> d_req, d_tok, p_req, p_tok, p_start{0};
  std::vector<int64_t> offset(static_cast<size_t>(requests), 0); // a request's first prefill row
  for (int64_t r = 0; r < requests; ++r) {
    if (decodes[static_cast<size_t>(r)]) {
      d_req.push_back(r);
      d_tok.push_back(q[r]);
      continue;
    }
    p_req.push_back(r);
    offset[static_cast<size_t>(r)] = static_cast<int64_t>(p_tok.size());
    for (int64_t t = q[r]; t < q[r + 1]; ++t)
      p_tok.push_back(t);
    p_start.push_back(static_cast<int64_t>(p_tok.size()));
  }
  if (d_req.empty() || p_req.empty())
    return std::nullopt;
  mixed_split out;
  std::vector<int64_t> d_at, p_at, p_rows;
  for (int64_t k = 0; k < n_rows; ++k) {
    const auto r = (*owner)[static_cast<size_t>(k)];
    if (decodes[static_cast<size_t>(r)]) {
      d_at.push_back(k);
    } else {
      p_at.push_back(k);
      p_rows.push_back(offset[static_cast<size_t>(r)] + rows[k] - q[r]);
    }
  }
  std::vector<int64_t> d_start(d_req.size() + 1);
  std::iota(d_start.begin(), d_start.end(), int64_t{0});
  out.decode = part_of_step(b, d_tok, d_req, d_start);
  out.prefill = part_of_step(b, p_tok, p_req, p_start);
  out.prefill_rows = long_tensor(p_rows);
  out.decode_at = long_tensor(d_at);
  out.prefill_at = long_tensor(p_at);
  out.rows = n_rows;
  return out;
}

/// The indices of a decode step (one_token_each) as the fused kernel reads
/// them, when every read is in bounds: slots and the tables' used blocks
/// inside the pools, positions and lengths within the tables.
std::optional<decode_indices> decode_step_indices(const paged_batch& batch,
                                                  const paged_kv_cache& cache,
                                                  const torch::Tensor& logit_rows) {
  if (!one_token_each(batch, logit_rows))
    return std::nullopt;
  const auto n = batch.input_ids.numel();
  auto i64 = [](const torch::Tensor& t) { return t.to(torch::kLong).contiguous(); };
  decode_indices d{i64(batch.input_ids), i64(batch.positions), i64(batch.slot_mapping),
                   i64(batch.context_lens), batch.block_tables.to(torch::kInt32).contiguous()};
  const int64_t width = d.tables.size(1), bs = cache.block_size;
  const int64_t* pos = d.positions.data_ptr<int64_t>();
  const int64_t* slot = d.slots.data_ptr<int64_t>();
  const int64_t* ctx = d.context_lens.data_ptr<int64_t>();
  const int32_t* table = d.tables.data_ptr<int32_t>();
  for (int64_t r = 0; r < n; ++r) {
    if (pos[r] < 0 || ctx[r] < 1 || ctx[r] > width * bs || slot[r] < 0 ||
        slot[r] >= cache.num_blocks * bs)
      return std::nullopt;
    for (int64_t k = 0; k < (ctx[r] + bs - 1) / bs; ++k)
      if (table[r * width + k] < 0 || table[r * width + k] >= cache.num_blocks)
        return std::nullopt;
  }
  return d;
}

} // namespace

/// The packed copy of the weights (NOTE [packed panels]) and the state of
/// the parameters it was made from: their storage and LibTorch's count of
/// in-place writes to each.
struct packed_decode_weights {
  std::vector<torch::Tensor> panels; // each 64-byte aligned (LibTorch's CPU allocator)
  std::vector<kernels::cpu::decode_panels> layers;
  const float* lm_head = nullptr;
  std::vector<std::pair<const void*, int64_t>> made_from; // llama_model_impl::weight_state
  int64_t panel_rows = 0; // of the path it was packed for
  int64_t bytes = 0;
};

void llama_model_impl::set_decode_panels(kernels::cpu::panels_mode mode) {
  decode_panels_ = mode;
  if (mode == kernels::cpu::panels_mode::off)
    drop_decode_panels();
}

void llama_model_impl::set_decode_isa(kernels::cpu::decode_isa isa) {
  if (auto why = kernels::cpu::unsupported_why(isa); !why.empty())
    throw std::invalid_argument("decode_isa " + why);
  std::lock_guard<std::mutex> lock{*team_mu_};
  decode_isa_ = isa;
}

int64_t llama_model_impl::decode_panels_bytes() const {
  std::lock_guard<std::mutex> lock{*team_mu_};
  return panels_ ? panels_->bytes : 0;
}

void llama_model_impl::drop_decode_panels() {
  std::lock_guard<std::mutex> lock{*team_mu_};
  panels_.reset();
}

const packed_decode_weights& llama_model_impl::packed_weights(const weight_state& state) {
  const auto rows_per_panel = kernels::cpu::panel_rows(decode_isa_);
  if (panels_ && panels_->made_from == state && panels_->panel_rows == rows_per_panel)
    return *panels_;
  // The old copy's buffers take the new one (the shapes do not change:
  // no fresh pages to fault in after every weight load).
  std::vector<torch::Tensor> buffers;
  if (panels_)
    buffers = std::move(panels_->panels);
  panels_.reset();
  auto p = std::make_shared<packed_decode_weights>();
  auto pack = [&](int64_t rows, int64_t cols, auto&& fill) {
    const auto size = kernels::cpu::packed_size(rows, cols, rows_per_panel);
    auto reused = p->panels.size() < buffers.size() ? buffers[p->panels.size()] : torch::Tensor{};
    auto t =
        reused.defined() && reused.numel() == size ? reused : torch::empty({size}, torch::kFloat32);
    fill(t.data_ptr<float>());
    p->bytes += t.numel() * 4;
    p->panels.push_back(t);
    return t.data_ptr<float>();
  };
  auto matrix = [&](const torch::Tensor& w) {
    auto c = w.contiguous();
    return pack(c.size(0), c.size(1), [&](float* out) {
      kernels::cpu::pack_panels(c.data_ptr<float>(), c.size(0), c.size(1), rows_per_panel, out);
    });
  };
  for (const auto& layer : *layers_) {
    auto* b = layer->as<block_impl>();
    auto& a = *b->attn;
    auto& f = *b->ffn;
    kernels::cpu::decode_panels l;
    l.qkv = matrix(torch::cat({a.wq->weight, a.wk->weight, a.wv->weight}));
    l.wo = matrix(a.wo->weight);
    const auto& w1 = f.w1->weight;
    l.w13 = pack(2 * w1.size(0), w1.size(1), [&](float* out) {
      kernels::cpu::pack_swiglu(w1.data_ptr<float>(), f.w3->weight.data_ptr<float>(), w1.size(0),
                                w1.size(1), rows_per_panel, out);
    });
    l.w2 = matrix(f.w2->weight);
    p->layers.push_back(l);
  }
  p->lm_head = matrix(output_ ? output_->weight : tok_embeddings_->weight);
  p->made_from = state;
  p->panel_rows = rows_per_panel;
  panels_ = std::move(p);
  return *panels_;
}

std::optional<kernels::cpu::decode_model> llama_model_impl::decode_view(paged_kv_cache& cache,
                                                                        weight_state& state) {
  state.clear();
  bool fusable = true;
  auto ptr = [&](const torch::Tensor& t) -> float* {
    if (!t.defined())
      return nullptr;
    if (!t.device().is_cpu() || t.scalar_type() != torch::kFloat32 || !t.is_contiguous()) {
      fusable = false;
      return nullptr;
    }
    state.emplace_back(t.data_ptr(), t._version());
    return t.data_ptr<float>();
  };
  kernels::cpu::decode_model m;
  m.dim = config_.hidden_size;
  m.hidden = tp_.active() ? tp_.intermediate : config_.intermediate_size;
  m.n_heads = tp_.active() ? tp_.heads : config_.num_attention_heads;
  m.n_kv = cached_kv_heads_;
  m.head_dim = config_.resolved_head_dim();
  m.vocab = tp_.active() ? tp_.vocab : config_.vocab_size;
  m.eps = static_cast<float>(config_.rms_norm_eps);
  if (tp_.active()) { // NOTE [tensor-parallel fused decode]
    m.vocab0 = tp_.vocab0;
    auto* group = tp_.group;
    m.all_reduce = [group](float* data, int64_t n) {
      auto t = torch::from_blob(data, {n}, torch::kFloat32);
      throw_if(group->all_reduce_sum(t).error());
    };
  }
  m.block_size = cache.block_size;
  for (size_t i = 0; i < layers_->size(); ++i) {
    auto* b = layers_[i]->as<block_impl>();
    auto& a = *b->attn;
    auto& f = *b->ffn;
    if (i == 0)
      m.inv_freq = ptr(a.inv_freq);
    m.layers.push_back({ptr(b->attention_norm->weight), ptr(a.wq->weight), ptr(a.wk->weight),
                        ptr(a.wv->weight), ptr(a.wo->weight), ptr(a.wq->bias), ptr(a.wk->bias),
                        ptr(a.wv->bias), ptr(a.wo->bias), ptr(b->ffn_norm->weight),
                        ptr(f.w1->weight), ptr(f.w3->weight), ptr(f.w2->weight), ptr(f.w1->bias),
                        ptr(f.w3->bias), ptr(f.w2->bias), ptr(cache.k[i]), ptr(cache.v[i])});
  }
  m.final_norm = ptr(norm_->as<rms_norm_impl>()->weight);
  m.embedding = ptr(tok_embeddings_->weight);
  m.lm_head = output_ ? ptr(output_->weight) : m.embedding;
  if (!fusable || !m.inv_freq)
    return std::nullopt;
  return m;
}

namespace {

void with_panels(kernels::cpu::decode_model& m, const packed_decode_weights& p) {
  for (size_t i = 0; i < m.layers.size(); ++i)
    m.layers[i].panels = p.layers[i];
  m.lm_head_panels = p.lm_head;
}

} // namespace

torch::Tensor llama_model_impl::fused_step(const paged_batch& batch, paged_kv_cache& cache,
                                           const torch::Tensor& logit_rows) {
  // NOTE [decode path report]: each way out says why.
  last_decode_ = {};
  if (!one_token_each(batch, logit_rows))
    return {}; // not a decode step
  auto aten = [&](const char* why) {
    last_decode_ = {true, false, why};
    return torch::Tensor{};
  };
  if (decode_path_ == kernels::cpu::decode_path::aten)
    return aten("the ATen path was asked for");
  if (head_ != head_kind::lm)
    return aten("a value or reward head");
  // Under TP the kernel runs on the rank's part when its kv heads are its
  // own (split); replicated ones take the ATen path.
  if (tp_.active() && !tp_.kv_split)
    return aten("kv heads replicated across the tensor-parallel ranks");
  weight_state state;
  auto view = decode_view(cache, state);
  if (!view)
    return aten("weights that are not fp32 dense tensors on the CPU");
  // The indices are copied only for a step the kernel may take.
  auto indices = decode_step_indices(batch, cache, logit_rows);
  if (!indices)
    return aten("indices outside the KV pool or its block tables");
  std::unique_lock<std::mutex> lock{*team_mu_, std::try_to_lock};
  if (!lock.owns_lock())
    return aten("the decode team busy with another caller");
  auto n = indices->tokens.numel();
  // (Under the lock: set_decode_isa takes it too.)
  const auto choice = kernels::cpu::choose_decode(decode_isa_, n, decode_path_, decode_panels_);
  if (!choice.fused)
    return aten("the crossover table's choice at this batch size");
  last_decode_ = {true, true, ""};
  auto threads = std::max(1, at::get_num_threads());
  if (!team_ || team_->size() != threads)
    team_ = std::make_shared<kernels::cpu::thread_team>(threads);
  auto logits = torch::empty({n, view->vocab}, torch::kFloat32);
  kernels::cpu::decode_batch b;
  b.size = n;
  b.tokens = indices->tokens.data_ptr<int64_t>();
  b.positions = indices->positions.data_ptr<int64_t>();
  b.slots = indices->slots.data_ptr<int64_t>();
  b.block_tables = indices->tables.data_ptr<int32_t>();
  b.table_width = indices->tables.size(1);
  b.context_lens = indices->context_lens.data_ptr<int64_t>();
  b.logits = logits.data_ptr<float>();
  b.reverse_head = (fused_steps_++ & 1) != 0; // NOTE [alternating head order]
  view->isa = decode_isa_;
  if (choice.panels && decode_panels_ != kernels::cpu::panels_mode::off)
    with_panels(*view, packed_weights(state));
  kernels::cpu::fused_decode(*view, b, *team_);
  return tp_.active() ? tp_gather_last(logits, config_.vocab_size, tp_) : logits;
}

// NOTE [tensor-parallel decode]: a TP rank's inference engine runs the same
// requests as its peers, step for step: its paged forward computes its
// query heads over the kv heads it holds (its KV pool holds those), the
// row-parallel products are summed over the group, and the logits are
// gathered whole, so every rank's sampler sees the same bits and draws the
// same tokens from the same seeds. A whole checkpoint loads into a rank's
// part (assign_hf_weights cuts each parameter by tp_slice_of). The fused
// CPU decode runs on a rank's part when its kv heads are split (NOTE
// [tensor-parallel fused decode] in kernels/cpu/fused_decode.hpp); with
// replicated kv heads a step takes the ATen path.
torch::Tensor llama_model_impl::forward_paged(const paged_batch& batch, paged_kv_cache& cache,
                                              const torch::Tensor& logit_rows) {
  TORCH_CHECK(!pp_.active(), "a pipeline stage (pp ", pp_.size, ") does not decode");
  throw_if(check_paged_step(config_, head_, layers_->size(), cached_kv_heads_, batch, cache,
                            logit_rows));
  torch::NoGradGuard no_grad;
  if (batch_invariant_) {
    last_decode_ = {one_token_each(batch, logit_rows), false, "the batch-invariant path"};
    return batch_invariant_step(*this, batch, cache, logit_rows);
  }
  if (auto logits = fused_step(batch, cache, logit_rows); logits.defined())
    return logits;
  auto aten = [&](const paged_batch& b, const torch::Tensor& logit_rows_of_b) {
    auto x = embed(b.input_ids); // [N, hidden]
    auto rope = rotary_for_layer0(layers_, b.positions, x.scalar_type());
    for (size_t i = 0; i < layers_->size(); ++i)
      x = layers_[i]->as<block_impl>()->forward_paged(x, rope, b, cache, i);
    // The kernels validated query_start: its rows 1..R minus one are each
    // request's last new token.
    auto rows = logit_rows_of_b.defined() ? logit_rows_of_b : b.query_start.slice(0, 1) - 1;
    rows = rows.to(x.device(), torch::kLong);
    auto h = norm_->as<rms_norm_impl>()->forward(x.index_select(0, rows));
    auto logits = apply_head(h, torch::Tensor{});
    // Under TP the sampler sees the whole vocabulary (NOTE [tensor-parallel
    // decode]): every rank the same bits, so every rank samples alike.
    return tp_.active() ? tp_gather_last(logits, config_.vocab_size, tp_) : logits;
  };
  // NOTE [mixed steps] (one process: TP ranks keep one path per step).
  if (!last_decode_.decode && !tp_.active())
    if (auto split = split_mixed_step(batch, logit_rows)) {
      if (auto d = fused_step(split->decode, cache, torch::Tensor{}); d.defined())
        return split->join(d, aten(split->prefill, split->prefill_rows));
      // The kernel declined the decode rows, and last_decode_ says why.
    }
  return aten(batch, logit_rows);
}

torch::Tensor llama_model_impl::hidden_states(const torch::Tensor& input_ids,
                                              const torch::Tensor& attention_mask,
                                              kv_cache* cache) {
  TORCH_CHECK(!pp_.active(), "a pipeline stage (pp ", pp_.size, ") runs forward_stage");
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [batch, tokens], got ", input_ids.sizes());
  auto x = run_layers(embed(input_ids), input_ids, attention_mask, cache);
  return norm_->as<rms_norm_impl>()->forward(x);
}

torch::Tensor llama_model_impl::run_layers(torch::Tensor x, const torch::Tensor& input_ids,
                                           const torch::Tensor& attention_mask, kv_cache* cache) {
  auto B = input_ids.size(0);
  auto T = input_ids.size(1);
  auto bool_opts = torch::TensorOptions().dtype(torch::kBool).device(input_ids.device());
  auto mask =
      attention_mask.defined() ? attention_mask.to(torch::kBool) : torch::ones({B, T}, bool_opts);
  TORCH_CHECK(mask.sizes() == input_ids.sizes(), "attention_mask ", mask.sizes(),
              " does not match input_ids ", input_ids.sizes());
  auto counts = mask.to(torch::kLong).cumsum(1); // real tokens so far, inclusive
  torch::Tensor positions;
  torch::Tensor key_mask;
  if (cache != nullptr) {
    TORCH_CHECK(cache->keys.size() == layers_->size(), "kv cache has ", cache->keys.size(),
                " layers, model has ", layers_->size());
    TORCH_CHECK(cache->key_mask.size(0) == B, "kv cache batch ", cache->key_mask.size(0),
                " does not match input batch ", B);
    TORCH_CHECK(cache->length + T <= cache->capacity, "kv cache overflow: ", cache->length, " + ",
                T, " tokens > capacity ", cache->capacity);
    positions = (cache->next_position.unsqueeze(1) + counts - 1).clamp_min(0);
    cache->key_mask.narrow(1, cache->length, T).copy_(mask);
    key_mask = cache->key_mask.narrow(1, 0, cache->length + T);
  } else {
    positions = (counts - 1).clamp_min(0);
    key_mask = mask;
  }
  const auto first = static_cast<size_t>(pp_.active() ? pp_.layer0 : 0);
  const auto end = pp_.active() ? first + static_cast<size_t>(pp_.layers) : layers_->size();
  auto rope =
      rotary_tables(positions, layers_[first]->as<block_impl>()->attn->inv_freq, x.scalar_type());
  TORCH_CHECK(!hooks_ || cache == nullptr,
              "a model with layer hooks (a zero3 training engine) does not run with a KV cache");
  for (size_t i = first; i < end; ++i) {
    auto* block = layers_[i]->as<block_impl>();
    if (hooks_)
      x = hooks_->run_layer(i, x, [block, rope, key_mask, i](const torch::Tensor& in) {
        return block->forward(in, rope, key_mask, nullptr, i);
      });
    else
      x = block->forward(x, rope, key_mask, cache, i);
  }
  if (cache != nullptr) {
    cache->length += T;
    cache->next_position += counts.select(1, T - 1);
  }
  return x;
}

namespace {

// NOTE [layer hooks]: a pass begins with begin_forward and, without a
// backward to come, ends with end_forward (also when it throws).
template <class Fn>
torch::Tensor hooked_pass(layer_hooks* hooks, Fn&& pass) {
  if (!hooks)
    return pass();
  hooks->begin_forward();
  struct end_guard {
    layer_hooks* hooks;
    ~end_guard() {
      if (!torch::GradMode::is_enabled())
        hooks->end_forward();
    }
  } end{hooks};
  return pass();
}

} // namespace

torch::Tensor llama_model_impl::forward_stage(const torch::Tensor& input_ids,
                                              const torch::Tensor& attention_mask,
                                              const torch::Tensor& input) {
  if (!pp_.active())
    return forward(input_ids, attention_mask);
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [batch, tokens], got ", input_ids.sizes());
  TORCH_CHECK(pp_.first() != input.defined(), "pipeline stage ", pp_.rank,
              pp_.first() ? " embeds the ids and takes no input"
                          : " takes the previous stage's hidden states");
  if (input.defined())
    TORCH_CHECK(input.dim() == 3 && input.size(0) == input_ids.size(0) &&
                    input.size(1) == input_ids.size(1) && input.size(2) == config_.hidden_size,
                "pipeline stage ", pp_.rank, ": input ", input.sizes(), " for input_ids ",
                input_ids.sizes(), " and hidden size ", config_.hidden_size);
  return hooked_pass(hooks_, [&] {
    auto x = run_layers(pp_.first() ? embed(input_ids) : input, input_ids, attention_mask, nullptr);
    if (!pp_.last())
      return x;
    return apply_head(norm_->as<rms_norm_impl>()->forward(x), attention_mask);
  });
}

torch::Tensor llama_model_impl::apply_head(const torch::Tensor& hidden,
                                           const torch::Tensor& attention_mask) {
  switch (head_) {
  case head_kind::lm:
    // linear, not matmul(h, W.t()): 4-5x faster on CPU. Under TP, this
    // rank's part of the vocabulary (NOTE [tensor parallelism]).
    return dense(tp_copy(hidden, tp_), output_ ? output_->weight : tok_embeddings_->weight);
  case head_kind::value: // scores in fp32 whatever the weights' dtype (bf16: NOTE [mixed
                         // precision])
    return score_head_->forward(hidden).squeeze(-1).to(torch::kFloat32);
  case head_kind::reward: {
    auto T = hidden.size(1);
    torch::Tensor last;
    if (attention_mask.defined()) {
      auto idx =
          torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(hidden.device()));
      last = (attention_mask.to(torch::kLong) * idx).argmax(1);
    } else {
      last = torch::full({hidden.size(0)}, T - 1,
                         torch::TensorOptions().dtype(torch::kLong).device(hidden.device()));
    }
    auto h = hidden.index({torch::arange(hidden.size(0), last.options()), last});
    return score_head_->forward(h).squeeze(-1).to(torch::kFloat32);
  }
  }
  return hidden;
}

torch::Tensor llama_model_impl::forward(const torch::Tensor& input_ids,
                                        const torch::Tensor& attention_mask, kv_cache* cache) {
  return hooked_pass(hooks_, [&] {
    return apply_head(hidden_states(input_ids, attention_mask, cache), attention_mask);
  });
}

std::map<std::string, torch::Tensor> llama_model_impl::named_weights() const {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : named_parameters())
    out.emplace(p.key(), p.value());
  return out;
}

expected<llama_model> make_llama(const llama_config& config, head_kind head, tp_partition tp,
                                 pp_stage pp) {
  if (auto ok = validate(config); !ok)
    return ok.error();
  if (tp.active() && tp.group == nullptr)
    return make_error(errc::invalid_argument,
                      "make_llama: tp " + std::to_string(tp.size) + " without its process group");
  if (pp.active() && pp.group == nullptr)
    return make_error(errc::invalid_argument,
                      "make_llama: pp " + std::to_string(pp.size) + " without its process group");
  if (pp.active() &&
      (pp.layer0 < 0 || pp.layers < 1 || pp.layer0 + pp.layers > config.num_hidden_layers))
    return make_error(errc::invalid_argument, "make_llama: stage " + std::to_string(pp.rank) +
                                                  " of pp " + std::to_string(pp.size) +
                                                  " (make it with stage_of)");
  return guarded("building the model", [&] { return llama_model(config, head, tp, pp); });
}

expected<llama_model> make_model_part(const llama_model& dense, const tp_partition& p,
                                      const pp_stage& pp) {
  auto part = make_llama(dense->config(), dense->head(), p, pp);
  if (!part)
    return part;
  auto shards = tp_shard_weights(dense->named_weights(), dense->config(), p);
  if (!shards)
    return shards.error();
  return guarded("cutting the model's tensor-parallel part", [&] {
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : (*part)->named_weights())
      t.copy_(shards->at(name));
    (*part)->train(dense->is_training());
    return *part;
  });
}

expected<torch::Tensor> run_forward(llama_model& model, const torch::Tensor& input_ids,
                                    const torch::Tensor& attention_mask, kv_cache* cache) {
  return guarded("model forward", [&] { return model->forward(input_ids, attention_mask, cache); });
}

expected<torch::Tensor> run_forward_paged(llama_model& model, const paged_batch& batch,
                                          paged_kv_cache& cache, const torch::Tensor& logit_rows) {
  return guarded("paged forward", [&]() -> expected<torch::Tensor> {
    try {
      return model->forward_paged(batch, cache, logit_rows);
    } catch (const paged_error& e) {
      return e.error();
    }
  });
}

// ---- weight names -----------------------------------------------------------

namespace {

struct name_rule {
  const char* troupe;
  const char* hf;
};

// Per-layer names, relative to "layers.{i}." / "model.layers.{i}.".
constexpr name_rule layer_rules[] = {
    {"attention.wq.", "self_attn.q_proj."},     {"attention.wk.", "self_attn.k_proj."},
    {"attention.wv.", "self_attn.v_proj."},     {"attention.wo.", "self_attn.o_proj."},
    {"feed_forward.w1.", "mlp.gate_proj."},     {"feed_forward.w3.", "mlp.up_proj."},
    {"feed_forward.w2.", "mlp.down_proj."},     {"attention_norm.", "input_layernorm."},
    {"ffn_norm.", "post_attention_layernorm."},
};

bool starts_with(const std::string& s, std::string_view prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

/// Splits "<prefix><digits>.<rest>" into index and rest.
bool split_layer(const std::string& name, std::string_view prefix, std::string& index,
                 std::string& rest) {
  if (!starts_with(name, prefix))
    return false;
  auto dot = name.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size())
    return false;
  index = name.substr(prefix.size(), dot - prefix.size());
  for (char ch : index)
    if (ch < '0' || ch > '9')
      return false;
  rest = name.substr(dot + 1);
  return true;
}

std::string head_prefix(head_kind head) {
  return head == head_kind::value ? "value_head." : "reward_head.";
}

} // namespace

expected<std::string> to_hf_name(const std::string& name, head_kind head) {
  if (name == "tok_embeddings.weight")
    return std::string{"model.embed_tokens.weight"};
  if (name == "norm.weight")
    return std::string{"model.norm.weight"};
  if (head == head_kind::lm && name == "output.weight")
    return std::string{"lm_head.weight"};
  if (head != head_kind::lm && starts_with(name, head_prefix(head)))
    return "score." + name.substr(head_prefix(head).size());
  std::string index, rest;
  if (split_layer(name, "layers.", index, rest))
    for (const auto& rule : layer_rules)
      if (starts_with(rest, rule.troupe))
        return "model.layers." + index + "." + rule.hf + rest.substr(std::strlen(rule.troupe));
  return make_error(errc::not_found, "no HF name for troupe parameter '" + name + "'");
}

expected<std::string> from_hf_name(const std::string& name, head_kind head) {
  if (name == "model.embed_tokens.weight")
    return std::string{"tok_embeddings.weight"};
  if (name == "model.norm.weight")
    return std::string{"norm.weight"};
  if (head == head_kind::lm && name == "lm_head.weight")
    return std::string{"output.weight"};
  if (head != head_kind::lm && starts_with(name, "score."))
    return head_prefix(head) + name.substr(6);
  std::string index, rest;
  if (split_layer(name, "model.layers.", index, rest))
    for (const auto& rule : layer_rules)
      if (starts_with(rest, rule.hf))
        return "layers." + index + "." + rule.troupe + rest.substr(std::strlen(rule.hf));
  return make_error(errc::not_found, "unexpected HF tensor '" + name + "'");
}

std::string hf_architecture(const llama_config& config, head_kind head) {
  auto family = config.architecture;
  for (const char* suffix :
       {"ForCausalLM", "ForTokenClassification", "ForSequenceClassification"}) {
    auto pos = family.rfind(suffix);
    if (pos != std::string::npos && pos + std::strlen(suffix) == family.size()) {
      family = family.substr(0, pos);
      break;
    }
  }
  switch (head) {
  case head_kind::lm:
    return family + "ForCausalLM";
  case head_kind::value:
    return family + "ForTokenClassification";
  case head_kind::reward:
    return family + "ForSequenceClassification";
  }
  return family + "ForCausalLM";
}

namespace {

// A tensor-parallel rank's part of `tensor` when it is the whole parameter
// `name` (a whole checkpoint into a part: NOTE [tensor parallelism]), else
// `tensor` (already the part, or a shape the caller reports).
torch::Tensor whole_or_part(const std::string& name, const torch::Tensor& tensor,
                            const llama_model_impl& model) {
  const auto& tp = model.tp();
  const auto s = tp_slice_of(name, model.config(), tp);
  if (s.replicated() || s.dim >= tensor.dim())
    return tensor;
  const auto n = tensor.size(s.dim);
  return n != s.end - s.begin && n >= s.end ? tensor.narrow(s.dim, s.begin, s.end - s.begin)
                                            : tensor;
}

} // namespace

expected<void> assign_hf_weights(llama_model& model,
                                 const std::map<std::string, torch::Tensor>& hf_tensors,
                                 bool allow_missing_head) {
  auto params = model->named_weights();
  auto head = model->head();
  std::map<std::string, torch::Tensor> mapped;
  std::vector<std::string> unexpected;
  for (const auto& [hf, tensor] : hf_tensors) {
    if (hf.find("rotary_emb.inv_freq") != std::string::npos)
      continue; // a buffer some exporters write; recomputed here
    auto name = from_hf_name(hf, head);
    if (!name || params.count(*name) == 0) {
      // A policy checkpoint's lm_head is ignored by value/reward models, and
      // lm_head is redundant when embeddings are tied.
      if (hf == "lm_head.weight" && (head != head_kind::lm || model->config().tie_word_embeddings))
        continue;
      // A pipeline stage takes what it holds of a whole checkpoint.
      if (name && model->pp().active())
        continue;
      unexpected.push_back(hf);
      continue;
    }
    mapped.emplace(*name, whole_or_part(*name, tensor, *model));
  }
  auto name_list = [](const std::vector<std::string>& names) {
    std::string list;
    for (size_t i = 0; i < names.size() && i < 8; ++i)
      list += (i ? ", " : "") + names[i];
    if (names.size() > 8)
      list += ", ... (" + std::to_string(names.size()) + " in all)";
    return list;
  };
  if (!unexpected.empty())
    return make_error(errc::not_found,
                      "unexpected tensors in checkpoint: " + name_list(unexpected));
  std::vector<std::string> missing;
  for (const auto& [name, param] : params) {
    auto hf = to_hf_name(name, head);
    auto shown = hf ? *hf : name;
    auto it = mapped.find(name);
    if (it == mapped.end()) {
      bool is_head = starts_with(name, "value_head.") || starts_with(name, "reward_head.");
      if (!(is_head && allow_missing_head))
        missing.push_back(shown);
      continue;
    }
    if (it->second.sizes() != param.sizes()) {
      std::ostringstream os;
      os << "tensor '" << shown << "' has shape " << it->second.sizes() << ", the model expects "
         << param.sizes();
      return make_error(errc::shape_mismatch, os.str());
    }
  }
  if (!missing.empty())
    return make_error(errc::not_found, "checkpoint lacks tensors: " + name_list(missing));
  return guarded("copying weights", [&] {
    torch::NoGradGuard no_grad;
    for (auto& [name, src] : mapped)
      if (!src.is_same(params.at(name)) && src.data_ptr() != params.at(name).data_ptr())
        params.at(name).copy_(src); // read in place already otherwise
    model->drop_decode_panels();
  });
}

std::map<std::string, torch::Tensor> export_hf_weights(const llama_model& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, tensor] : model->named_weights()) {
    auto hf = to_hf_name(name, model->head());
    // Every registered parameter has a mapping; a miss is a programming error.
    TORCH_INTERNAL_ASSERT(static_cast<bool>(hf), "unmapped parameter ", name);
    out.emplace(*hf, tensor.detach().to(torch::kCPU).contiguous().clone());
  }
  return out;
}

expected<llama_model> load_pretrained(const std::string& dir, head_kind head,
                                      bool allow_missing_head) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return make_error(errc::not_found, "no such checkpoint directory: " + dir);
  auto config = load_hf_config((std::filesystem::path{dir} / hf_config_file).string());
  if (!config)
    return config.error();
  auto model = make_llama(*config, head);
  if (!model)
    return with_prefix(model.error(), dir);
  // The stored tensors are read straight into the parameters they map to
  // (one copy of the weights in memory, not two).
  std::map<std::string, torch::Tensor> by_hf_name;
  for (auto& [name, param] : (*model)->named_weights())
    if (auto hf = to_hf_name(name, head))
      by_hf_name.emplace(*hf, param);
  auto tensors = load_hf_weights(dir, [&](const std::string& hf) {
    auto it = by_hf_name.find(hf);
    return it == by_hf_name.end() ? torch::Tensor{} : it->second.detach();
  });
  if (!tensors)
    return tensors.error();
  if (auto ok = assign_hf_weights(*model, *tensors, allow_missing_head); !ok)
    return with_prefix(ok.error(), dir);
  return model;
}

expected<void> save_pretrained(const llama_model& model, const std::string& dir,
                               uint64_t max_shard_bytes) {
  auto tensors = guarded("exporting weights", [&] { return export_hf_weights(model); });
  if (!tensors)
    return tensors.error();
  return save_exported(model, dir, *tensors, max_shard_bytes);
}

expected<void> save_exported(const llama_model& model, const std::string& dir,
                             const std::map<std::string, torch::Tensor>& hf_tensors,
                             uint64_t max_shard_bytes) {
  auto config = model->config();
  config.architecture = hf_architecture(config, model->head());
  return save_hf_checkpoint_dir(dir, config, hf_tensors, max_shard_bytes);
}

} // namespace troupe::models
