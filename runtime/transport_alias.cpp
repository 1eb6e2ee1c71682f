// The alias weight transport: same process, the receiver gets the publisher's tensors.
#include "runtime/transport_detail.hpp"

#include <map>
#include <mutex>

namespace troupe::runtime {

namespace transport_detail {
namespace {

// ---- alias -----------------------------------------------------------------------

struct alias_slot {
  const void* owner = nullptr;
  int64_t version = -1;
  tensor_map tensors;
};

std::mutex& alias_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, alias_slot>& alias_registry() {
  static std::map<std::string, alias_slot> r;
  return r;
}

class alias_transport final : public weight_transport {
public:
  explicit alias_transport(transport_options o) : opts_(std::move(o)) {}
  ~alias_transport() override {
    std::lock_guard guard{alias_mutex()};
    auto& reg = alias_registry();
    auto it = reg.find(opts_.channel);
    if (it != reg.end() && it->second.owner == this)
      reg.erase(it);
  }
  transport_kind kind() const override { return transport_kind::alias; }

  expected<void> publish(int64_t version, const tensor_map& tensors) override {
    auto where = "alias channel '" + opts_.channel + "'";
    if (auto err = check_new_version(version, last_, where))
      return err;
    std::lock_guard guard{alias_mutex()};
    auto& slot = alias_registry()[opts_.channel];
    if (slot.owner != nullptr && slot.owner != this)
      return make_error(errc::invalid_argument, where + " already has another publisher");
    slot.owner = this;
    slot.version = version;
    slot.tensors = tensors; // shares storage: zero copy
    last_ = version;
    return caf::unit;
  }

  expected<received_weights> receive(int64_t version) override {
    auto where = "alias channel '" + opts_.channel + "'";
    std::lock_guard guard{alias_mutex()};
    auto& reg = alias_registry();
    auto it = reg.find(opts_.channel);
    if (it == reg.end())
      return make_error(errc::not_found, where + ": nothing published");
    table t;
    t.version = it->second.version;
    if (auto err = check_version(t, version, where))
      return err;
    received_weights out;
    out.version = version;
    out.tensors = it->second.tensors;
    for (const auto& [name, x] : out.tensors)
      out.bytes += static_cast<uint64_t>(x.numel()) * x.element_size();
    return out;
  }

private:
  transport_options opts_;
  int64_t last_ = -1;
};

} // namespace

std::unique_ptr<weight_transport> make_alias_transport(const transport_options& options) {
  return std::make_unique<alias_transport>(options);
}

} // namespace transport_detail
} // namespace troupe::runtime
