#include "kernels/cpu/fused_decode.hpp"

#include "kernels/cpu/decode_kernels.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace troupe::kernels::cpu {

// ---- thread_team (NOTE [decode team]) ---------------------------------------------

void thread_team::run(const std::function<void(int, int)>& fn) {
  if (size_ == 1) {
    fn(0, 1);
    return;
  }
#pragma omp parallel num_threads(size_)
  fn(omp_get_thread_num(), omp_get_num_threads());
}

void thread_team::barrier() {
#pragma omp barrier
}

// ---- the step ---------------------------------------------------------------------

namespace {

// out = weight ⊙ x · rsqrt(mean(x²) + eps), in fp32 (the ATen path's order);
// `out` strided by `stride` (1: a row; the batch: k-major).
void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out,
              int64_t stride) {
  double ss = 0; // matches mean() over fp32 closely for these short rows
  for (int64_t i = 0; i < n; ++i)
    ss += static_cast<double>(x[i]) * x[i];
  auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i)
    out[i * stride] = weight[i] * (x[i] * inv);
}

// Rotate-half RoPE of one head in place: for i < D/2 the pair (i, i + D/2)
// turns by the angle position · inv_freq[i], whose cos and sin are given.
void rope(float* v, const float* cos, const float* sin, int64_t head_dim) {
  auto half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    float a = v[i], b = v[i + half];
    v[i] = a * cos[i] - b * sin[i];
    v[i + half] = b * cos[i] + a * sin[i];
  }
}

// [begin, end) of member `t` of `size` over n items (contiguous, balanced).
std::pair<int64_t, int64_t> share(int64_t n, int t, int size) {
  return {n * t / size, n * (t + 1) / size};
}

// NOTE [attention parts]: a request's attention is cut into `parts` parts
// over its positions: one part when the requests are at least the members,
// more, so that every member has work, when they are fewer. Each part gives
// per query head the largest score, the sum of its softmax numerators and
// their weighted sum of V rows (attend_heads), and each member combines
// the parts into its own copy of the attention output before the output
// projection: out = Σ_i e_i o_i / Σ_i e_i sum_i, e_i = exp(scale (max_i −
// M)), M the largest max_i. Cutting by positions rather than by KV heads
// gives each member whole K/V rows: a head's row is a fraction of a slot,
// and members splitting the slots each pulled all of it from memory (at
// batch 1, attention took as long on two members as on one). A part ropes
// its own copy of the query; the part holding the new token's position
// also ropes its key and writes its K/V slot before reading it, and no
// other part reads that slot, so no barrier separates them.
int64_t attention_parts(int64_t requests, int members) {
  return requests >= members ? 1 : (members + requests - 1) / requests;
}

