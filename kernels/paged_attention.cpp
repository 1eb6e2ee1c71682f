#include "kernels/paged_attention.hpp"

#include "kernels/cpu/paged_decode.hpp"
#include "kernels/detail.hpp"
#include "runtime/torch_guard.hpp"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#if defined(TROUPE_TORCH_CUDA)
// The at::Tensor glue of the paged decode kernel, defined in
// kernels/cuda_glue.cpp (throws std::runtime_error on a CUDA failure).
namespace troupe::kernels::detail {

/// Whether the paged decode kernel takes pools of this dtype and head size.
bool cuda_paged_decode_supports(at::ScalarType type, int64_t head_dim);

/// q [R, H, D] CUDA, pools [num_blocks, block_size, n_kv, D] contiguous on
/// q's device, block_tables [R, max_blocks] and context_lens [R] (any device,
/// any integer dtype; validated) → out [R, H, D] in q's dtype.
at::Tensor cuda_paged_decode_attention(const at::Tensor& q, const at::Tensor& k_pool,
                                       const at::Tensor& v_pool, const at::Tensor& block_tables,
                                       const at::Tensor& context_lens, double scale);

} // namespace troupe::kernels::detail
#endif

namespace troupe::kernels {

namespace {

using detail::cat;

std::string num(int64_t x) {
  return std::to_string(x);
}

caf::error require_same_dtype(std::string_view fn, std::string_view name, const at::Tensor& t,
                              std::string_view ref_name, const at::Tensor& ref) {
  if (t.scalar_type() == ref.scalar_type())
    return {};
  return make_error(errc::shape_mismatch,
                    cat(fn, ": ", name, " has dtype ", c10::toString(t.scalar_type()),
                        ", expected ", c10::toString(ref.scalar_type()), " like ", ref_name));
}

// Metadata may sit on the CPU or on the device of the data.
caf::error require_host_or_device(std::string_view fn, std::string_view name, const at::Tensor& t,
                                  std::string_view ref_name, const at::Tensor& ref) {
  if (t.device().is_cpu() || t.device() == ref.device())
    return {};
  return make_error(errc::invalid_argument,
                    cat(fn, ": ", name, " is on ", t.device().str(), ", expected the CPU or ",
                        ref.device().str(), " like ", ref_name));
}

caf::error require_supported_device(std::string_view fn, std::string_view name,
                                    const at::Tensor& t) {
  if (t.device().is_cpu() || t.is_cuda())
    return {};
  return detail::unsupported_device(fn, name, t);
}

// K and V pools: [num_blocks, block_size, n_kv, D], same dtype, contiguous.
caf::error check_pools(std::string_view fn, const at::Tensor& k_pool, const at::Tensor& v_pool) {
  constexpr std::string_view layout = "[num_blocks, block_size, n_kv, D]";
  if (auto err =
          detail::first_error({detail::require_dim(fn, "k_pool", k_pool, 4, layout),
                               detail::require_floating(fn, "k_pool", k_pool),
                               detail::require_same_shape(fn, "v_pool", v_pool, "k_pool", k_pool)}))
    return err;
  if (auto err =
          detail::first_error({require_same_dtype(fn, "v_pool", v_pool, "k_pool", k_pool),
                               detail::require_same_device(fn, "v_pool", v_pool, "k_pool", k_pool),
                               require_supported_device(fn, "k_pool", k_pool)}))
    return err;
  for (int64_t d = 0; d < 4; ++d)
    if (k_pool.size(d) < 1)
      return make_error(errc::shape_mismatch,
                        cat(fn, ": k_pool has shape ", detail::shape_str(k_pool), ", expected ",
                            layout, " with every dimension >= 1"));
  if (!k_pool.is_contiguous() || !v_pool.is_contiguous())
    return make_error(errc::invalid_argument,
                      cat(fn, ": k_pool and v_pool must be contiguous (slots index their first two "
                              "dimensions flattened)"));
  return {};
}

caf::error require_index_dtype(std::string_view fn, std::string_view name, const at::Tensor& t) {
  auto type = t.scalar_type();
  if (type == at::kInt || type == at::kLong)
    return {};
  return make_error(errc::shape_mismatch, cat(fn, ": ", name, " has dtype ", c10::toString(type),
                                              ", expected int32 or int64"));
}

at::Tensor host_long(const at::Tensor& t) {
  return t.detach().to(at::kCPU, at::kLong).contiguous();
}

// Validated step metadata, as int64 host tensors.
struct step_meta {
  at::Tensor block_tables; // [R, max_blocks]
  at::Tensor context_lens; // [R]
  at::Tensor query_start;  // [R + 1]
  int64_t max_context = 0;
  bool all_decode = true; // every n_r == 1
};

expected<step_meta> check_step(std::string_view fn, int64_t rows, int64_t num_blocks,
                               int64_t block_size, const at::Tensor& q,
                               const at::Tensor& block_tables, const at::Tensor& context_lens,
                               const at::Tensor& query_start) {
  if (auto err = detail::first_error(
          {detail::require_dim(fn, "block_tables", block_tables, 2, "[R, max_blocks]"),
           detail::require_dim(fn, "context_lens", context_lens, 1, "[R]"),
           detail::require_dim(fn, "query_start", query_start, 1, "[R + 1]")}))
    return err;
  if (auto err =
          detail::first_error({require_index_dtype(fn, "block_tables", block_tables),
                               detail::require_integral(fn, "context_lens", context_lens),
                               detail::require_integral(fn, "query_start", query_start),
                               require_host_or_device(fn, "block_tables", block_tables, "q", q),
                               require_host_or_device(fn, "context_lens", context_lens, "q", q),
                               require_host_or_device(fn, "query_start", query_start, "q", q)}))
    return err;
  const int64_t R = block_tables.size(0);
  const int64_t max_blocks = block_tables.size(1);
  if (context_lens.size(0) != R)
    return make_error(errc::shape_mismatch,
                      cat(fn, ": context_lens has shape ", detail::shape_str(context_lens),
                          ", expected [", num(R), "] (one per row of block_tables)"));
  if (query_start.size(0) != R + 1)
    return make_error(errc::shape_mismatch,
                      cat(fn, ": query_start has shape ", detail::shape_str(query_start),
                          ", expected [", num(R + 1), "] (R + 1 with R = ", num(R),
                          " rows of block_tables)"));
  step_meta meta{host_long(block_tables), host_long(context_lens), host_long(query_start)};
  const auto* qs = meta.query_start.data_ptr<int64_t>();
  const auto* ctx = meta.context_lens.data_ptr<int64_t>();
  const auto* bt = meta.block_tables.data_ptr<int64_t>();
  if (qs[0] != 0)
    return make_error(errc::invalid_argument,
                      cat(fn, ": query_start[0] = ", num(qs[0]), ", expected 0"));
  if (qs[R] != rows)
    return make_error(errc::shape_mismatch,
                      cat(fn, ": query_start[", num(R), "] = ", num(qs[R]), ", but q has ",
                          num(rows), " token rows (expected the total of new tokens)"));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t n = qs[r + 1] - qs[r];
    if (n < 1)
      return make_error(errc::invalid_argument,
                        cat(fn, ": request ", num(r), " has ", num(n), " new tokens (query_start[",
                            num(r), "] = ", num(qs[r]), ", query_start[", num(r + 1),
                            "] = ", num(qs[r + 1]), "), expected >= 1"));
    if (ctx[r] < n)
      return make_error(errc::invalid_argument,
                        cat(fn, ": request ", num(r), " has context_lens = ", num(ctx[r]),
                            ", less than its ", num(n), " new tokens (the context includes them)"));
    const int64_t needed = (ctx[r] + block_size - 1) / block_size;
    if (needed > max_blocks)
      return make_error(errc::out_of_range,
                        cat(fn, ": request ", num(r), " has context length ", num(ctx[r]),
                            ", which needs ", num(needed), " blocks of ", num(block_size),
                            " tokens, but block_tables has only ", num(max_blocks), " columns"));
    for (int64_t j = 0; j < needed; ++j) {
      const int64_t id = bt[r * max_blocks + j];
      if (id < 0 || id >= num_blocks)
        return make_error(errc::out_of_range,
                          cat(fn, ": block_tables[", num(r), "][", num(j), "] = ", num(id),
                              " is outside the pool's blocks [0, ", num(num_blocks), ")"));
    }
    meta.max_context = std::max(meta.max_context, ctx[r]);
    meta.all_decode = meta.all_decode && n == 1;
  }
  return meta;
}

// Slots [len] of one request's first `len` tokens: block · block_size + offset.
at::Tensor request_slots(const at::Tensor& table_row, int64_t block_size, int64_t len) {
  const int64_t blocks = (len + block_size - 1) / block_size;
  auto offsets = at::arange(block_size, at::kLong);
  return (table_row.narrow(0, 0, blocks).unsqueeze(1) * block_size + offsets)
      .reshape({-1})
      .narrow(0, 0, len);
}

// K or V rows of `slots` [..., L] (host int64) as [..., n_kv, L, D] in the
// compute dtype. The pool is read as rows of D values, one per (slot, kv
// head), so the gather lands directly in the layout the matmuls want (a 2-D
// index_select is several times faster than gathering [L, n_kv, D] and
// permuting).
at::Tensor gather_heads(const at::Tensor& pool_rows, const at::Tensor& slots, int64_t n_kv,
                        at::ScalarType compute) {
  const int64_t D = pool_rows.size(1);
  auto heads = at::arange(n_kv, at::kLong).unsqueeze(-1); // [n_kv, 1]
  auto index = slots.unsqueeze(-2) * n_kv + heads;        // [..., n_kv, L]
  auto shape = index.sizes().vec();
  shape.push_back(D);
  return pool_rows.index_select(0, index.reshape({-1}).to(pool_rows.device()))
      .view(shape)
      .to(compute);
}

// Decode steps in fp32/fp64 on the CPU read K/V through the block tables in
// place (kernels/cpu/paged_decode.cpp): no gather copy and no batched matmul
// (LibTorch's CPU bmm pays a tensor select per tiny matrix, which dominated
// batch-32 decode).
bool cpu_decode_supports(const at::Tensor& q) {
  return q.device().is_cpu() && (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble);
}

at::Tensor cpu_paged_decode(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                            const step_meta& meta, double scale) {
  auto qc = q.contiguous();
  auto out = at::empty_like(qc);
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t block_size = k_pool.size(1), n_kv = k_pool.size(2);
  const auto& tables = meta.block_tables; // host int64, contiguous (host_long)
  const detail::paged_decode_shape shape{H, n_kv, D, block_size, tables.size(1)};
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "cpu_paged_decode", [&] {
    at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
      detail::paged_decode_items<scalar_t>(
          qc.data_ptr<scalar_t>(), k_pool.data_ptr<scalar_t>(), v_pool.data_ptr<scalar_t>(),
          out.data_ptr<scalar_t>(), tables.data_ptr<int64_t>(),
          meta.context_lens.data_ptr<int64_t>(), shape, static_cast<scalar_t>(scale), begin, end);
    });
  });
  return out;
}

