#include "models/batch_invariant.hpp"

#include "kernels/cpu/invariant.hpp"
#include "kernels/cpu/softmax_row.hpp"
#include "runtime/torch_guard.hpp"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace troupe::models {

namespace {

using kernels::cpu::invariant_kernels;

const float* floats(const torch::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

/// The raw weights of one layer (biases may be null).
struct layer_weights {
  const float *attention_norm, *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo;
  const float *ffn_norm, *w1, *b1, *w2, *b2, *w3, *b3;
};

/// The model's weights as the kernels read them. Holds the tensors, so the
/// pointers stay valid while it lives.
struct model_weights {
  std::map<std::string, torch::Tensor> named;
  const float *embed = nullptr, *norm = nullptr, *head = nullptr;
  std::vector<layer_weights> layers;

  explicit model_weights(const llama_model_impl& m) : named(m.named_weights()) {
    embed = at("tok_embeddings.weight");
    norm = at("norm.weight");
    head = m.config().tie_word_embeddings ? embed : at("output.weight");
    for (int64_t i = 0; i < m.config().num_hidden_layers; ++i) {
      const auto p = "layers." + std::to_string(i) + ".";
      auto w = [&](const std::string& n) { return at(p + n + ".weight"); };
      auto b = [&](const std::string& n) { return bias(p + n + ".bias"); };
      layers.push_back({w("attention_norm"), w("attention.wq"), b("attention.wq"),
                        w("attention.wk"), b("attention.wk"), w("attention.wv"), b("attention.wv"),
                        w("attention.wo"), b("attention.wo"), w("ffn_norm"), w("feed_forward.w1"),
                        b("feed_forward.w1"), w("feed_forward.w2"), b("feed_forward.w2"),
                        w("feed_forward.w3"), b("feed_forward.w3")});
    }
  }
  const float* at(const std::string& name) const {
    auto it = named.find(name);
    TORCH_CHECK(it != named.end(), "batch-invariant forward: the model has no ", name);
    const auto& t = it->second;
    TORCH_CHECK(t.scalar_type() == torch::kFloat32 && t.device().is_cpu() && t.is_contiguous(),
                "batch-invariant forward: ", name, " is not a dense fp32 CPU tensor");
    return floats(t);
  }
  const float* bias(const std::string& name) const {
    return named.count(name) ? at(name) : nullptr;
  }
};

/// The model's shape as the step uses it.
struct shape {
  int64_t hidden, inter, heads, kv_heads, head_dim, vocab, layers;
  float eps;
  explicit shape(const llama_config& c)
      : hidden(c.hidden_size), inter(c.intermediate_size), heads(c.num_attention_heads),
        kv_heads(c.num_key_value_heads), head_dim(c.resolved_head_dim()), vocab(c.vocab_size),
        layers(c.num_hidden_layers), eps(static_cast<float>(c.rms_norm_eps)) {}
  int64_t q_width() const { return heads * head_dim; }
  int64_t kv_width() const { return kv_heads * head_dim; }
};

/// y [rows, outputs] = x [rows, n] · Wᵀ (+ bias), outputs split over threads.
void linear(const invariant_kernels& k, const float* x, int64_t rows, int64_t n, const float* w,
            const float* bias, int64_t outputs, float* y) {
  // A grain of whole tiles (3 outputs) big enough to amortise a task.
  const int64_t grain = std::max<int64_t>(3, (3 * 16384) / std::max<int64_t>(1, rows * n / 64));
  at::parallel_for(0, outputs, grain, [&](int64_t o0, int64_t o1) {
    k.linear(x, n, rows, n, w, bias, y, outputs, o0, o1);
  });
}

/// Each row of x [rows, n] normalised into y.
void rms_rows(const invariant_kernels& k, const float* x, int64_t rows, int64_t n,
              const float* weight, float eps, float* y) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      k.rms_norm(x + r * n, n, weight, eps, y + r * n);
  });
}

/// The step's requests as the attention walks them: each token's request,
/// how many keys it reads, and each request's slots in position order.
struct step_layout {
  std::vector<int64_t> request_of, keys_of;
  std::vector<std::vector<int64_t>> slots;
  int64_t longest = 0;
};

