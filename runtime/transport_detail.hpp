#pragma once
// Internal to runtime/: what the weight transports share — the table every
// transfer carries (NOTE [versioned transfers] in weight_transport.hpp), its
// codec and checks, a few OS helpers — and each transport's maker, which
// make_weight_transport calls. Not installed for other folders.

#include "runtime/weight_table.hpp"
#include "runtime/weight_transport.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

namespace troupe::runtime::transport_detail {

using clock_type = std::chrono::steady_clock;

/// Payload offsets are aligned to this many bytes.
constexpr uint64_t data_alignment = 64;

uint64_t align_up(uint64_t x, uint64_t a);

/// A tensor ready to be copied out: CPU, contiguous, with its table entry.
struct prepared {
  entry e;
  at::Tensor cpu;
};

/// The tensors on the CPU, contiguous, with offsets in one payload.
expected<std::vector<prepared>> prepare(const tensor_map& tensors, const std::string& where);
/// The payload's length in bytes.
uint64_t payload_size(const std::vector<prepared>& ps);
/// Copies every tensor into `payload` at its offset, filling in the hashes.
void copy_in(std::vector<prepared>& ps, uint8_t* payload);
/// The table as JSON text ("troupe-weights/1").
std::string encode_table(int64_t version, const std::vector<prepared>& ps);
/// Verifies each tensor's hash over `payload` (payload_bytes long) and makes
/// views of it; `keepalive` lives as long as any view.
expected<received_weights> verify_and_view(const table& t, const uint8_t* payload,
                                           std::shared_ptr<void> keepalive,
                                           const std::string& where);
/// errc::io_error with `what` and strerror(errno).
caf::error os_error(const std::string& what);
/// Takes flock(op) on `fd`, retrying until `timeout_ms`.
bool lock_within(int fd, int op, int64_t timeout_ms);

/// Closes its file descriptor (and so drops its flock) at scope end.
struct fd_holder {
  int fd = -1;
  explicit fd_holder(int f) : fd(f) {}
  fd_holder(const fd_holder&) = delete;
  fd_holder& operator=(const fd_holder&) = delete;
  ~fd_holder() {
    if (fd >= 0)
      ::close(fd);
  }
};

/// The transports, one file each (options already checked by the factory).
std::unique_ptr<weight_transport> make_alias_transport(const transport_options& options);
std::unique_ptr<weight_transport> make_shm_transport(const transport_options& options);
std::unique_ptr<weight_transport> make_disk_transport(const transport_options& options);
std::unique_ptr<weight_transport> make_broadcast_transport(const transport_options& options);
#ifdef TROUPE_RUNTIME_CUDA_IPC
/// NOTE [cuda ipc transfers]: handles travel over `table_channel`, a
/// transport the factory opened for it.
expected<std::unique_ptr<weight_transport>>
make_cuda_ipc_transport(const transport_options& options,
                        std::unique_ptr<weight_transport> table_channel);
#endif

} // namespace troupe::runtime::transport_detail
