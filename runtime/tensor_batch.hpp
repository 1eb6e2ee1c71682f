#pragma once
// TensorBatch: named tensors that share their first (batch) dimension, the
// unit of data between the driver and the role actors. Split / select /
// concat serve minibatching and dispatch to data-parallel ranks. In one
// process a batch travels by reference (tensors are reference-counted; a
// copy of the batch shares storage); across processes it is serialised
// (issue 5).

#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace troupe::runtime {

class tensor_batch {
public:
  /// Rows of the batch (0 when empty).
  int64_t size() const { return size_; }
  bool empty() const { return tensors_.empty(); }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

  /// Adds or replaces `name`; its first dimension must equal size() (any
  /// size for the first tensor). shape_mismatch names the tensor otherwise.
  expected<void> set(const std::string& name, at::Tensor t);

  /// The tensor `name`, or not_found listing the names present.
  expected<at::Tensor> get(const std::string& name) const;

  /// Removes `name` (no error when absent).
  void erase(const std::string& name);

  const std::map<std::string, at::Tensor>& tensors() const { return tensors_; }

  /// Rows `index` (int64 [K]) of every tensor, in that order.
  expected<tensor_batch> select(const at::Tensor& index) const;

  /// Rows [begin, end) of every tensor (views, no copy).
  expected<tensor_batch> slice(int64_t begin, int64_t end) const;

  /// `parts` consecutive slices of sizes differing by at most one (the
  /// first size() % parts get one more row); parts must be in [1, size()].
  expected<std::vector<tensor_batch>> split(int64_t parts) const;

  /// Concatenates batches with the same tensor names along dim 0.
  static expected<tensor_batch> concat(const std::vector<tensor_batch>& parts);

private:
  std::map<std::string, at::Tensor> tensors_;
  int64_t size_ = 0;
};

} // namespace troupe::runtime
