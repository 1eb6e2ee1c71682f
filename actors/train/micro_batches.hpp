#pragma once
// Cutting a rank's share of a batch into micro-batches (NOTE [micro-batches]
// in train_engine.cpp): `micro_batch_rows` rows at a time, or by a token
// budget.
//
// NOTE [token micro-batches]: with `micro_batch_tokens` the rows are taken
// longest first (a row's length: its attention mask's tokens; a preference
// pair's, the longer of its two) and a micro-batch grows while its rows
// times its longest row stay within the budget — the padded tokens its
// forward computes, since each micro-batch is cut to its longest row (the
// batches are right-padded: the columns past it are padding; a preference
// pair's two sequences both count). A row longer than the budget is a
// micro-batch of its own. As verl's dynamic batch
// size, it bounds the activations by tokens whatever the lengths; what is
// learned does not change (the gradients are accumulated as for rows).

#include "runtime/tensor_batch.hpp"

#include <cstdint>
#include <vector>

namespace troupe::actors::train {

/// Tokens of each row (right-padded batches: input_ids / attention_mask
/// [B, L], or a preference batch's chosen_* and rejected_*).
expected<std::vector<int64_t>> row_lengths(const runtime::tensor_batch& b);

/// NOTE [token micro-batches]: the rows of each micro-batch, longest first.
std::vector<std::vector<int64_t>> pack_by_tokens(const std::vector<int64_t>& lengths,
                                                 int64_t budget);

/// Rows `rows` of `b`, each per-token tensor (second dimension the batch's
/// width L, or L - 1 for the shifted ones) cut to `length` (length - 1)
/// columns.
expected<runtime::tensor_batch> take_rows(const runtime::tensor_batch& b,
                                          const std::vector<int64_t>& rows, int64_t length);

/// A micro-batch's per-token outputs (second dimension `from` - 1) padded
/// with zeros back to `to` - 1 columns.
expected<runtime::tensor_batch> pad_outputs(const runtime::tensor_batch& out, int64_t from,
                                            int64_t to);

/// The width L of a right-padded batch (input_ids', or chosen_ids').
expected<int64_t> batch_width(const runtime::tensor_batch& b);

} // namespace troupe::actors::train