// The step's activations, shared by the team (each member writes only its
// own rows or items of them). The projections' inputs (the normalised
// residual, the combined attention output, the FFN's hidden rows) are token
// rows for the stored weights and k-major for the panels (NOTE [packed
// panels]).
struct activations {
  std::vector<float> x, qkv, h;
  // Under TP (NOTE [tensor-parallel fused decode]): a row-parallel
  // product [size, dim] before its sum over the group.
  std::vector<float> partial;
  // The attention parts of each request (NOTE [attention parts]): outputs
  // [size, parts, q_rows], largest scores and sums [size, parts, n_heads].
  int64_t parts;
  std::vector<float> part_out, part_max, part_sum;
  std::vector<float> cos, sin; // [size, head_dim / 2]: each token's RoPE angles, for every layer
  // The projections' next unclaimed chunk, one counter per projection of
  // the step in order (4 a layer, then the LM head).
  std::vector<std::atomic<int64_t>> next;
  activations(const decode_model& m, const decode_batch& b, int members, int64_t qkv_rows,
              int64_t q_rows)
      : x(static_cast<size_t>(b.size * m.dim)), qkv(static_cast<size_t>(b.size * qkv_rows)),
        h(static_cast<size_t>(b.size * m.hidden)), parts(attention_parts(b.size, members)),
        part_out(static_cast<size_t>(b.size * parts * q_rows)),
        part_max(static_cast<size_t>(b.size * parts * m.n_heads)),
        part_sum(static_cast<size_t>(b.size * parts * m.n_heads)),
        cos(static_cast<size_t>(b.size * m.head_dim / 2)),
        sin(static_cast<size_t>(b.size * m.head_dim / 2)), next(4 * m.layers.size() + 1) {
    const int64_t half = m.head_dim / 2;
    if (m.all_reduce)
      partial.resize(x.size());
    for (int64_t t = 0; t < b.size; ++t) {
      // Under TP the rank's vocabulary rows, zeros for the others' ids (the
      // group's sum is the whole embedding).
      const int64_t row = b.tokens[t] - m.vocab0;
      if (row >= 0 && row < m.vocab)
        std::copy_n(m.embedding_row(row), m.dim, x.data() + t * m.dim);
      else
        std::fill_n(x.data() + t * m.dim, m.dim, 0.0f);
      for (int64_t i = 0; i < half; ++i) {
        float angle = static_cast<float>(b.positions[t]) * m.inv_freq[i];
        cos[static_cast<size_t>(t * half + i)] = std::cos(angle);
        sin[static_cast<size_t>(t * half + i)] = std::sin(angle);
      }
    }
  }
  const float* cos_of(int64_t t, int64_t head_dim) const { return cos.data() + t * (head_dim / 2); }
  const float* sin_of(int64_t t, int64_t head_dim) const { return sin.data() + t * (head_dim / 2); }
};

// One decode step, run by every member of the team: each method is the
// member's share of one stage, and the stages are separated by barriers.
class step {
public:
  step(const decode_model& m, const decode_batch& b, int me, int members, activations& a)
      : m_(m), b_(b), a_(a), k_(decode_kernels_of(m.isa)), me_(me), n_(members), B_(b.size),
        D_(m.dim), HD_(m.head_dim), q_rows_(m.n_heads * HD_), kv_rows_(m.n_kv * HD_),
        qkv_rows_(q_rows_ + 2 * kv_rows_), packed_(m.packed() && B_ > 1),
        xn_(static_cast<size_t>(B_ * D_)), q_(static_cast<size_t>(q_rows_)),
        att_(static_cast<size_t>(B_ * q_rows_)), part_weights_(static_cast<size_t>(a.parts)) {
    int64_t max_context = 0;
    for (int64_t t = 0; t < B_; ++t)
      max_context = std::max(max_context, b.context_lens[t]);
    scores_.resize(static_cast<size_t>(m.n_heads * max_context));
  }

  // The member's own copy of the normalised residual, laid out for the
  // projections (no barrier: every member computes all of it).
  void normalise(const float* weight) {
    for (int64_t t = 0; t < B_; ++t)
      rms_norm(a_.x.data() + t * D_, weight, m_.eps, D_, xn_.data() + at(t, 0, D_), at(0, 1, D_));
  }

  // q | k | v rows of the normalised residual.
  void project_qkv(const decode_layer& L) {
    if (packed_) {
      claim_panels(qkv_rows_, [&](int64_t p0, int64_t p1) {
        k_.qkv_panels(L.panels.qkv, {L.bq, L.bk, L.bv, q_rows_, kv_rows_}, xn_.data(), B_,
                      a_.qkv.data(), p0, p1, D_);
      });
      return;
    }
    claim_rows(qkv_rows_, [&](int64_t r0, int64_t r1) {
      auto part = [&](int64_t base, int64_t rows, const float* w, const float* bias) {
        auto lo = std::max(r0, base), hi = std::min(r1, base + rows);
        if (lo < hi)
          k_.linear_rows(w, bias, xn_.data(), B_, a_.qkv.data() + base, qkv_rows_, lo - base,
                         hi - base, D_, false);
      };
      part(0, q_rows_, L.wq, L.bq);
      part(q_rows_, kv_rows_, L.wk, L.bk);
      part(q_rows_ + kv_rows_, kv_rows_, L.wv, L.bv);
    });
  }

