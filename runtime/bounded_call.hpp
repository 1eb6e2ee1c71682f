#pragma once
// A call that may hang (a peer's code, a remote service), waited for at most
// a bound.

#include "runtime/error.hpp"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace troupe::runtime {

/// `fn` on a thread of its own, waited for at most `timeout_s`: a call that
/// hangs is abandoned (its thread keeps what it captured alive) and answered
/// with a timeout; a call that throws is answered with what it threw.
template <class T>
expected<T> bounded_call(double timeout_s, std::function<expected<T>()> fn) {
  struct slot {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<expected<T>> value;
  };
  auto s = std::make_shared<slot>();
  std::thread([s, fn = std::move(fn)] {
    expected<T> r = make_error(errc::internal, "no answer");
    try {
      r = fn();
    } catch (const std::exception& e) {
      r = make_error(errc::internal, std::string{"threw: "} + e.what());
    }
    std::lock_guard lock{s->mu};
    s->value.emplace(std::move(r));
    s->cv.notify_all();
  }).detach();
  std::unique_lock lock{s->mu};
  if (!s->cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                      [&] { return s->value.has_value(); }))
    return make_error(errc::timeout, "no answer within " + std::to_string(timeout_s) + " s");
  return std::move(*s->value);
}

} // namespace troupe::runtime
