#include "cluster/service_client.hpp"

#include "cluster/api_client.hpp"
#include "cluster/grpc_status.hpp"
#include "runtime/file_io.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

namespace troupe::cluster {

expected<service_link> open_service(const actors::rl::remote_service_config& c,
                                    const std::string& key, const std::string& peer) {
  service_link link;
  link.address = c.address;
  if (!c.token_file.empty()) {
    auto t = runtime::read_file(c.token_file);
    if (!t)
      return with_prefix(t.error(), key + ".token_file");
    link.token = *t;
    while (!link.token.empty() &&
           (link.token.back() == '\n' || link.token.back() == '\r' || link.token.back() == ' '))
      link.token.pop_back();
  }
  client_options o;
  o.address = c.address;
  o.ca_file = c.ca_file;
  o.cert_file = c.cert_file;
  o.key_file = c.key_file;
  o.peer = peer;
  o.ca_hint = key + ".ca_file";
  auto channel = open_channel(o);
  if (!channel)
    return with_prefix(channel.error(), key);
  link.channel = std::move(*channel);
  return link;
}

void prepare_call(grpc::ClientContext& ctx, const service_link& link, double timeout_s) {
  if (!link.token.empty())
    ctx.AddMetadata("authorization", "Bearer " + link.token);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
}

expected<void> in_flight(size_t calls, int64_t max_in_flight,
                         const std::function<expected<void>(size_t)>& fn) {
  std::vector<expected<void>> results(calls, make_error(errc::internal, "not called"));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    for (size_t k = next++; k < calls && !failed; k = next++) {
      results[k] = fn(k);
      if (!results[k])
        failed = true;
    }
  };
  std::vector<std::thread> threads;
  auto n = std::min(calls, static_cast<size_t>(std::max<int64_t>(1, max_in_flight)));
  for (size_t t = 1; t < n; ++t)
    threads.emplace_back(worker);
  worker();
  for (auto& t : threads)
    t.join();
  for (auto& r : results)
    if (!r)
      return r.error();
  return {};
}

namespace detail {

bool retryable(grpc::StatusCode c) {
  return c == grpc::StatusCode::UNAVAILABLE || c == grpc::StatusCode::DEADLINE_EXCEEDED ||
         c == grpc::StatusCode::RESOURCE_EXHAUSTED || c == grpc::StatusCode::ABORTED;
}

void back_off(const actors::rl::remote_service_config& c, int64_t attempt) {
  std::this_thread::sleep_for(
      std::chrono::duration<double>(c.backoff_s * std::pow(2.0, static_cast<double>(attempt - 1))));
}

caf::error failed_call(const std::string& what, const grpc::Status& status, int64_t tries) {
  auto code = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? errc::timeout
              : status.error_code() == grpc::StatusCode::UNAVAILABLE     ? errc::unavailable
                                                                         : detail_of(status).code;
  return make_error(code, what + ": " + grpc_status_name(status.error_code()) + ": " +
                              status.error_message() + " after " + std::to_string(tries) +
                              (tries == 1 ? " attempt" : " attempts"));
}

} // namespace detail

} // namespace troupe::cluster
