#include "runtime/tensor_batch.hpp"

#include "runtime/safetensors.hpp"
#include "runtime/torch_guard.hpp"

#include <ATen/ATen.h>

#include <cstring>

namespace troupe::runtime {

namespace {

std::string names_of(const std::map<std::string, at::Tensor>& tensors) {
  std::string out;
  for (const auto& [name, t] : tensors) {
    (void)t;
    if (!out.empty())
      out += ", ";
    out += name;
  }
  return out.empty() ? "none" : out;
}

} // namespace

expected<void> tensor_batch::set(const std::string& name, at::Tensor t) {
  if (!t.defined() || t.dim() == 0)
    return make_error(errc::shape_mismatch,
                      "tensor_batch: " + name + " must be a defined tensor with a batch dimension");
  auto rows = t.size(0);
  bool only_this = tensors_.empty() || (tensors_.size() == 1 && tensors_.count(name));
  if (!only_this && rows != size_)
    return make_error(errc::shape_mismatch, "tensor_batch: " + name + " has " +
                                                std::to_string(rows) + " rows, the batch has " +
                                                std::to_string(size_));
  tensors_[name] = std::move(t);
  size_ = rows;
  return {};
}

expected<at::Tensor> tensor_batch::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    return make_error(errc::not_found,
                      "tensor_batch: no tensor " + name + " (present: " + names_of(tensors_) + ")");
  return it->second;
}

void tensor_batch::erase(const std::string& name) {
  tensors_.erase(name);
  if (tensors_.empty())
    size_ = 0;
}

expected<tensor_batch> tensor_batch::select(const at::Tensor& index) const {
  return guarded("tensor_batch::select", [&]() -> expected<tensor_batch> {
    tensor_batch out;
    for (const auto& [name, t] : tensors_) {
      auto idx = index.to(t.device(), at::kLong);
      if (auto ok = out.set(name, t.index_select(0, idx)); !ok)
        return ok.error();
    }
    return out;
  });
}

expected<tensor_batch> tensor_batch::slice(int64_t begin, int64_t end) const {
  if (begin < 0 || end < begin || end > size_)
    return make_error(errc::out_of_range, "tensor_batch::slice: [" + std::to_string(begin) + ", " +
                                              std::to_string(end) + ") outside [0, " +
                                              std::to_string(size_) + ")");
  tensor_batch out;
  for (const auto& [name, t] : tensors_)
    out.tensors_[name] = t.narrow(0, begin, end - begin);
  out.size_ = tensors_.empty() ? 0 : end - begin;
  return out;
}

expected<std::vector<tensor_batch>> tensor_batch::split(int64_t parts) const {
  if (parts < 1 || parts > size_)
    return make_error(errc::invalid_argument, "tensor_batch::split: " + std::to_string(parts) +
                                                  " parts of a batch of " +
                                                  std::to_string(size_) + " rows");
  std::vector<tensor_batch> out;
  out.reserve(static_cast<size_t>(parts));
  int64_t base = size_ / parts, extra = size_ % parts, begin = 0;
  for (int64_t p = 0; p < parts; ++p) {
    int64_t n = base + (p < extra ? 1 : 0);
    auto part = slice(begin, begin + n);
    if (!part)
      return part.error();
    out.push_back(std::move(*part));
    begin += n;
  }
  return out;
}

expected<tensor_batch> tensor_batch::concat(const std::vector<tensor_batch>& parts) {
  if (parts.empty())
    return tensor_batch{};
  return guarded("tensor_batch::concat", [&]() -> expected<tensor_batch> {
    tensor_batch out;
    for (const auto& [name, first] : parts.front().tensors_) {
      (void)first;
      std::vector<at::Tensor> pieces;
      pieces.reserve(parts.size());
      for (size_t i = 0; i < parts.size(); ++i) {
        auto t = parts[i].get(name);
        if (!t)
          return with_prefix(t.error(), "part " + std::to_string(i));
        pieces.push_back(*t);
      }
      if (auto ok = out.set(name, at::cat(pieces, 0)); !ok)
        return ok.error();
    }
    for (size_t i = 1; i < parts.size(); ++i)
      if (parts[i].tensors_.size() != parts.front().tensors_.size())
        return make_error(errc::shape_mismatch,
                          "tensor_batch::concat: part " + std::to_string(i) + " has tensors " +
                              names_of(parts[i].tensors_) + ", part 0 has " +
                              names_of(parts.front().tensors_));
    return out;
  });
}

} // namespace troupe::runtime

namespace troupe::runtime {

expected<tensor_batch_wire> to_wire(const tensor_batch& b) {
  tensor_batch_wire w;
  for (const auto& [name, t] : b.tensors()) {
    auto dtype = safetensors_dtype_name(t.scalar_type());
    if (dtype.empty())
      return make_error(errc::unsupported, "tensor_batch: tensor '" + name + "' has dtype " +
                                               std::string{c10::toString(t.scalar_type())} +
                                               ", which cannot be sent");
    auto cpu = guarded("tensor_batch: tensor '" + name + "'",
                       [&] { return t.detach().to(at::kCPU).contiguous(); });
    if (!cpu)
      return cpu.error();
    w.names.push_back(name);
    w.dtypes.push_back(dtype);
    w.shapes.emplace_back(cpu->sizes().begin(), cpu->sizes().end());
    w.data.emplace_back(static_cast<const char*>(cpu->data_ptr()),
                        static_cast<size_t>(cpu->numel()) * cpu->element_size());
  }
  return w;
}

expected<tensor_batch> from_wire(const tensor_batch_wire& w) {
  auto n = w.names.size();
  if (w.dtypes.size() != n || w.shapes.size() != n || w.data.size() != n)
    return make_error(errc::corrupted, "tensor_batch: wire form has " + std::to_string(n) +
                                           " names but " + std::to_string(w.dtypes.size()) +
                                           " dtypes, " + std::to_string(w.shapes.size()) +
                                           " shapes and " + std::to_string(w.data.size()) +
                                           " buffers");
  tensor_batch b;
  for (size_t i = 0; i < n; ++i) {
    const auto& name = w.names[i];
    auto type = safetensors_scalar_type(w.dtypes[i]);
    if (!type)
      return make_error(errc::corrupted,
                        "tensor_batch: tensor '" + name + "': unknown dtype '" + w.dtypes[i] + "'");
    uint64_t numel = 1;
    for (auto d : w.shapes[i]) {
      if (d < 0)
        return make_error(errc::corrupted, "tensor_batch: tensor '" + name + "': negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    auto bytes = numel * safetensors_dtype_size(w.dtypes[i]);
    if (bytes != w.data[i].size())
      return make_error(errc::corrupted, "tensor_batch: tensor '" + name + "': " +
                                             std::to_string(w.data[i].size()) + " bytes for a " +
                                             std::to_string(bytes) + "-byte shape");
    auto t = guarded("tensor_batch: tensor '" + name + "'", [&] {
      auto out = at::empty(w.shapes[i], at::TensorOptions().dtype(*type));
      if (bytes > 0)
        std::memcpy(out.data_ptr(), w.data[i].data(), bytes);
      return out;
    });
    if (!t)
      return t.error();
    if (auto ok = b.set(name, std::move(*t)); !ok)
      return with_prefix(ok.error(), "tensor_batch: wire form");
  }
  return b;
}

} // namespace troupe::runtime