// Decode path for the other dtypes (bf16/fp16 on the CPU; any non-kernel
// device): gathers each request's K/V padded to the
// longest context, [R, n_kv, L, D], masks the padding, one batched matmul.
at::Tensor attend_decode(const at::Tensor& q, const at::Tensor& k_rows, const at::Tensor& v_rows,
                         int64_t n_kv, const step_meta& meta, int64_t block_size, double scale,
                         at::ScalarType compute) {
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t L = meta.max_context;
  const int64_t blocks = (L + block_size - 1) / block_size;
  auto table = meta.block_tables.narrow(1, 0, blocks);
  // Entries past a request's own blocks may hold anything: read block 0 there
  // (masked out below).
  auto used = (meta.context_lens + block_size - 1).div(block_size, "floor");
  auto unused = at::arange(blocks, at::kLong).unsqueeze(0) >= used.unsqueeze(1);
  table = table.masked_fill(unused, 0);
  auto slots = (table.unsqueeze(2) * block_size + at::arange(block_size, at::kLong))
                   .reshape({R, blocks * block_size})
                   .narrow(1, 0, L);                   // [R, L]
  auto k = gather_heads(k_rows, slots, n_kv, compute); // [R, n_kv, L, D]
  auto v = gather_heads(v_rows, slots, n_kv, compute);
  auto qg = q.to(compute).reshape({R, n_kv, H / n_kv, D});
  auto scores = at::matmul(qg, k.transpose(-1, -2)) * scale; // [R, n_kv, G, L]
  auto valid = at::arange(L, at::kLong).unsqueeze(0) < meta.context_lens.unsqueeze(1);
  scores.masked_fill_(valid.logical_not().view({R, 1, 1, L}).to(q.device()),
                      -std::numeric_limits<double>::infinity());
  auto probs = at::softmax(scores, -1);
  auto out = at::matmul(probs, v); // [R, n_kv, G, D]
  return out.reshape({R, H, D}).to(q.scalar_type());
}

