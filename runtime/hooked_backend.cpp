#include "runtime/hooked_backend.hpp"

namespace troupe::runtime {

namespace {

// NOTE [kill inside a collective]: the `nth` operation calls `die` before
// it starts; the rank's peers are in the same collective by then, waiting
// for its part. A hook that returns (it threw nothing and the process
// lives on) lets the operation run.
class dying_backend final : public hooked_backend {
public:
  dying_backend(std::unique_ptr<collective_backend> inner, int64_t nth, std::function<void()> die)
      : hooked_backend(std::move(inner)), nth_(nth), die_(std::move(die)) {}

private:
  expected<void> before(int index, const char*) override {
    if (index + 1 == nth_ && die_)
      std::exchange(die_, nullptr)();
    return {};
  }

  int64_t nth_;
  std::function<void()> die_;
};

} // namespace

process_group dying_at(process_group group, int64_t nth, std::function<void()> die) {
  return process_group{
      std::make_unique<dying_backend>(std::move(group).release_backend(), nth, std::move(die))};
}

} // namespace troupe::runtime
