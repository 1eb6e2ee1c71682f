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

// The step's activations, shared by the team (each member writes only its
// own rows or items of them). The projections' inputs (the normalised
// residual, the attention output, the FFN's hidden rows) are token rows for
// the stored weights and k-major for the panels (NOTE [packed panels]).
struct activations {
  std::vector<float> x, qkv, att, h;
  std::vector<float> cos, sin; // [size, head_dim / 2]: each token's RoPE angles, for every layer
  // The projections' next unclaimed chunk, one counter per projection of
  // the step in order (4 a layer, then the LM head).
  std::vector<std::atomic<int64_t>> next;
  activations(const decode_model& m, const decode_batch& b, int64_t qkv_rows, int64_t q_rows)
      : x(static_cast<size_t>(b.size * m.dim)), qkv(static_cast<size_t>(b.size * qkv_rows)),
        att(static_cast<size_t>(b.size * q_rows)), h(static_cast<size_t>(b.size * m.hidden)),
        cos(static_cast<size_t>(b.size * m.head_dim / 2)),
        sin(static_cast<size_t>(b.size * m.head_dim / 2)), next(4 * m.layers.size() + 1) {
    const int64_t half = m.head_dim / 2;
    for (int64_t t = 0; t < b.size; ++t) {
      std::copy_n(m.embedding_row(b.tokens[t]), m.dim, x.data() + t * m.dim);
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
        xn_(static_cast<size_t>(B_ * D_)), head_out_(static_cast<size_t>(q_rows_)),
        inv_sum_(static_cast<size_t>(m.n_heads)) {
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

  // Attention by request, or by (request, range of KV heads) when the
  // requests are fewer than the members. Each item first turns its query
  // and key heads by RoPE and writes its K/V: an item reads only its own
  // request's cache, and the new token's slot is its own (a shared
  // partly-filled block is copied before a request writes into it: NOTE
  // [engine step]), so no barrier is needed between the write and the reads.
  void attend(const decode_layer& L) {
    const int64_t group = m_.n_heads / m_.n_kv;
    const int64_t parts = std::min<int64_t>(m_.n_kv, (n_ + B_ - 1) / B_);
    auto [i0, i1] = share(B_ * parts, me_, n_);
    for (int64_t item = i0; item < i1; ++item) {
      auto t = item / parts;
      auto [j0, j1] = share(m_.n_kv, static_cast<int>(item % parts), static_cast<int>(parts));
      rope_and_store(L, t, j0, j1);
      float* out = packed_ ? head_out_.data() : a_.att.data() + t * q_rows_;
      k_.attend_heads(a_.qkv.data() + t * qkv_rows_, L.k_cache, L.v_cache,
                      b_.block_tables + t * b_.table_width, m_.block_size, m_.n_kv, group, j0, j1,
                      HD_, b_.context_lens[t], scores_.data(), inv_sum_.data(), out);
      if (packed_)
        for (int64_t d = j0 * group * HD_; d < j1 * group * HD_; ++d)
          a_.att[static_cast<size_t>(at(t, d, q_rows_))] = out[d];
    }
  }

  // x += Wo · attention (+ bo).
  void project_out(const decode_layer& L) {
    residual(L.wo, L.panels.wo, L.bo, a_.att.data(), q_rows_);
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

  void lm_head() {
    if (packed_) {
      claim_panels(m_.vocab, [&](int64_t p0, int64_t p1) {
        k_.linear_panels(m_.lm_head_panels, m_.vocab, nullptr, xn_.data(), B_, b_.logits, m_.vocab,
                         p0, p1, D_, false);
      });
      return;
    }
    claim_rows(m_.vocab, [&](int64_t v0, int64_t v1) {
      k_.linear_rows(m_.lm_head, nullptr, xn_.data(), B_, b_.logits, m_.vocab, v0, v1, D_, false);
    });
  }

private:
  // RoPE of token t's KV heads [j0, j1) and their query heads; the K/V
  // write of those KV heads.
  void rope_and_store(const decode_layer& L, int64_t t, int64_t j0, int64_t j1) {
    const int64_t group = m_.n_heads / m_.n_kv;
    float* row = a_.qkv.data() + t * qkv_rows_;
    const float *cos = a_.cos_of(t, HD_), *sin = a_.sin_of(t, HD_);
    for (int64_t h = j0 * group; h < j1 * group; ++h)
      rope(row + h * HD_, cos, sin, HD_);
    for (int64_t j = j0; j < j1; ++j) {
      float* k = row + q_rows_ + j * HD_;
      const float* v = row + q_rows_ + kv_rows_ + j * HD_;
      rope(k, cos, sin, HD_);
      auto slot = (b_.slots[t] * m_.n_kv + j) * HD_;
      std::copy_n(k, HD_, L.k_cache + slot);
      std::copy_n(v, HD_, L.v_cache + slot);
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
  // uses counter i.
  template <class Fn>
  void claim(int64_t units, int64_t per_chunk, Fn&& fn) {
    auto& next = a_.next[static_cast<size_t>(projection_++)];
    if (n_ == 1) {
      fn(int64_t{0}, units);
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

  // The member's rows of x [B, dim] += W · in + bias.
  void residual(const float* rows, const float* panels, const float* bias, const float* in,
                int64_t n) {
    if (packed_) {
      claim_panels(D_, [&](int64_t p0, int64_t p1) {
        k_.linear_panels(panels, D_, bias, in, B_, a_.x.data(), D_, p0, p1, n, true);
      });
      return;
    }
    claim_rows(D_, [&](int64_t o0, int64_t o1) {
      k_.linear_rows(rows, bias, in, B_, a_.x.data(), D_, o0, o1, n, true);
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
  std::vector<float> xn_, head_out_, inv_sum_, scores_;
};

} // namespace

float dot(const float* a, const float* b, int64_t n, decode_isa isa) {
  return decode_kernels_of(isa).dot(a, b, n);
}

void fused_decode(const decode_model& m, const decode_batch& b, thread_team& team) {
  if (auto why = unsupported_why(m.isa); !why.empty())
    throw std::invalid_argument("fused_decode: decode_isa " + why);
  const int64_t q_rows = m.n_heads * m.head_dim;
  activations a{m, b, q_rows + 2 * m.n_kv * m.head_dim, q_rows};
  team.run([&](int me, int members) {
    step s{m, b, me, members, a};
    for (const auto& L : m.layers) {
      s.normalise(L.attn_norm);
      s.project_qkv(L);
      team.barrier();
      s.attend(L);
      team.barrier();
      s.project_out(L);
      team.barrier();
      s.normalise(L.ffn_norm);
      s.gate_up(L);
      team.barrier();
      s.project_down(L);
      team.barrier();
    }
    s.normalise(m.final_norm);
    s.lm_head();
  });
}

} // namespace troupe::kernels::cpu
