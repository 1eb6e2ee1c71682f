#pragma once
// Decode steps of a Llama-family decoder on the CPU in one fused pass (raw
// fp32 pointers; no LibTorch), run by a team of threads.
//
// NOTE [fused decode]: a decode step (one new token for each of B requests)
// is a chain of matrix products over weights that are read once per step.
// At B = 1 it is bound by reading the weights and by per-operation
// overhead; the ATen path issues ~15 operators per layer, each parallelised
// on its own (OpenMP fork/join, BLAS sgemv / sgemm that packs the weights
// on every call) with small tensors allocated between them. Here a team of
// threads runs the whole step: every projection's output rows are claimed
// in chunks by the team (NOTE [claimed chunks]; q|k|v as one row space,
// gate|up fused with SiLU), RMSNorm
// is folded into the rows' input (each thread normalises the residual for
// itself instead of waiting for one), RoPE, the K/V write and attention are
// split by (request, head), and the team meets at a barrier between
// dependent steps (5 per layer), not at a fork and join. At B = 1 the
// weights are read in their stored row-major [out, in] layout: each output
// row is one sequential dot product, the whole matrix one stream the
// hardware prefetchers follow. At B > 1 the step is bound by arithmetic;
// given a packed copy of the weights (NOTE [packed panels]), a tile of a
// panel meets as many tokens as the registers hold with no horizontal sums;
// without one, a tile of 4 (or 2) stored rows meets 4 tokens at a time, the
// next tile's rows prefetched while this one computes. The arithmetic runs
// on one instruction-set path, chosen by the caller (NOTE [decode isa]).
// Either way every weight byte comes from memory once per step. Attention
// reads K/V in place through the block tables, a block at a time, with the
// sampler's vectorised softmax. The numbers follow the ATen path's definitions
// (RMSNorm in fp32, rotate-half RoPE, softmax over the cached positions);
// sums run in another order, so they agree to float rounding
// (tests/kernels/fused_decode_test.cpp, tests/models/llama_paged_test.cpp).

#include "kernels/cpu/decode_isa.hpp"

#include <cstdint>
#include <functional>
#include <vector>

namespace troupe::kernels::cpu {

/// NOTE [decode team]: the threads that run a decode step together and
/// meet at barriers are OpenMP's: the pool ATen's CPU operators use (its
/// parallel backend here), and that the rest of a decode loop keeps awake
/// (the sampler's rows, a prefill's GEMMs). A team of its own ran beside
/// that pool's idle threads, which spin for a while after each region: on 2
/// cores the step's threads then shared them with a spinner, and measured
/// 15-25 % slower at 2 threads (bench_decode, issue 28). A run gets as many
/// members as OpenMP gives it: `size`, or one inside another parallel
/// region; callers split work by the count they are given.
class thread_team {
public:
  explicit thread_team(int size) : size_(size < 1 ? 1 : size) {}