step_layout layout_of(const paged_batch& b, int64_t block_size, int64_t num_blocks) {
  auto qs = b.query_start.to(torch::kCPU, torch::kLong).contiguous();
  auto ctx = b.context_lens.to(torch::kCPU, torch::kLong).contiguous();
  auto tables = b.block_tables.to(torch::kCPU, torch::kLong).contiguous();
  TORCH_CHECK(tables.dim() == 2, "batch-invariant step: block_tables ", tables.sizes(),
              " must be [requests, blocks]");
  auto table = tables.accessor<int64_t, 2>();
  const int64_t R = ctx.size(0), N = b.input_ids.size(0);
  TORCH_CHECK(qs.dim() == 1 && qs.size(0) == R + 1 && tables.size(0) == R,
              "batch-invariant step: query_start ", qs.sizes(), ", context_lens ", ctx.sizes(),
              " and block_tables ", tables.sizes(), " do not describe one set of requests");
  const auto* q = qs.data_ptr<int64_t>();
  const auto* c = ctx.data_ptr<int64_t>();
  TORCH_CHECK(q[0] == 0 && q[R] == N, "batch-invariant step: query_start must run from 0 to ", N);
  step_layout out;
  out.request_of.resize(static_cast<size_t>(N));
  out.keys_of.resize(static_cast<size_t>(N));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t n = q[r + 1] - q[r];
    TORCH_CHECK(n >= 1 && c[r] >= n && c[r] <= tables.size(1) * block_size,
                "batch-invariant step: request ", r, " has ", n, " new tokens and a context of ",
                c[r], " (", tables.size(1), " blocks of ", block_size, ")");
    std::vector<int64_t> slots(static_cast<size_t>(c[r]));
    for (int64_t j = 0; j < c[r]; ++j) {
      const int64_t block = table[r][j / block_size];
      TORCH_CHECK(block >= 0 && block < num_blocks, "batch-invariant step: request ", r,
                  " names block ", block, " of ", num_blocks);
      slots[static_cast<size_t>(j)] = block * block_size + j % block_size;
    }
    out.slots.push_back(std::move(slots));
    for (int64_t i = 0; i < n; ++i) {
      out.request_of[static_cast<size_t>(q[r] + i)] = r;
      out.keys_of[static_cast<size_t>(q[r] + i)] = c[r] - (n - 1 - i); // itself and before
    }
    out.longest = std::max(out.longest, c[r]);
  }
  return out;
}

/// cos / sin [N, head_dim / 2] of each token's position.
std::pair<std::vector<float>, std::vector<float>> rope_tables(const llama_config& c,
                                                              const torch::Tensor& positions) {
  const auto inv = rope_inv_freq(c);
  const int64_t half = static_cast<int64_t>(inv.size());
  auto pos = positions.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t N = pos.size(0);
  std::vector<float> cos(static_cast<size_t>(N * half)), sin(cos.size());
  const auto* p = pos.data_ptr<int64_t>();
  for (int64_t t = 0; t < N; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float f = static_cast<float>(p[t]) * static_cast<float>(inv[static_cast<size_t>(i)]);
      cos[static_cast<size_t>(t * half + i)] = std::cos(f);
      sin[static_cast<size_t>(t * half + i)] = std::sin(f);
    }
  return {std::move(cos), std::move(sin)};
}

/// The scratch rows of a step of N tokens.
struct activations {
  std::vector<float> x, normed, q, k, v, attended, out, gate, up;
  activations(const shape& s, int64_t N)
      : x(static_cast<size_t>(N * s.hidden)), normed(x.size()),
        q(static_cast<size_t>(N * s.q_width())), k(static_cast<size_t>(N * s.kv_width())),
        v(k.size()), attended(q.size()), out(x.size()), gate(static_cast<size_t>(N * s.inter)),
        up(gate.size()) {}
};

void add_into(std::vector<float>& x, const std::vector<float>& y) {
  for (size_t i = 0; i < x.size(); ++i)
    x[i] += y[i];
}

