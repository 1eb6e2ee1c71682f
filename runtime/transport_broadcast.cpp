// The broadcast weight transport: a table and the bytes over a c10d group, in buckets.
#include "runtime/transport_detail.hpp"

#include "runtime/collectives.hpp"
#include "runtime/hash.hpp"
#include "runtime/torch_guard.hpp"

#include <ATen/ATen.h>

#include <algorithm>

namespace troupe::runtime {

namespace transport_detail {
namespace {

// ---- broadcast -------------------------------------------------------------------

// NOTE [broadcast wire]: the root broadcasts, in order, (1) an int64 tensor
// {magic, version, table length, payload bytes}, (2) the table as uint8,
// (3) the payload in consecutive slices of at most bucket_bytes. Receivers
// take part in every step before judging what they got, so a rejected
// version never leaves the group out of step.
constexpr int64_t wire_magic = 0x5452505742434131; // "TRPWBCA1"

class broadcast_transport final : public weight_transport {
public:
  explicit broadcast_transport(transport_options o) : opts_(std::move(o)) {}
  transport_kind kind() const override { return transport_kind::broadcast; }

  expected<void> publish(int64_t version, const tensor_map& tensors) override {
    auto where = where_str();
    if (opts_.group->rank() != opts_.root)
      return make_error(errc::invalid_argument, where + ": publish on rank " +
                                                    std::to_string(opts_.group->rank()) +
                                                    ", but the root is " + std::to_string(opts_.root));
    if (auto err = check_new_version(version, last_, where))
      return err;
    auto ps = prepare(tensors, where);
    if (!ps)
      return ps.error();
    auto total = static_cast<int64_t>(payload_size(*ps));
    // The send buffer is reused: fresh pages would cost as much as the copy.
    if (!send_buf_.defined() || send_buf_.numel() != total) {
      auto fresh = guarded(where, [&] { return at::empty({total}, at::kByte); });
      if (!fresh)
        return fresh.error();
      send_buf_ = std::move(*fresh);
    }
    copy_in(*ps, send_buf_.data_ptr<uint8_t>());
    auto text = encode_table(version, *ps);
    if (auto ok = send(version, text, send_buf_); !ok)
      return ok.error();
    last_ = version;
    return caf::unit;
  }

  expected<received_weights> receive(int64_t version) override {
    auto where = where_str();
    if (opts_.group->rank() == opts_.root)
      return make_error(errc::invalid_argument,
                        where + ": receive on the root rank " + std::to_string(opts_.root));
    auto head = guarded(where, [] { return at::zeros({4}, at::kLong); });
    if (!head)
      return head.error();
    if (auto ok = opts_.group->broadcast(*head, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": table header");
    const auto* hp = head->data_ptr<int64_t>();
    if (hp[0] != wire_magic || hp[2] < 0 || hp[3] < 0)
      return make_error(errc::corrupted, where + ": the root sent no troupe weight header "
                                                 "(the group is out of step)");
    auto text = guarded(where, [&] { return at::empty({hp[2]}, at::kByte); });
    if (!text)
      return text.error();
    if (auto ok = opts_.group->broadcast(*text, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": table");
    // Reuse the last receive buffer when nothing received from it lives on.
    if (!recv_buf_.defined() || recv_buf_.numel() != hp[3] ||
        recv_buf_.storage().use_count() != 1) {
      auto fresh = guarded(where, [&] { return at::empty({hp[3]}, at::kByte); });
      if (!fresh)
        return fresh.error();
      recv_buf_ = std::move(*fresh);
    }
    auto flat = recv_buf_;
    if (auto ok = for_buckets(flat); !ok)
      return ok.error();
    // Everything is in: now judge it.
    auto decoded = decode_table(
        std::string_view(reinterpret_cast<const char*>(text->data_ptr<uint8_t>()),
                         static_cast<size_t>(hp[2])),
        where);
    if (!decoded)
      return decoded.error();
    if (hp[1] != decoded->version)
      return make_error(errc::corrupted, where + ": header and table disagree on the version");
    if (auto err = check_version(*decoded, version, where))
      return err;
    if (decoded->payload_bytes != static_cast<uint64_t>(hp[3]))
      return make_error(errc::corrupted,
                        where + ": version " + std::to_string(version) + ": the table describes " +
                            std::to_string(decoded->payload_bytes) + " payload bytes, " +
                            std::to_string(hp[3]) + " arrived (truncated)");
    auto keep = std::make_shared<at::Tensor>(flat);
    return verify_and_view(*decoded, flat.data_ptr<uint8_t>(), keep, where);
  }

private:
  expected<void> send(int64_t version, const std::string& text, at::Tensor& flat) {
    auto where = where_str();
    auto head = guarded(where, [&] {
      return at::tensor(std::vector<int64_t>{wire_magic, version,
                                             static_cast<int64_t>(text.size()), flat.numel()},
                        at::kLong);
    });
    if (!head)
      return head.error();
    if (auto ok = opts_.group->broadcast(*head, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": table header");
    auto t = guarded(where, [&] {
      return at::from_blob(const_cast<char*>(text.data()), {static_cast<int64_t>(text.size())},
                           at::kByte)
          .clone();
    });
    if (!t)
      return t.error();
    if (auto ok = opts_.group->broadcast(*t, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": table");
    return for_buckets(flat);
  }

  std::string where_str() const {
    return "broadcast channel '" + opts_.channel + "' (rank " +
           std::to_string(opts_.group->rank()) + ")";
  }

  expected<void> for_buckets(at::Tensor& flat) {
    auto n = flat.numel();
    for (int64_t off = 0; off < n; off += opts_.bucket_bytes) {
      auto len = std::min<int64_t>(opts_.bucket_bytes, n - off);
      auto slice = flat.narrow(0, off, len);
      if (auto ok = opts_.group->broadcast(slice, opts_.root); !ok)
        return with_prefix(ok.error(), where_str() + ": bucket at byte " + std::to_string(off));
    }
    return caf::unit;
  }

  transport_options opts_;
  int64_t last_ = -1;
  at::Tensor send_buf_;
  at::Tensor recv_buf_;
};

} // namespace

std::unique_ptr<weight_transport> make_broadcast_transport(const transport_options& options) {
  return std::make_unique<broadcast_transport>(options);
}

} // namespace transport_detail
} // namespace troupe::runtime
