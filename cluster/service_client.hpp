#pragma once
// What troupe's clients of user services (a RewardService, an
// EnvironmentService) share: the channel and token from the job's remote
// section, one call with its retries (NOTE [remote reward] in
// remote_reward.hpp), and calls kept in flight at once.

#include "actors/rl/job_config.hpp"
#include "runtime/error.hpp"

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

namespace troupe::cluster {

/// A service's channel and bearer token.
struct service_link {
  std::string address;
  std::string token;
  std::shared_ptr<grpc::Channel> channel;
};

/// Reads the token file and opens the channel of `c` (TLS when c.ca_file is
/// set, clear text to a loopback address only); errors name `key` (the
/// section: "rl.reward.remote") and `peer` ("reward service").
expected<service_link> open_service(const actors::rl::remote_service_config& c,
                                    const std::string& key, const std::string& peer);

/// A client context with the token and the call's deadline.
void prepare_call(grpc::ClientContext& ctx, const service_link& link, double timeout_s);

/// One call: `once` makes an attempt and sets the status it got (an answer
/// it refuses comes back as an error with an OK status: not retried).
/// Attempts that fail as unavailable, timed out, overloaded or aborted are
/// made again after backoff_s · 2^(k-1), up to retries more; the error
/// names `what` and the attempts.
template <class T>
expected<T> call_with_retries(const actors::rl::remote_service_config& c, const std::string& what,
                              const std::function<expected<T>(grpc::Status&)>& once);

/// Calls 0 .. calls-1 of `fn`, up to max_in_flight at once (threads doing
/// blocking calls); the first error stops the rest from starting and is
/// answered.
expected<void> in_flight(size_t calls, int64_t max_in_flight,
                         const std::function<expected<void>(size_t)>& fn);

namespace detail {
bool retryable(grpc::StatusCode c);
void back_off(const actors::rl::remote_service_config& c, int64_t attempt);
caf::error failed_call(const std::string& what, const grpc::Status& status, int64_t tries);
} // namespace detail

template <class T>
expected<T> call_with_retries(const actors::rl::remote_service_config& c, const std::string& what,
                              const std::function<expected<T>(grpc::Status&)>& once) {
  grpc::Status status;
  int64_t attempts = 0;
  for (; attempts <= c.retries; ++attempts) {
    if (attempts > 0)
      detail::back_off(c, attempts);
    auto r = once(status);
    if (r)
      return r;
    if (status.ok()) // answered, but wrongly: no retry
      return with_prefix(r.error(), what);
    if (!detail::retryable(status.error_code()))
      break;
  }
  return detail::failed_call(what, status, std::min(attempts + 1, c.retries + 1));
}

} // namespace troupe::cluster