/// One layer's attention half: the new tokens' K/V written to the pools,
/// every token's heads over its keys, the output projection added to x.
void attention_layer(const invariant_kernels& k, const shape& s, const layer_weights& w,
                     const step_layout& lay, const std::vector<float>& cos,
                     const std::vector<float>& sin, const int64_t* slot_of, float* k_pool,
                     float* v_pool, activations& a) {
  const int64_t N = static_cast<int64_t>(lay.request_of.size()), D = s.head_dim, half = D / 2;
  rms_rows(k, a.x.data(), N, s.hidden, w.attention_norm, s.eps, a.normed.data());
  linear(k, a.normed.data(), N, s.hidden, w.wq, w.bq, s.q_width(), a.q.data());
  linear(k, a.normed.data(), N, s.hidden, w.wk, w.bk, s.kv_width(), a.k.data());
  linear(k, a.normed.data(), N, s.hidden, w.wv, w.bv, s.kv_width(), a.v.data());
  const int64_t kvw = s.kv_width();
  at::parallel_for(0, N, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* c = cos.data() + t * half;
      const float* sn = sin.data() + t * half;
      for (int64_t h = 0; h < s.heads; ++h)
        k.rope(a.q.data() + t * s.q_width() + h * D, D, c, sn);
      for (int64_t h = 0; h < s.kv_heads; ++h)
        k.rope(a.k.data() + t * kvw + h * D, D, c, sn);
      std::memcpy(k_pool + slot_of[t] * kvw, a.k.data() + t * kvw, sizeof(float) * kvw);
      std::memcpy(v_pool + slot_of[t] * kvw, a.v.data() + t * kvw, sizeof(float) * kvw);
    }
  });
  const int64_t group = s.heads / s.kv_heads;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  at::parallel_for(0, N * s.heads, 4, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(static_cast<size_t>(lay.longest));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / s.heads, h = i % s.heads, kvh = h / group;
      const auto& slots = lay.slots[static_cast<size_t>(lay.request_of[static_cast<size_t>(t)])];
      k.attend(a.q.data() + t * s.q_width() + h * D, D, k_pool + kvh * D, v_pool + kvh * D, kvw,
               slots.data(), lay.keys_of[static_cast<size_t>(t)], scale, scores.data(),
               a.attended.data() + t * s.q_width() + h * D);
    }
  });
  linear(k, a.attended.data(), N, s.q_width(), w.wo, w.bo, s.hidden, a.out.data());
  add_into(a.x, a.out);
}

/// One layer's MLP half: x += W2 · (silu(W1 · n) ⊙ (W3 · n)), n = norm(x).
void mlp_layer(const invariant_kernels& k, const shape& s, const layer_weights& w, int64_t N,
               activations& a) {
  rms_rows(k, a.x.data(), N, s.hidden, w.ffn_norm, s.eps, a.normed.data());
  linear(k, a.normed.data(), N, s.hidden, w.w1, w.b1, s.inter, a.gate.data());
  linear(k, a.normed.data(), N, s.hidden, w.w3, w.b3, s.inter, a.up.data());
  at::parallel_for(0, N, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      k.swiglu(a.gate.data() + t * s.inter, a.up.data() + t * s.inter, s.inter,
               a.gate.data() + t * s.inter);
  });
  linear(k, a.gate.data(), N, s.inter, w.w2, w.b2, s.hidden, a.out.data());
  add_into(a.x, a.out);
}

} // namespace

std::string batch_invariant_unsupported(const llama_model_impl& model) {
  if (model.head() != head_kind::lm)
    return "it needs an lm head";
  if (model.tp().active())
    return "tensor parallelism splits its reductions over ranks";
  if (model.pp().active())
    return "a pipeline stage holds only some layers";
  for (const auto& [name, t] : model.named_weights()) {
    if (t.scalar_type() != torch::kFloat32)
      return name + " is " + std::string{c10::toString(t.scalar_type())} + ", not fp32";
    if (!t.device().is_cpu())
      return name + " is on " + t.device().str() + ", not the CPU";
    if (t.numel() == 0)
      return name + " is empty (a ZeRO-3 shard at rest)";
  }
  return {};
}

