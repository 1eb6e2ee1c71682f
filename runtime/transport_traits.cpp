#include "runtime/weight_transport.hpp"

// What each weight transport can do (no LibTorch here): the job's checks
// and `troupe plan` choose and refuse channels with it, as the factory in
// weight_transport.cpp does.
namespace troupe::runtime {

transport_traits traits_of(transport_kind kind) noexcept {
  using reach = transport_traits::reach;
  transport_traits t;
  switch (kind) {
  case transport_kind::alias:
    t.span = reach::process;
    t.receiver_stages = false;
    break;
  case transport_kind::shm:
    t.span = reach::host;
    break;
  case transport_kind::cuda_ipc:
    t.span = reach::host;
    t.needs_cuda = true;
    t.receiver_stages = false;
    break;
  case transport_kind::broadcast:
    t.both_ends_at_once = true;
    t.needs_group = true;
    t.one_receiver = true;
    break;
  case transport_kind::disk:
    t.needs_dir = true;
    break;
  }
  return t;
}

bool available(transport_kind kind) noexcept {
#ifdef TROUPE_RUNTIME_CUDA_IPC
  return true;
#else
  return !traits_of(kind).needs_cuda;
#endif
}

} // namespace troupe::runtime
