#include "runtime/weight_transport.hpp"

#include "runtime/collectives.hpp"
#include "runtime/transport_detail.hpp"

#include <algorithm>

namespace troupe::runtime {

namespace {

bool valid_channel(const std::string& c) {
  return !c.empty() && c.size() <= 200 && std::all_of(c.begin(), c.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-';
  }) && c != "." && c != "..";
}

/// cuda_ipc: its handles travel over a shm channel of their own, which the
/// factory opens for it (NOTE [cuda ipc transfers]).
expected<std::unique_ptr<weight_transport>> make_cuda_ipc(const transport_options& options) {
#ifdef TROUPE_RUNTIME_CUDA_IPC
  auto table_options = options;
  table_options.kind = transport_kind::shm;
  table_options.channel = options.channel + "-cudaipc";
  auto table = make_weight_transport(table_options);
  if (!table)
    return table.error();
  return transport_detail::make_cuda_ipc_transport(options, std::move(*table));
#else
  return make_error(errc::unsupported, "weight transport cuda_ipc: this build has no CUDA");
#endif
}

} // namespace

// NOTE [streamed publish]: a transport that cannot send part of a publish
// takes the whole — copies: a producer's tensors are valid during put only
// — then publishes it.
expected<void> weight_transport::publish_streamed(int64_t version,
                                                  const std::vector<tensor_spec>& layout,
                                                  const tensor_producer& produce) {
  std::vector<at::Tensor> got(layout.size());
  if (auto ok = produce([&](size_t i, const at::Tensor& t) {
        got.at(i) = t.detach().to(at::kCPU).contiguous().clone();
      });
      !ok)
    return ok;
  tensor_map tensors;
  for (size_t i = 0; i < layout.size(); ++i) {
    if (!got[i].defined())
      return make_error(errc::invalid_argument,
                        "publish: the producer gave no tensor '" + layout[i].name + "'");
    tensors.emplace(layout[i].name, std::move(got[i]));
  }
  return publish(version, tensors);
}

expected<std::unique_ptr<weight_transport>>
make_weight_transport(const transport_options& options) {
  if (!valid_channel(options.channel))
    return make_error(errc::invalid_argument,
                      "weight transport: channel '" + options.channel +
                          "' must be 1-200 letters, digits, '.', '_' or '-'");
  if (options.keep < 1)
    return make_error(errc::invalid_argument, "weight transport: keep must be at least 1");
  if (options.timeout_ms <= 0)
    return make_error(errc::invalid_argument, "weight transport: timeout_ms must be positive");
  auto what = "weight transport " + std::string{to_string(options.kind)};
  auto traits = traits_of(options.kind);
  if (!available(options.kind))
    return make_error(errc::unsupported, what + ": this build has no CUDA (nvcc was not found)");
  if (traits.needs_dir && options.dir.empty())
    return make_error(errc::invalid_argument, what + ": dir is empty");
  if (traits.needs_group) {
    if (options.group == nullptr)
      return make_error(errc::invalid_argument, what + ": no process group");
    if (options.root < 0 || options.root >= options.group->size())
      return make_error(errc::invalid_argument,
                        what + ": root " + std::to_string(options.root) + " is not a rank of a group of " +
                          std::to_string(options.group->size()));
    if (options.bucket_bytes < 1)
      return make_error(errc::invalid_argument, what + ": bucket_bytes must be positive");
  }
  switch (options.kind) {
    case transport_kind::alias: return transport_detail::make_alias_transport(options);
    case transport_kind::shm: return transport_detail::make_shm_transport(options);
    case transport_kind::disk: return transport_detail::make_disk_transport(options);
    case transport_kind::broadcast: return transport_detail::make_broadcast_transport(options);
    case transport_kind::cuda_ipc: return make_cuda_ipc(options);
  }
  return make_error(errc::invalid_argument, what + ": unknown kind");
}

} // namespace troupe::runtime