// General path: one causal masked matmul per request over its gathered K/V.
at::Tensor attend_varlen(const at::Tensor& q, const at::Tensor& k_rows, const at::Tensor& v_rows,
                         int64_t n_kv, const step_meta& meta, int64_t block_size, double scale,
                         at::ScalarType compute) {
  const int64_t H = q.size(1), D = q.size(2);
  const int64_t G = H / n_kv;
  const int64_t R = meta.context_lens.size(0);
  const auto* qs = meta.query_start.data_ptr<int64_t>();
  const auto* ctx = meta.context_lens.data_ptr<int64_t>();
  auto out = at::empty_like(q, at::MemoryFormat::Contiguous);
  auto bool_opts = at::TensorOptions().dtype(at::kBool).device(q.device());
  for (int64_t r = 0; r < R; ++r) {
    const int64_t n = qs[r + 1] - qs[r];
    const int64_t L = ctx[r];
    auto slots = request_slots(meta.block_tables[r], block_size, L);
    auto k = gather_heads(k_rows, slots, n_kv, compute); // [n_kv, L, D]
    auto v = gather_heads(v_rows, slots, n_kv, compute);
    auto qg = q.narrow(0, qs[r], n).to(compute).reshape({n, n_kv, G, D}).permute({1, 2, 0, 3});
    auto scores = at::matmul(qg.reshape({n_kv, G * n, D}), k.transpose(1, 2)) * scale;
    // New token j sits at position L − n + j and sees keys 0 .. L − n + j.
    auto allowed = at::ones({n, L}, bool_opts).tril(L - n);
    scores = scores.view({n_kv, G, n, L})
                 .masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
    auto probs = at::softmax(scores, -1).view({n_kv, G * n, L});
    auto o = at::matmul(probs, v); // [n_kv, G·n, D]
    out.narrow(0, qs[r], n).copy_(o.view({n_kv, G, n, D}).permute({2, 0, 1, 3}).reshape({n, H, D}));
  }
  return out;
}

} // namespace

