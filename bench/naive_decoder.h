/* The baseline that bench_decode holds the fused CPU decode against (issue
 * 28): a minimal single-file Llama decoder as people write them in C — one
 * dot product per output row, `#pragma omp parallel for` over the rows,
 * RMSNorm, rotate-half RoPE, attention over a flat KV cache — built with
 * -Ofast -march=native -fopenmp (bench/CMakeLists.txt). It reads the same
 * fp32 weights as the model (pointers into its tensors), one token per call.
 * Written for the benchmark; nothing in troupe calls it. */
#ifndef TROUPE_BENCH_NAIVE_DECODER_H
#define TROUPE_BENCH_NAIVE_DECODER_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int dim, hidden, layers, heads, kv_heads, vocab, max_seq;
  float eps;
} naive_config;

/* Row-major [out, in] matrices as the model stores them; one pointer per
 * layer in each array. */
typedef struct {
  const float* embedding; /* [vocab, dim] */
  const float** attn_norm;
  const float **wq, **wk, **wv, **wo;
  const float** ffn_norm;
  const float **w1, **w3, **w2; /* gate, up, down */
  const float* final_norm;
  const float* lm_head;  /* [vocab, dim] */
  const float* inv_freq; /* [head_dim / 2] */
} naive_weights;

typedef struct naive_decoder naive_decoder;

/* A decoder over `w` (not copied) with an empty KV cache of max_seq positions. */
naive_decoder* naive_new(const naive_config* c, const naive_weights* w);
void naive_free(naive_decoder* d);
/* The logits [vocab] of `token` at `pos` (positions 0, 1, ... in order);
 * writes its K/V into the cache. Runs on `threads` OpenMP threads. */
const float* naive_forward(naive_decoder* d, int token, int pos, int threads);

#ifdef __cplusplus
}
#endif

#endif
