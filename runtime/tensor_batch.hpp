#pragma once
// TensorBatch: named tensors that share their first (batch) dimension, the
// unit of data between the driver and the role actors. Split / select /
// concat serve minibatching and dispatch to data-parallel ranks. In one
// process a batch travels by reference (tensors are reference-counted; a
// copy of the batch shares storage); across processes it is serialised
// through its wire form (inspect, below): every tensor's dtype, shape and
// bytes, rebuilt and checked on arrival.

#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>
#include <caf/meta/load_callback.hpp>
#include <caf/meta/save_callback.hpp>
#include <caf/meta/type_name.hpp>

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

/// What a tensor_batch is across processes: per tensor its name, dtype (a
/// safetensors name), shape and bytes (row-major, little-endian, CPU).
struct tensor_batch_wire {
  std::vector<std::string> names;
  std::vector<std::string> dtypes;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> data;
};

/// The wire form of `b` (tensors copied to contiguous CPU bytes).
expected<tensor_batch_wire> to_wire(const tensor_batch& b);

/// Rebuilds a batch, checking that the lists agree, dtypes are known and
/// each tensor's bytes match its shape (corrupted otherwise).
expected<tensor_batch> from_wire(const tensor_batch_wire& w);

/// CAF serialisation: a batch crosses processes as its wire form.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tensor_batch& x) {
  tensor_batch_wire w;
  auto save = caf::meta::save_callback([&]() -> caf::error {
    auto r = to_wire(x);
    if (!r)
      return r.error();
    w = std::move(*r);
    return caf::error{};
  });
  auto load = caf::meta::load_callback([&]() -> caf::error {
    auto r = from_wire(w);
    if (!r)
      return r.error();
    x = std::move(*r);
    return caf::error{};
  });
  return f(caf::meta::type_name("tensor_batch"), save, w.names, w.dtypes, w.shapes, w.data, load);
}

} // namespace troupe::runtime