  // The member's attention parts (NOTE [attention parts]), by (request,
  // part).
  void attend(const decode_layer& L) {
    const int64_t group = m_.n_heads / m_.n_kv, parts = a_.parts;
    auto [i0, i1] = share(B_ * parts, me_, n_);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t = item / parts, len = b_.context_lens[t];
      auto [p0, p1] = share(len, static_cast<int>(item % parts), static_cast<int>(parts));
      rope_query(t);
      if (p0 < p1 && p1 == len)
        rope_and_store_kv(L, t);
      k_.attend_heads(q_.data(), L.k_cache, L.v_cache, b_.block_tables + t * b_.table_width,
                      m_.block_size, m_.n_kv, group, HD_, {0, m_.n_kv, p0, p1}, scores_.data(),
                      a_.part_max.data() + item * m_.n_heads,
                      a_.part_sum.data() + item * m_.n_heads, a_.part_out.data() + item * q_rows_);
    }
  }

  // x += Wo · attention (+ bo), on the member's own combination of the
  // attention parts.
  void project_out(const decode_layer& L) {
    for (int64_t t = 0; t < B_; ++t)
      combine_attention(t);
    residual(L.wo, L.panels.wo, L.bo, att_.data(), q_rows_);
  }

  // The FFN's hidden rows: silu(W1 · xn) ⊙ (W3 · xn).
  void gate_up(const decode_layer& L) {
    if (packed_) {
      claim_panels(2 * m_.hidden, [&](int64_t p0, int64_t p1) {
        k_.swiglu_panels(L.panels.w13, m_.hidden, L.b1, L.b3, xn_.data(), B_, a_.h.data(), p0, p1,
                         D_);
      });
      return;
    }
    claim_rows(m_.hidden, [&](int64_t f0, int64_t f1) {
      k_.swiglu_rows(L.w1, L.w3, L.b1, L.b3, xn_.data(), B_, a_.h.data(), m_.hidden, f0, f1, D_);
    });
  }

  // x += W2 · h (+ b2).
  void project_down(const decode_layer& L) {
    residual(L.w2, L.panels.w2, L.b2, a_.h.data(), m_.hidden);
  }

  // NOTE [tensor-parallel fused decode]: x += the group's sum of the
  // partial product (+ bias, once), by member 0 between barriers.
  void add_partial(const float* bias) {
    if (me_ != 0)
      return;
    m_.all_reduce(a_.partial.data(), B_ * D_);
    for (int64_t t = 0; t < B_; ++t)
      for (int64_t d = 0; d < D_; ++d)
        a_.x[static_cast<size_t>(t * D_ + d)] +=
            a_.partial[static_cast<size_t>(t * D_ + d)] + (bias ? bias[d] : 0.0f);
  }

  void lm_head() {
    if (packed_) {
      claim_panels(m_.vocab, [&](int64_t p0, int64_t p1) {
        k_.linear_panels(m_.lm_head_panels, m_.vocab, nullptr, xn_.data(), B_, b_.logits, m_.vocab,
                         p0, p1, D_, false);
      });
      return;
    }
    const bool reverse = B_ == 1 && b_.reverse_head; // NOTE [alternating head order]
    claim_rows(m_.vocab, [&](int64_t v0, int64_t v1) {
      if (!reverse) {
        k_.linear_rows(m_.lm_head, nullptr, xn_.data(), B_, b_.logits, m_.vocab, v0, v1, D_, false);
        return;
      }
      // Blocks from the end; each one read forwards (the prefetchers' way).
      const int64_t block = 256;
      for (int64_t hi = v1; hi > v0; hi -= block)
        k_.linear_rows(m_.lm_head, nullptr, xn_.data(), B_, b_.logits, m_.vocab,
                       std::max(v0, hi - block), hi, D_, false);
    });
  }