  int size() const { return size_; }
  /// Runs fn(member, members) on members <= size() threads (the caller is
  /// member 0); returns when all have returned.
  void run(const std::function<void(int, int)>& fn);
  /// Inside run(): waits until every member has arrived.
  void barrier();

private:
  int size_;
};

/// NOTE [packed panels]: a copy of a weight matrix W [rows, cols] laid out
/// for batched decode steps. Rows go in panels of P rows (two vectors of the
/// path's width: panel_rows() in kernels/cpu/decode_isa.hpp; the last panel
/// padded with zeros); a panel stores its rows' k-th elements together, k =
/// 0, 1, ...: panel[k][j] = W[p · P + j][k]. A tile of a panel and T tokens
/// then keeps 2 T vector accumulators, each step along k loads two vectors
/// of weights and one scalar of each token's input, and its sums come out
/// whole (no horizontal reductions): T is what the register file holds (12
/// with AVX-512's 32 registers, 6 with AVX2's or SSE's 16). The batch runs
/// through a panel tile after tile while the panel stays in L1/L2, so each
/// weight comes from memory once per step whatever the batch; the panels
/// follow each other in memory, so the whole matrix is one stream. The
/// SwiGLU pair w1 | w3 packs as one matrix whose panels hold P / 2 rows of
/// w1 followed by the same rows of w3, so that a tile yields gate and up
/// side by side. Inputs are read k-major ([cols, tokens]) for the same
/// reason. The packing is in kernels/cpu/decode_panels.cpp, the kernels
/// that read it in kernels/cpu/decode_kernels_body.hpp.

/// Floats of W [rows, cols] in panels of `panel_rows`.
int64_t packed_size(int64_t rows, int64_t cols, int64_t panel_rows);
/// Packs a row-major W [rows, cols] into `out` (packed_size floats).
void pack_panels(const float* w, int64_t rows, int64_t cols, int64_t panel_rows, float* out);
/// Packs the SwiGLU pair (w1, w3, each [rows, cols]) into `out`
/// (packed_size(2 · rows, cols, panel_rows) floats).
void pack_swiglu(const float* w1, const float* w3, int64_t rows, int64_t cols, int64_t panel_rows,
                 float* out);

/// One layer's matrices in panels (NOTE [packed panels]).
struct decode_panels {
  const float* qkv = nullptr; // wq | wk | wv as one [q_rows + 2 kv_rows, dim] matrix
  const float* wo = nullptr;
  const float* w13 = nullptr; // pack_swiglu(w1, w3)
  const float* w2 = nullptr;
};

/// One layer's fp32 weights, row-major [out, in] as stored; biases may be null.
struct decode_layer {
  const float* attn_norm = nullptr; // [dim]
  const float *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr;
  const float* ffn_norm = nullptr;                         // [dim]
  const float *w1 = nullptr, *w3 = nullptr, *w2 = nullptr; // gate, up, down
  const float *b1 = nullptr, *b3 = nullptr, *b2 = nullptr;
  float* k_cache = nullptr; // [num_blocks, block_size, n_kv, head_dim]
  float* v_cache = nullptr;
  decode_panels panels; // all null: the stored rows serve
};

struct decode_model {
  int64_t dim = 0, hidden = 0, n_heads = 0, n_kv = 0, head_dim = 0, vocab = 0;
  float eps = 1e-5f;
  const float* inv_freq = nullptr; // [head_dim / 2]
  std::vector<decode_layer> layers;
  const float* final_norm = nullptr; // [dim]
  const float* lm_head = nullptr;    // [vocab, dim] (the embedding table when tied)
  const float* embedding = nullptr;  // [vocab, dim]
  /// The LM head in panels; set together with every layer's panels, or not
  /// at all. With them, steps of more than one request use the panels.
  const float* lm_head_panels = nullptr;
  int64_t block_size = 16;
  /// The instruction-set path that runs the step (one this CPU supports;
  /// the panels are packed for its panel_rows()).
  decode_isa isa = decode_isa::automatic;
  /// NOTE [tensor-parallel fused decode]: a tensor-parallel rank's part —
  /// its heads (n_heads, n_kv), MLP rows (hidden) and vocabulary rows
  /// [vocab0, vocab0 + vocab) of the embedding and the LM head — and the
  /// sum over its group of n floats in place; null: the whole model.
  std::function<void(float* data, int64_t n)> all_reduce;
  int64_t vocab0 = 0;

  bool packed() const { return lm_head_panels != nullptr; }

  const float* embedding_row(int64_t token) const { return embedding + token * dim; }
};

/// One decode step: one new token for each of `size` requests.
struct decode_batch {
  int64_t size = 0;
  const int64_t* tokens = nullptr;       // [size] the new tokens
  const int64_t* positions = nullptr;    // [size] their RoPE positions
  const int64_t* slots = nullptr;        // [size] where their K/V go in the pools
  const int32_t* block_tables = nullptr; // [size, table_width]
  int64_t table_width = 0;
  const int64_t* context_lens = nullptr; // [size] cached tokens, the new one included
  float* logits = nullptr;               // [size, vocab] out
  /// NOTE [alternating head order]: a step of one request reads every
  /// weight once, more bytes than the last-level cache holds (the 24M
  /// shape: 61 MB, its LM head 37 MB). Read in the same order every step,
  /// a step's layers evict most of what the last step left behind, and
  /// what survives — the end of the LM head — is evicted again before the
  /// head reaches it. Callers alternate this flag from step to step: each
  /// member then reads its share of the head from the end on every other
  /// step, starting on the rows the previous step read last.
  bool reverse_head = false;
};

/// Runs the step on `team` (NOTE [fused decode]); writes every token's K/V
/// into every layer's pools and the logits. The caller has checked the
/// batch against the pools (ids, slots, tables, lengths in range).
void fused_decode(const decode_model& m, const decode_batch& b, thread_team& team);

/// The dot product of n floats (the kernel's inner loop on the path, at its
/// vector width; for tests).
float dot(const float* a, const float* b, int64_t n, decode_isa isa = decode_isa::automatic);

} // namespace troupe::kernels::cpu