expected<void> write_kv(at::Tensor& k_pool, at::Tensor& v_pool, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& slot_mapping) {
  constexpr std::string_view fn = "write_kv";
  if (auto err = check_pools(fn, k_pool, v_pool))
    return err;
  if (auto err =
          detail::first_error({detail::require_dim(fn, "k", k, 3, "[N, n_kv, D]"),
                               detail::require_same_shape(fn, "v", v, "k", k),
                               detail::require_dim(fn, "slot_mapping", slot_mapping, 1, "[N]")}))
    return err;
  const int64_t n_kv = k_pool.size(2), D = k_pool.size(3);
  if (k.size(1) != n_kv || k.size(2) != D)
    return make_error(errc::shape_mismatch,
                      cat(fn, ": k has shape ", detail::shape_str(k), ", expected [N, ", num(n_kv),
                          ", ", num(D), "] to match k_pool ", detail::shape_str(k_pool)));
  if (slot_mapping.size(0) != k.size(0))
    return make_error(errc::shape_mismatch,
                      cat(fn, ": slot_mapping has shape ", detail::shape_str(slot_mapping),
                          ", expected [", num(k.size(0)), "] (one slot per row of k)"));
  if (auto err = detail::first_error(
          {require_same_dtype(fn, "k", k, "k_pool", k_pool),
           require_same_dtype(fn, "v", v, "k_pool", k_pool),
           detail::require_same_device(fn, "k", k, "k_pool", k_pool),
           detail::require_same_device(fn, "v", v, "k_pool", k_pool),
           detail::require_integral(fn, "slot_mapping", slot_mapping),
           require_host_or_device(fn, "slot_mapping", slot_mapping, "k_pool", k_pool)}))
    return err;
  const int64_t capacity = k_pool.size(0) * k_pool.size(1);
  auto slots = host_long(slot_mapping);
  const auto* s = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < slots.numel(); ++i)
    if (s[i] < 0 || s[i] >= capacity)
      return make_error(errc::out_of_range,
                        cat(fn, ": slot_mapping[", num(i), "] = ", num(s[i]),
                            " is outside the pool's slots [0, ", num(capacity), ") (",
                            num(k_pool.size(0)), " blocks of ", num(k_pool.size(1)), ")"));
  if (slots.numel() == 0)
    return caf::unit;
  return guarded(fn, [&] {
    at::NoGradGuard no_grad;
    auto index = slots.to(k_pool.device());
    // Row views [slots, n_kv · D]: a 2-D index_copy_ is the fast one.
    k_pool.view({capacity, n_kv * D}).index_copy_(0, index, k.detach().reshape({-1, n_kv * D}));
    v_pool.view({capacity, n_kv * D}).index_copy_(0, index, v.detach().reshape({-1, n_kv * D}));
  });
}