private:
  // The member's copy of token t's query heads, turned by RoPE.
  void rope_query(int64_t t) {
    std::copy_n(a_.qkv.data() + t * qkv_rows_, q_rows_, q_.data());
    for (int64_t h = 0; h < m_.n_heads; ++h)
      rope(q_.data() + h * HD_, a_.cos_of(t, HD_), a_.sin_of(t, HD_), HD_);
  }

  // Token t's key heads turned by RoPE, and its K/V written to its slot.
  void rope_and_store_kv(const decode_layer& L, int64_t t) {
    float* row = a_.qkv.data() + t * qkv_rows_;
    for (int64_t j = 0; j < m_.n_kv; ++j) {
      float* k = row + q_rows_ + j * HD_;
      const float* v = row + q_rows_ + kv_rows_ + j * HD_;
      rope(k, a_.cos_of(t, HD_), a_.sin_of(t, HD_), HD_);
      auto slot = (b_.slots[t] * m_.n_kv + j) * HD_;
      std::copy_n(k, HD_, L.k_cache + slot);
      std::copy_n(v, HD_, L.v_cache + slot);
    }
  }

  // Token t's attention output from its parts (NOTE [attention parts]),
  // into the member's att_ (laid out for the output projection). A head
  // with a NaN part, or none with a distribution, is NaN (as ATen's).
  void combine_attention(int64_t t) {
    const int64_t parts = a_.parts;
    const float scale = 1.0f / std::sqrt(static_cast<float>(HD_));
    const float* max = a_.part_max.data() + t * parts * m_.n_heads;
    const float* sum = a_.part_sum.data() + t * parts * m_.n_heads;
    const float* out = a_.part_out.data() + t * parts * q_rows_;
    auto& weight = part_weights_;
    for (int64_t h = 0; h < m_.n_heads; ++h) {
      float top = -std::numeric_limits<float>::infinity();
      bool nan = false;
      for (int64_t i = 0; i < parts; ++i) {
        float s = sum[i * m_.n_heads + h];
        nan |= std::isnan(s);
        if (s > 0)
          top = std::max(top, max[i * m_.n_heads + h]);
      }
      double denominator = 0;
      for (int64_t i = 0; i < parts; ++i) {
        float s = sum[i * m_.n_heads + h];
        weight[static_cast<size_t>(i)] =
            s > 0 ? std::exp(scale * (max[i * m_.n_heads + h] - top)) : 0.0f;
        denominator += static_cast<double>(weight[static_cast<size_t>(i)]) * s;
      }
      const float inv = nan || !(denominator > 0) ? std::numeric_limits<float>::quiet_NaN()
                                                  : static_cast<float>(1.0 / denominator);
      for (int64_t d = h * HD_; d < (h + 1) * HD_; ++d) {
        float v = 0;
        for (int64_t i = 0; i < parts; ++i)
          v += weight[static_cast<size_t>(i)] * out[i * q_rows_ + d];
        att_[static_cast<size_t>(at(t, d, q_rows_))] = v * inv;
      }
    }
  }

  // Where token t's element i of an input of n elements lives.
  int64_t at(int64_t t, int64_t i, int64_t n) const { return packed_ ? i * B_ + t : t * n + i; }

  // NOTE [claimed chunks]: a projection's rows are cut into chunks (about
  // eight per member, whole tiles) that the members claim one at a time
  // from the projection's counter, so that a member slowed for a while (a
  // busier core, an interrupt, a sibling hyperthread's work) takes fewer of
  // them instead of holding the team at the next barrier. Each member calls
  // the projections in the same order, so the i-th call of every member
  // uses counter i. A batch of one token is bound by memory, not by
  // arithmetic: there each member takes one contiguous share instead, a
  // long stream its core's prefetchers follow (claimed chunks interleave
  // the members' streams: 4-10 % slower at 2 threads on a Zen 4 VM).
  template <class Fn>
  void claim(int64_t units, int64_t per_chunk, Fn&& fn) {
    auto& next = a_.next[static_cast<size_t>(projection_++)];
    if (n_ == 1 || B_ == 1) {
      auto [u0, u1] = share(units, me_, n_);
      if (u0 < u1)
        fn(u0, u1);
      return;
    }
    for (int64_t c; (c = next.fetch_add(per_chunk, std::memory_order_relaxed)) < units;)
      fn(c, std::min(units, c + per_chunk));
  }
  // fn(r0, r1) for the member's chunks of `rows` stored rows.
  template <class Fn>
  void claim_rows(int64_t rows, Fn&& fn) {
    const int64_t unit = k_.row_tile;
    const int64_t per = std::max<int64_t>(16, rows / (8 * n_)) / unit * unit;
    claim(rows, std::max(unit, per), fn);
  }
  // fn(p0, p1) for the member's chunks of the panels of a packed matrix with
  // `rows` rows.
  template <class Fn>
  void claim_panels(int64_t rows, Fn&& fn) {
    const int64_t panels = (rows + k_.panel_rows - 1) / k_.panel_rows;
    claim(panels, std::max<int64_t>(1, panels / (8 * n_)), fn);
  }

  // The member's rows of x [B, dim] += W · in + bias; under TP of the
  // partial product W · in instead (NOTE [tensor-parallel fused decode]).
  void residual(const float* rows, const float* panels, const float* bias, const float* in,
                int64_t n) {
    const bool tp = static_cast<bool>(m_.all_reduce);
    float* out = tp ? a_.partial.data() : a_.x.data();
    if (tp)
      bias = nullptr;
    if (packed_) {
      claim_panels(D_, [&](int64_t p0, int64_t p1) {
        k_.linear_panels(panels, D_, bias, in, B_, out, D_, p0, p1, n, !tp);
      });
      return;
    }
    claim_rows(D_, [&](int64_t o0, int64_t o1) {
      k_.linear_rows(rows, bias, in, B_, out, D_, o0, o1, n, !tp);
    });
  }

  const decode_model& m_;
  const decode_batch& b_;
  activations& a_;
  const decode_kernels& k_;
  const int me_, n_;
  const int64_t B_, D_, HD_, q_rows_, kv_rows_, qkv_rows_;
  const bool packed_;
  size_t projection_ = 0; // the step's projections called so far
  std::vector<float> xn_, q_, att_, part_weights_, scores_;
};

} // namespace

