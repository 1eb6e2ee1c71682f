/* See naive_decoder.h. Deliberately plain: the compiler vectorises each dot
 * product, OpenMP splits each matrix's rows, nothing is fused or packed. */
#include "naive_decoder.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

struct naive_decoder {
  naive_config c;
  naive_weights w;
  int head_dim, kv_dim;
  float *x, *xn, *q, *k, *v, *att, *out, *g, *u, *logits, *scores;
  float *k_cache, *v_cache; /* [layers, max_seq, kv_dim] */
};

static float* zeros(size_t n) {
  return (float*)calloc(n, sizeof(float));
}

naive_decoder* naive_new(const naive_config* c, const naive_weights* w) {
  naive_decoder* d = (naive_decoder*)calloc(1, sizeof *d);
  d->c = *c;
  d->w = *w;
  d->head_dim = c->dim / c->heads;
  d->kv_dim = d->head_dim * c->kv_heads;
  d->x = zeros((size_t)c->dim);
  d->xn = zeros((size_t)c->dim);
  d->q = zeros((size_t)c->dim);
  d->k = zeros((size_t)d->kv_dim);
  d->v = zeros((size_t)d->kv_dim);
  d->att = zeros((size_t)c->dim);
  d->out = zeros((size_t)c->dim);
  d->g = zeros((size_t)c->hidden);
  d->u = zeros((size_t)c->hidden);
  d->logits = zeros((size_t)c->vocab);
  d->scores = zeros((size_t)c->heads * (size_t)c->max_seq);
  d->k_cache = zeros((size_t)c->layers * (size_t)c->max_seq * (size_t)d->kv_dim);
  d->v_cache = zeros((size_t)c->layers * (size_t)c->max_seq * (size_t)d->kv_dim);
  return d;
}

void naive_free(naive_decoder* d) {
  float* bufs[] = {d->x, d->xn, d->q,      d->k,      d->v,       d->att,    d->out,
                   d->g, d->u,  d->logits, d->scores, d->k_cache, d->v_cache};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i)
    free(bufs[i]);
  free(d);
}

static void rmsnorm(float* out, const float* x, const float* weight, int n, float eps) {
  float ss = 0;
  for (int i = 0; i < n; ++i)
    ss += x[i] * x[i];
  float inv = 1.0f / sqrtf(ss / (float)n + eps);
  for (int i = 0; i < n; ++i)
    out[i] = weight[i] * (x[i] * inv);
}

/* out[r] = W[r] · x for a row-major W [rows, n]. */
static void matvec(float* out, const float* w, const float* x, int rows, int n) {
#pragma omp parallel for
  for (int r = 0; r < rows; ++r) {
    const float* row = w + (size_t)r * (size_t)n;
    float s = 0;
    for (int i = 0; i < n; ++i)
      s += row[i] * x[i];
    out[r] = s;
  }
}

/* Rotate-half RoPE of `heads` heads of `head_dim` at `pos`. */
static void rope(float* v, int heads, int head_dim, int pos, const float* inv_freq) {
  int half = head_dim / 2;
  for (int h = 0; h < heads; ++h) {
    float* p = v + h * head_dim;
    for (int i = 0; i < half; ++i) {
      float angle = (float)pos * inv_freq[i];
      float c = cosf(angle), s = sinf(angle);
      float a = p[i], b = p[i + half];
      p[i] = a * c - b * s;
      p[i + half] = b * c + a * s;
    }
  }
}

/* Attention of every query head over positions [0, pos] of one layer's cache. */
static void attention(naive_decoder* d, const float* kc, const float* vc, int pos) {
  const int hd = d->head_dim, group = d->c.heads / d->c.kv_heads;
  const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for
  for (int h = 0; h < d->c.heads; ++h) {
    const float* q = d->q + h * hd;
    float* s = d->scores + (size_t)h * (size_t)d->c.max_seq;
    const int kvh = h / group;
    float max = -INFINITY;
    for (int t = 0; t <= pos; ++t) {
      const float* k = kc + (size_t)t * (size_t)d->kv_dim + kvh * hd;
      float dot = 0;
      for (int i = 0; i < hd; ++i)
        dot += q[i] * k[i];
      s[t] = dot * scale;
      if (s[t] > max)
        max = s[t];
    }
    float sum = 0;
    for (int t = 0; t <= pos; ++t) {
      s[t] = expf(s[t] - max);
      sum += s[t];
    }
    float* o = d->att + h * hd;
    memset(o, 0, (size_t)hd * sizeof(float));
    for (int t = 0; t <= pos; ++t) {
      const float* v = vc + (size_t)t * (size_t)d->kv_dim + kvh * hd;
      const float a = s[t] / sum;
      for (int i = 0; i < hd; ++i)
        o[i] += a * v[i];
    }
  }
}

const float* naive_forward(naive_decoder* d, int token, int pos, int threads) {
  const naive_config* c = &d->c;
  const naive_weights* w = &d->w;
  omp_set_num_threads(threads);
  memcpy(d->x, w->embedding + (size_t)token * (size_t)c->dim, (size_t)c->dim * sizeof(float));
  for (int l = 0; l < c->layers; ++l) {
    float* kc = d->k_cache + (size_t)l * (size_t)c->max_seq * (size_t)d->kv_dim;
    float* vc = d->v_cache + (size_t)l * (size_t)c->max_seq * (size_t)d->kv_dim;
    rmsnorm(d->xn, d->x, w->attn_norm[l], c->dim, c->eps);
    matvec(d->q, w->wq[l], d->xn, c->dim, c->dim);
    matvec(d->k, w->wk[l], d->xn, d->kv_dim, c->dim);
    matvec(d->v, w->wv[l], d->xn, d->kv_dim, c->dim);
    rope(d->q, c->heads, d->head_dim, pos, w->inv_freq);
    rope(d->k, c->kv_heads, d->head_dim, pos, w->inv_freq);
    memcpy(kc + (size_t)pos * (size_t)d->kv_dim, d->k, (size_t)d->kv_dim * sizeof(float));
    memcpy(vc + (size_t)pos * (size_t)d->kv_dim, d->v, (size_t)d->kv_dim * sizeof(float));
    attention(d, kc, vc, pos);
    matvec(d->out, w->wo[l], d->att, c->dim, c->dim);
    for (int i = 0; i < c->dim; ++i)
      d->x[i] += d->out[i];
    rmsnorm(d->xn, d->x, w->ffn_norm[l], c->dim, c->eps);
    matvec(d->g, w->w1[l], d->xn, c->hidden, c->dim);
    matvec(d->u, w->w3[l], d->xn, c->hidden, c->dim);
    for (int i = 0; i < c->hidden; ++i)
      d->g[i] = d->g[i] / (1.0f + expf(-d->g[i])) * d->u[i];
    matvec(d->out, w->w2[l], d->g, c->dim, c->hidden);
    for (int i = 0; i < c->dim; ++i)
      d->x[i] += d->out[i];
  }
  rmsnorm(d->xn, d->x, w->final_norm, c->dim, c->eps);
  matvec(d->logits, w->lm_head, d->xn, c->vocab, c->dim);
  return d->logits;
}