expected<at::Tensor> paged_attention(const at::Tensor& q, const at::Tensor& k_pool,
                                     const at::Tensor& v_pool, const at::Tensor& block_tables,
                                     const at::Tensor& context_lens, const at::Tensor& query_start,
                                     double scale) {
  constexpr std::string_view fn = "paged_attention";
  if (auto err = check_pools(fn, k_pool, v_pool))
    return err;
  if (auto err = detail::require_dim(fn, "q", q, 3, "[N, H, D]"))
    return err;
  const int64_t num_blocks = k_pool.size(0), block_size = k_pool.size(1);
  const int64_t n_kv = k_pool.size(2), D = k_pool.size(3);
  const int64_t H = q.size(1);
  if (q.size(2) != D || H < 1 || H % n_kv != 0)
    return make_error(errc::shape_mismatch,
                      cat(fn, ": q has shape ", detail::shape_str(q), ", expected [N, H, ", num(D),
                          "] with H a multiple of n_kv = ", num(n_kv), " (k_pool ",
                          detail::shape_str(k_pool), ")"));
  if (auto err = detail::first_error(
          {require_same_dtype(fn, "q", q, "k_pool", k_pool),
           detail::require_same_device(fn, "q", q, "k_pool", k_pool),
           detail::require_range(fn, "scale", scale, 0.0, std::numeric_limits<double>::infinity(),
                                 false, false)}))
    return err;
  auto meta =
      check_step(fn, q.size(0), num_blocks, block_size, q, block_tables, context_lens, query_start);
  if (!meta)
    return meta.error();
  return guarded(fn, [&] {
    at::NoGradGuard no_grad;
    if (q.size(0) == 0)
      return at::empty_like(q, at::MemoryFormat::Contiguous);
#if defined(TROUPE_TORCH_CUDA)
    if (q.is_cuda() && meta->all_decode && detail::cuda_paged_decode_supports(q.scalar_type(), D))
      return detail::cuda_paged_decode_attention(q, k_pool, v_pool, meta->block_tables,
                                                 meta->context_lens, scale);
#endif
    if (meta->all_decode && cpu_decode_supports(q))
      return cpu_paged_decode(q.detach(), k_pool, v_pool, *meta, scale);
    auto compute = detail::compute_type({q});
    auto k_rows = k_pool.view({-1, D}); // one row per (slot, kv head)
    auto v_rows = v_pool.view({-1, D});
    auto qd = q.detach();
    return meta->all_decode
               ? attend_decode(qd, k_rows, v_rows, n_kv, *meta, block_size, scale, compute)
               : attend_varlen(qd, k_rows, v_rows, n_kv, *meta, block_size, scale, compute);
  });
}

} // namespace troupe::kernels
