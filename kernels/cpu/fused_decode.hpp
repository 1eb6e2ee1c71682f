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
// threads runs the whole step: every projection's output rows are split
// over the team (q|k|v as one row space, gate|up fused with SiLU), RMSNorm
// is folded into the rows' input (each thread normalises the residual for
// itself instead of waiting for one), RoPE, the K/V write and attention are
// split by (request, head), and the team meets at a barrier between
// dependent steps (6 per layer), not at a fork and join. At B = 1 the
// weights are read in their stored row-major [out, in] layout: each output
// row is one sequential dot product, the whole matrix one stream the
// hardware prefetchers follow. At B > 1 the step is bound by arithmetic;
// given a packed copy of the weights (NOTE [packed panels]), a tile of 32
// rows meets up to 12 tokens with no horizontal sums; without one, a tile of
// 4 stored rows meets 4 tokens at a time (16 accumulators, one transposing
// reduction), the next tile's rows prefetched while this one computes.
// Either way every weight byte comes from memory once per step. Attention
// reads K/V in place through the block tables, a block at a time, with the
// sampler's vectorised softmax. The numbers follow the ATen path's definitions
// (RMSNorm in fp32, rotate-half RoPE, softmax over the cached positions);
// sums run in another order, so they agree to float rounding
// (tests/kernels/fused_decode_test.cpp, tests/models/llama_paged_test.cpp).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::kernels::cpu {

/// Threads that run one function together and meet at barriers. The caller
/// is member 0; the others sleep between runs (after a short spin). One
/// caller at a time.
class thread_team {
public:
  explicit thread_team(int size);
  ~thread_team();
  thread_team(const thread_team&) = delete;
  thread_team& operator=(const thread_team&) = delete;

  int size() const { return size_; }
  /// Runs fn(member) on every member; returns when all have returned.
  void run(const std::function<void(int)>& fn);
  /// Inside run(): waits until every member has arrived.
  void barrier();

private:
  void work(int member);

  int size_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> finished_{0};
  std::atomic<int> arrived_{0};
  std::atomic<uint32_t> phase_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};
  std::mutex mu_;
  std::condition_variable wake_;
};

/// NOTE [packed panels]: a copy of a weight matrix W [rows, cols] laid out
/// for batched decode steps. Rows go in panels of kPanelRows (the last one
/// padded with zeros); a panel stores its rows' k-th elements together,
/// k = 0, 1, ...: panel[k][j] = W[p · kPanelRows + j][k]. A tile of a panel
/// and T tokens then keeps 2 T vector accumulators, each step along k loads
/// two vectors of weights and one scalar of each token's input, and its sums
/// come out whole (no horizontal reductions); the panels follow each other
/// in memory, so the whole matrix is one stream. The SwiGLU pair w1 | w3
/// packs as one matrix whose panels hold kPanelRows / 2 rows of w1 followed
/// by the same rows of w3, so that a tile yields gate and up side by side.
/// Inputs are read k-major ([cols, tokens]) for the same reason. The panel
/// kernels and the packing are in kernels/cpu/decode_panels.cpp.
constexpr int64_t kPanelRows = 32;

/// Floats of W [rows, cols] in panels.
int64_t packed_size(int64_t rows, int64_t cols);
/// Packs a row-major W [rows, cols] into `out` (packed_size floats).
void pack_panels(const float* w, int64_t rows, int64_t cols, float* out);
/// Packs the SwiGLU pair (w1, w3, each [rows, cols]) into `out`
/// (packed_size(2 · rows, cols) floats).
void pack_swiglu(const float* w1, const float* w3, int64_t rows, int64_t cols, float* out);

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
};

/// Runs the step on `team` (NOTE [fused decode]); writes every token's K/V
/// into every layer's pools and the logits. The caller has checked the
/// batch against the pools (ids, slots, tables, lengths in range).
void fused_decode(const decode_model& m, const decode_batch& b, thread_team& team);

/// The dot product of n floats (the kernel's inner loop, at its vector
/// width; for tests and the benchmark's streaming read).
float dot(const float* a, const float* b, int64_t n);

} // namespace troupe::kernels::cpu
