// The broadcast weight transport: a table and the bytes over a c10d group, in buckets.
#include "runtime/transport_detail.hpp"

#include "runtime/collectives.hpp"
#include "runtime/hash.hpp"
#include "runtime/torch_guard.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

namespace troupe::runtime {

namespace transport_detail {
namespace {

// ---- broadcast -------------------------------------------------------------------

// NOTE [broadcast wire]: the root broadcasts, in order, (1) an int64 tensor
// {magic, version, payload bytes}, (2) the payload in consecutive slices of
// at most bucket_bytes, (3) an int64 {table length, or -1: the publisher
// failed}, (4) the table as uint8. The table — each tensor's hash with it —
// comes last, so a streamed publish (NOTE [streamed publish]) sends each
// slice as soon as it is filled, from a thread of its own, while the
// publisher makes the next tensors. Receivers take part in every step
// before judging what they got, so neither a rejected version nor a failed
// publisher leaves the group out of step.
constexpr int64_t wire_magic = 0x5452505742434132; // "TRPWBCA2"

// The payload's fill level, which a streamed publish raises as it copies
// tensors in and its sender waits on.
class fill_level {
public:
  void raise(int64_t to) {
    {
      std::lock_guard<std::mutex> lock(m_);
      level_ = std::max(level_, to);
    }
    cv_.notify_all();
  }
  void wait_for(int64_t at_least) {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return level_ >= at_least; });
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  int64_t level_ = 0;
};

class broadcast_transport final : public weight_transport {
public:
  explicit broadcast_transport(transport_options o) : opts_(std::move(o)) {}
  transport_kind kind() const override { return transport_kind::broadcast; }

  expected<void> publish(int64_t version, const tensor_map& tensors) override {
    auto ps = prepare(tensors, where_str());
    if (!ps)
      return ps.error();
    std::vector<tensor_spec> layout;
    for (const auto& p : *ps)
      layout.push_back({p.e.name, p.cpu.scalar_type(), p.e.shape});
    return publish_streamed(version, layout, [&](const tensor_sink& put) -> expected<void> {
      for (size_t i = 0; i < ps->size(); ++i)
        put(i, (*ps)[i].cpu);
      return {};
    });
  }