torch::Tensor batch_invariant_step(const llama_model_impl& model, const paged_batch& batch,
                                   paged_kv_cache& cache, const torch::Tensor& logit_rows) {
  const auto why = batch_invariant_unsupported(model);
  TORCH_CHECK(why.empty(), "batch-invariant step: ", why);
  const auto& k = kernels::cpu::invariant_kernels_here();
  const shape s(model.config());
  const model_weights w(model);
  const int64_t N = batch.input_ids.size(0);
  const auto lay = layout_of(batch, cache.block_size, cache.num_blocks);
  const auto [cos, sin] = rope_tables(model.config(), batch.positions);
  auto ids = batch.input_ids.to(torch::kCPU, torch::kLong).contiguous();
  auto slots = batch.slot_mapping.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t capacity = cache.num_blocks * cache.block_size;
  for (int64_t t = 0; t < N; ++t)
    TORCH_CHECK(slots.data_ptr<int64_t>()[t] >= 0 && slots.data_ptr<int64_t>()[t] < capacity,
                "batch-invariant step: slot ", slots.data_ptr<int64_t>()[t],
                " outside the pool of ", capacity);
  activations a(s, N);
  for (int64_t t = 0; t < N; ++t)
    std::memcpy(a.x.data() + t * s.hidden, w.embed + ids.data_ptr<int64_t>()[t] * s.hidden,
                sizeof(float) * s.hidden);
  for (int64_t l = 0; l < s.layers; ++l) {
    const auto& lw = w.layers[static_cast<size_t>(l)];
    attention_layer(k, s, lw, lay, cos, sin, slots.data_ptr<int64_t>(),
                    cache.k[static_cast<size_t>(l)].data_ptr<float>(),
                    cache.v[static_cast<size_t>(l)].data_ptr<float>(), a);
    mlp_layer(k, s, lw, N, a);
  }
  auto rows = logit_rows.defined()
                  ? logit_rows.to(torch::kCPU, torch::kLong).contiguous()
                  : (batch.query_start.slice(0, 1) - 1).to(torch::kCPU, torch::kLong);
  rows = rows.contiguous();
  const int64_t M = rows.size(0);
  std::vector<float> last(static_cast<size_t>(M * s.hidden));
  for (int64_t m = 0; m < M; ++m)
    k.rms_norm(a.x.data() + rows.data_ptr<int64_t>()[m] * s.hidden, s.hidden, w.norm, s.eps,
               last.data() + m * s.hidden);
  auto logits = torch::empty({M, s.vocab}, torch::kFloat32);
  linear(k, last.data(), M, s.hidden, w.head, nullptr, s.vocab, logits.data_ptr<float>());
  return logits;
}

namespace {

/// A padded batch as one paged prefill: each row's real tokens a request.
struct packed_rows {
  paged_batch batch;
  std::vector<int64_t> column_of; // each token's column in its row
  std::vector<int64_t> row_of;
  int64_t blocks = 0;
};

packed_rows pack_rows(const torch::Tensor& ids, const torch::Tensor& mask, int64_t block_size) {
  const int64_t B = ids.size(0), T = ids.size(1);
  auto id = ids.accessor<int64_t, 2>();
  auto m = mask.accessor<int64_t, 2>();
  packed_rows p;
  std::vector<int64_t> tokens, positions, slots, query_start{0}, context;
  std::vector<std::vector<int64_t>> tables;
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (m[b][t] == 0)
        continue;
      tokens.push_back(id[b][t]);
      positions.push_back(n);
      slots.push_back(p.blocks * block_size + n);
      p.column_of.push_back(t);
      p.row_of.push_back(b);
      ++n;
    }
    if (n == 0)
      continue; // a row of padding only: no request, its log-probs stay 0
    const int64_t blocks = (n + block_size - 1) / block_size;
    std::vector<int64_t> table;
    for (int64_t i = 0; i < blocks; ++i)
      table.push_back(p.blocks + i);
    p.blocks += blocks;
    tables.push_back(std::move(table));
    context.push_back(n);
    query_start.push_back(static_cast<int64_t>(tokens.size()));
  }
  size_t widest = 0;
  for (const auto& t : tables)
    widest = std::max(widest, t.size());
  const auto requests = static_cast<int64_t>(tables.size());
  auto block_tables = torch::zeros({requests, static_cast<int64_t>(widest)}, torch::kLong);
  auto bt = block_tables.accessor<int64_t, 2>();
  for (int64_t r = 0; r < requests; ++r)
    for (size_t i = 0; i < tables[static_cast<size_t>(r)].size(); ++i)
      bt[r][static_cast<int64_t>(i)] = tables[static_cast<size_t>(r)][i];
  auto vec = [](const std::vector<int64_t>& v) { return torch::tensor(v, torch::kLong); };
  p.batch = {vec(tokens), vec(positions), vec(slots), block_tables, vec(context), vec(query_start)};
  return p;
}

} // namespace

