#include "actors/train/micro_batches.hpp"

#include "runtime/torch_guard.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

namespace troupe::actors::train {

namespace {

// The masks whose tokens are a row's length.
std::vector<std::string> length_masks(const runtime::tensor_batch& b) {
  if (b.contains("attention_mask"))
    return {"attention_mask"};
  return {"chosen_mask", "rejected_mask"};
}

} // namespace

expected<int64_t> batch_width(const runtime::tensor_batch& b) {
  for (const char* key : {"input_ids", "chosen_ids"})
    if (b.contains(key)) {
      auto t = b.get(key);
      if (!t)
        return t.error();
      if (t->dim() != 2)
        return make_error(errc::shape_mismatch, std::string{key} + " must be [B, L]");
      return t->size(1);
    }
  return make_error(errc::not_found, "micro_batch_tokens: the batch has neither input_ids nor "
                                     "chosen_ids to measure its rows by");
}

expected<std::vector<int64_t>> row_lengths(const runtime::tensor_batch& b) {
  std::vector<int64_t> out(static_cast<size_t>(b.size()), 0);
  for (const auto& key : length_masks(b)) {
    auto mask = b.get(key);
    if (!mask)
      return with_prefix(mask.error(), "micro_batch_tokens");
    auto ok = guarded("micro_batch_tokens: row lengths", [&] {
      auto n = mask->to(at::kLong).sum(1).contiguous();
      const auto* p = n.data_ptr<int64_t>();
      for (size_t i = 0; i < out.size(); ++i)
        out[i] = std::max(out[i], p[i]);
    });
    if (!ok)
      return ok.error();
  }
  return out;
}

std::vector<std::vector<int64_t>> pack_by_tokens(const std::vector<int64_t>& lengths,
                                                 int64_t budget) {
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)];
  });
  std::vector<std::vector<int64_t>> out;
  int64_t longest = 0;
  for (auto row : order) {
    // Longest first: a micro-batch's first row is its longest.
    if (out.empty() || static_cast<int64_t>(out.back().size() + 1) * longest > budget) {
      out.emplace_back();
      longest = std::max<int64_t>(lengths[static_cast<size_t>(row)], 1);
    }
    out.back().push_back(row);
  }
  return out;
}

expected<runtime::tensor_batch> take_rows(const runtime::tensor_batch& b,
                                          const std::vector<int64_t>& rows, int64_t length) {
  auto width = batch_width(b);
  if (!width)
    return width.error();
  auto picked =
      guarded("micro_batch_tokens: taking rows", [&]() -> expected<runtime::tensor_batch> {
        return b.select(at::tensor(rows, at::kLong));
      });
  if (!picked)
    return picked.error();
  runtime::tensor_batch out;
  for (const auto& [name, t] : picked->tensors()) {
    at::Tensor cut = t;
    if (t.dim() >= 2 && t.size(1) == *width)
      cut = t.narrow(1, 0, length);
    else if (t.dim() >= 2 && t.size(1) == *width - 1)
      cut = t.narrow(1, 0, std::max<int64_t>(length - 1, 0));
    if (auto ok = out.set(name, cut); !ok)
      return ok.error();
  }
  return out;
}

expected<runtime::tensor_batch> pad_outputs(const runtime::tensor_batch& out, int64_t from,
                                            int64_t to) {
  runtime::tensor_batch padded;
  for (const auto& [name, t] : out.tensors()) {
    at::Tensor full = t;
    if (to != from && t.dim() == 2 && t.size(1) == from - 1) {
      auto p = guarded("micro_batch_tokens: padding outputs", [&] {
        return at::constant_pad_nd(t, {0, to - from}, 0);
      });
      if (!p)
        return p.error();
      full = *p;
    }
    if (auto ok = padded.set(name, full); !ok)
      return ok.error();
  }
  return padded;
}

} // namespace troupe::actors::train