  expected<void> publish_streamed(int64_t version, const std::vector<tensor_spec>& layout,
                                  const tensor_producer& produce) override {
    auto where = where_str();
    if (opts_.group->rank() != opts_.root)
      return make_error(errc::invalid_argument, where + ": publish on rank " +
                                                    std::to_string(opts_.group->rank()) +
                                                    ", but the root is " + std::to_string(opts_.root));
    if (auto err = check_new_version(version, last_, where))
      return err;
    auto ps = planned(layout, where);
    if (!ps)
      return ps.error();
    const auto total = static_cast<int64_t>(payload_size(*ps));
    // The send buffer is reused: fresh pages would cost as much as the copy.
    if (!send_buf_.defined() || send_buf_.numel() != total) {
      auto fresh = guarded(where, [&] { return at::empty({total}, at::kByte); });
      if (!fresh)
        return fresh.error();
      send_buf_ = std::move(*fresh);
    }
    auto head = guarded(where, [&] {
      return at::tensor(std::vector<int64_t>{wire_magic, version, total}, at::kLong);
    });
    if (!head)
      return head.error();
    if (auto ok = opts_.group->broadcast(*head, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": header");
    // The sender broadcasts each slice once the producer has filled it.
    fill_level filled;
    expected<void> sent;
    std::thread sender([&] { sent = for_buckets(send_buf_, &filled); });
    auto made = fill(*ps, produce, filled, where);
    filled.raise(total); // a failed producer's slices go out as they are
    sender.join();
    const bool ok = made && sent;
    auto text = ok ? encode_table(version, *ps) : std::string{};
    if (auto trailer = send_table(ok ? static_cast<int64_t>(text.size()) : -1, text); !trailer)
      return trailer;
    if (!made)
      return made;
    if (!sent)
      return sent;
    last_ = version;
    return caf::unit;
  }

  expected<received_weights> receive(int64_t version) override {
    auto where = where_str();
    if (opts_.group->rank() == opts_.root)
      return make_error(errc::invalid_argument,
                        where + ": receive on the root rank " + std::to_string(opts_.root));
    auto head = guarded(where, [] { return at::zeros({3}, at::kLong); });
    if (!head)
      return head.error();
    if (auto ok = opts_.group->broadcast(*head, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": header");
    const auto* hp = head->data_ptr<int64_t>();
    if (hp[0] != wire_magic || hp[2] < 0)
      return make_error(errc::corrupted, where + ": the root sent no troupe weight header "
                                                 "(the group is out of step)");
    const int64_t sent_version = hp[1], payload = hp[2];
    // Reuse the last receive buffer when nothing received from it lives on.
    if (!recv_buf_.defined() || recv_buf_.numel() != payload ||
        recv_buf_.storage().use_count() != 1) {
      auto fresh = guarded(where, [&] { return at::empty({payload}, at::kByte); });
      if (!fresh)
        return fresh.error();
      recv_buf_ = std::move(*fresh);
    }
    auto flat = recv_buf_;
    if (auto ok = for_buckets(flat, nullptr); !ok)
      return ok.error();
    auto text = receive_table(where);
    if (!text)
      return text.error();
    // Everything is in: now judge it.
    auto decoded = decode_table(*text, where);
    if (!decoded)
      return decoded.error();
    if (sent_version != decoded->version)
      return make_error(errc::corrupted, where + ": header and table disagree on the version");
    if (auto err = check_version(*decoded, version, where))
      return err;
    if (decoded->payload_bytes != static_cast<uint64_t>(payload))
      return make_error(errc::corrupted,
                        where + ": version " + std::to_string(version) + ": the table describes " +
                            std::to_string(decoded->payload_bytes) + " payload bytes, " +
                            std::to_string(payload) + " arrived (truncated)");
    auto keep = std::make_shared<at::Tensor>(flat);
    return verify_and_view(*decoded, flat.data_ptr<uint8_t>(), keep, where);
  }

private:
  // The layout's table entries, offsets as prepare() lays them out.
  static expected<std::vector<prepared>> planned(const std::vector<tensor_spec>& layout,
                                                 const std::string& where) {
    std::vector<prepared> out;
    uint64_t offset = 0;
    for (const auto& spec : layout) {
      prepared p;
      p.e.name = spec.name;
      p.e.dtype = safetensors_dtype_name(spec.dtype);
      if (p.e.dtype.empty())
        return make_error(errc::unsupported, where + ": tensor '" + spec.name + "' has dtype " +
                                                 std::string{c10::toString(spec.dtype)} +
                                                 ", which has no safetensors name");
      p.e.shape = spec.shape;
      p.e.bytes = static_cast<uint64_t>(spec.bytes());
      offset = align_up(offset, data_alignment);
      p.e.offset = offset;
      offset += p.e.bytes;
      out.push_back(std::move(p));
    }
    return out;
  }

  // Runs the producer, copying each tensor in at its offset (its hash
  // with it) and raising the fill level past it; every tensor must come,
  // in order, as the layout says.
  expected<void> fill(std::vector<prepared>& ps, const tensor_producer& produce, fill_level& filled,
                      const std::string& where) {
    size_t next = 0;
    std::optional<caf::error> bad;
    auto put = [&](size_t i, const at::Tensor& t) {
      if (bad)
        return;
      auto& p = ps.at(i);
      if (i != next || !t.defined() || safetensors_dtype_name(t.scalar_type()) != p.e.dtype ||
          t.sizes() != at::IntArrayRef(p.e.shape)) {
        bad = make_error(errc::invalid_argument,
                         where + ": tensor '" + p.e.name + "' is not the layout's next");
        return;
      }
      auto cpu = t.detach().to(at::kCPU).contiguous();
      p.e.hash = hash64_copy(send_buf_.data_ptr<uint8_t>() + p.e.offset, cpu.data_ptr(), p.e.bytes);
      ++next;
      filled.raise(next < ps.size() ? static_cast<int64_t>(ps[next].e.offset)
                                    : static_cast<int64_t>(payload_size(ps)));
    };
    auto made = guarded(where, [&] { return produce(put); });
    if (!made)
      return made;
    if (bad)
      return *bad;
    if (next != ps.size())
      return make_error(errc::invalid_argument, where + ": the producer gave " +
                                                    std::to_string(next) + " of " +
                                                    std::to_string(ps.size()) + " tensors");
    return {};
  }

  expected<void> send_table(int64_t length, const std::string& text) {
    auto where = where_str();
    auto size = guarded(where, [&] { return at::tensor(std::vector<int64_t>{length}, at::kLong); });
    if (!size)
      return size.error();
    if (auto ok = opts_.group->broadcast(*size, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": table length");
    if (length <= 0)
      return caf::unit;
    auto t = guarded(where, [&] {
      return at::from_blob(const_cast<char*>(text.data()), {length}, at::kByte).clone();
    });
    if (!t)
      return t.error();
    if (auto ok = opts_.group->broadcast(*t, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": table");
    return caf::unit;
  }

  expected<std::string> receive_table(const std::string& where) {
    auto size = guarded(where, [] { return at::zeros({1}, at::kLong); });
    if (!size)
      return size.error();
    if (auto ok = opts_.group->broadcast(*size, opts_.root); !ok)
      return with_prefix(ok.error(), where + ": table length");
    const int64_t length = size->item<int64_t>();
    if (length < 0)
      return make_error(errc::corrupted, where + ": the publisher failed mid-publish");
    auto text = guarded(where, [&] { return at::empty({length}, at::kByte); });
    if (!text)
      return text.error();
    if (length > 0)
      if (auto ok = opts_.group->broadcast(*text, opts_.root); !ok)
        return with_prefix(ok.error(), where + ": table");
    return std::string(reinterpret_cast<const char*>(text->data_ptr<uint8_t>()),
                       static_cast<size_t>(length));
  }

  std::string where_str() const {
    return "broadcast channel '" + opts_.channel + "' (rank " +
           std::to_string(opts_.group->rank()) + ")";
  }

  // The payload's slices, each once `filled` (when given) has reached its end.
  expected<void> for_buckets(at::Tensor& flat, fill_level* filled) {
    auto n = flat.numel();
    for (int64_t off = 0; off < n; off += opts_.bucket_bytes) {
      auto len = std::min<int64_t>(opts_.bucket_bytes, n - off);
      if (filled)
        filled->wait_for(off + len);
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