expected<torch::Tensor> batch_invariant_log_probs(const llama_model_impl& model,
                                                  const torch::Tensor& input_ids,
                                                  const torch::Tensor& attention_mask,
                                                  double temperature, const torch::Tensor& want) {
  if (auto why = batch_invariant_unsupported(model); !why.empty())
    return make_error(errc::unsupported, "batch-invariant log-probs: " + why);
  return guarded("batch-invariant log-probs", [&]() -> torch::Tensor {
    torch::NoGradGuard no_grad;
    auto ids = input_ids.to(torch::kCPU, torch::kLong).contiguous();
    auto mask = attention_mask.defined() ? attention_mask.to(torch::kCPU, torch::kLong).contiguous()
                                         : torch::ones_like(ids);
    TORCH_CHECK(ids.dim() == 2 && ids.size(1) >= 2 && mask.sizes() == ids.sizes(), "input_ids ",
                ids.sizes(), " and attention_mask ", mask.sizes(),
                " must be [batch, tokens >= 2] alike");
    const int64_t B = ids.size(0), T = ids.size(1);
    auto wanted = want.defined() ? want.to(torch::kCPU, torch::kFloat).contiguous()
                                 : torch::ones({B, T - 1}, torch::kFloat);
    TORCH_CHECK(wanted.sizes() == torch::IntArrayRef({B, T - 1}), "want ", wanted.sizes(),
                " must be [batch, tokens - 1]");
    constexpr int64_t kBlock = 16;
    auto packed = pack_rows(ids, mask, kBlock);
    auto cache = model.make_paged_cache(std::max<int64_t>(packed.blocks, 1), kBlock);
    // The rows whose next token is real and wanted.
    auto id = ids.accessor<int64_t, 2>();
    auto m = mask.accessor<int64_t, 2>();
    auto wa = wanted.accessor<float, 2>();
    std::vector<int64_t> rows;
    for (size_t i = 0; i < packed.column_of.size(); ++i) {
      const int64_t b = packed.row_of[i], c = packed.column_of[i];
      if (c + 1 < T && m[b][c + 1] != 0 && wa[b][c] != 0)
        rows.push_back(static_cast<int64_t>(i));
    }
    auto out = torch::zeros({B, T - 1}, torch::kFloat);
    if (rows.empty())
      return out;
    auto logits =
        batch_invariant_step(model, packed.batch, cache, torch::tensor(rows, torch::kLong));
    const int64_t V = logits.size(1);
    // The sampler's row function at the sampler's scale (NOTE
    // [batch-invariant forward]).
    const float scale = temperature > 0 ? static_cast<float>(1.0 / temperature) : 1.0f;
    auto o = out.accessor<float, 2>();
    const float* base = logits.data_ptr<float>();
    at::parallel_for(0, static_cast<int64_t>(rows.size()), 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const auto i = static_cast<size_t>(rows[static_cast<size_t>(r)]);
        const int64_t b = packed.row_of[i], c = packed.column_of[i];
        const float* x = base + r * V;
        auto stats = kernels::detail::softmax_row(x, V, scale, nullptr);
        o[b][c] = stats.argmax < 0 ? std::numeric_limits<float>::quiet_NaN()
                                   : static_cast<float>(kernels::detail::softmax_row_logprob(
                                         stats, x[id[b][c + 1]], scale));
      }
    });
    return out;
  });
}

} // namespace troupe::models