float dot(const float* a, const float* b, int64_t n, decode_isa isa) {
  return decode_kernels_of(isa).dot(a, b, n);
}

void fused_decode(const decode_model& m, const decode_batch& b, thread_team& team) {
  if (auto why = unsupported_why(m.isa); !why.empty())
    throw std::invalid_argument("fused_decode: decode_isa " + why);
  const int64_t q_rows = m.n_heads * m.head_dim;
  activations a{m, b, team.size(), q_rows + 2 * m.n_kv * m.head_dim, q_rows};
  const bool tp = static_cast<bool>(m.all_reduce);
  team.run([&](int me, int members) {
    step s{m, b, me, members, a};
    // NOTE [tensor-parallel fused decode]: the embedding, the attention
    // output and the down projection summed over the group, each by member
    // 0 between barriers.
    auto sum_partial = [&](const float* bias) {
      if (!tp)
        return;
      s.add_partial(bias);
      team.barrier();
    };
    if (tp) {
      if (me == 0)
        m.all_reduce(a.x.data(), b.size * m.dim);
      team.barrier();
    }
    for (const auto& L : m.layers) {
      s.normalise(L.attn_norm);
      s.project_qkv(L);
      team.barrier();
      s.attend(L);
      team.barrier();
      s.project_out(L);
      team.barrier();
      sum_partial(L.bo);
      s.normalise(L.ffn_norm);
      s.gate_up(L);
      team.barrier();
      s.project_down(L);
      team.barrier();
      sum_partial(L.b2);
    }
    s.normalise(m.final_norm);
    s.lm_head();
  });
}

} // namespace troupe::kernels::cpu
