#pragma once
// A collective backend that runs a hook before each call into another one
// (each native collective, each started send or receive, each subgroup;
// all-gather and reduce-scatter run as rings over its sends and receives):
// the fault injection of supervision (NOTE [kill inside a collective]) and
// of the tests (tests/support/faulty_group.hpp) are such hooks.

#include "runtime/collectives.hpp"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace troupe::runtime {

class hooked_backend : public collective_backend {
public:
  explicit hooked_backend(std::unique_ptr<collective_backend> inner)
      : inner_(std::move(inner)), rank_(inner_->rank()), size_(inner_->size()),
        identity_(inner_->identity()) {}

  /// Operations this rank attempted so far (let through or not).
  int operations() const { return operations_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  uint64_t identity() const override { return identity_; }
  expected<void> all_reduce(at::Tensor& t, reduce_op op) override {
    return pass("all_reduce", [&] { return inner_->all_reduce(t, op); });
  }
  expected<void> broadcast(at::Tensor& t, int root) override {
    return pass("broadcast", [&] { return inner_->broadcast(t, root); });
  }
  expected<void> reduce(at::Tensor& t, int root, reduce_op op) override {
    return pass("reduce", [&] { return inner_->reduce(t, root, op); });
  }
  expected<void> gather(at::Tensor& in, std::vector<at::Tensor>& out, int root) override {
    return pass("gather", [&] { return inner_->gather(in, out, root); });
  }
  expected<void> scatter(std::vector<at::Tensor>& in, at::Tensor& out, int root) override {
    return pass("scatter", [&] { return inner_->scatter(in, out, root); });
  }
  expected<void> all_to_all(at::Tensor& in, at::Tensor& out) override {
    return pass("all_to_all", [&] { return inner_->all_to_all(in, out); });
  }
  expected<void> barrier() override {
    return pass("barrier", [&] { return inner_->barrier(); });
  }
  expected<std::unique_ptr<pending_transfer>> start_send(at::Tensor& t, int dst, int tag) override {
    return pass("send", [&] { return inner_->start_send(t, dst, tag); });
  }
  expected<std::unique_ptr<pending_transfer>> start_recv(at::Tensor& t, int src, int tag) override {
    return pass("recv", [&] { return inner_->start_recv(t, src, tag); });
  }
  expected<std::unique_ptr<collective_backend>> subgroup(const std::string& name,
                                                         const std::vector<int>& ranks) override {
    return pass("subgroup", [&] { return inner_->subgroup(name, ranks); });
  }

protected:
  /// Runs before operation `index` (from 0), an `op` ("all_reduce", "send"
  /// ...): an error is the operation's answer, which then does not run.
  virtual expected<void> before(int index, const char* op) = 0;
  /// The wrapped backend; a hook may reset it (its connections close).
  std::unique_ptr<collective_backend> inner_;

private:
  template <class F>
  auto pass(const char* op, F&& call) -> decltype(call()) {
    const int index = operations_++;
    if (auto ok = before(index, op); !ok)
      return ok.error();
    if (!inner_)
      return make_error(errc::cancelled, std::string{op} + ": the group's backend was closed");
    return call();
  }

  int rank_;
  int size_;
  uint64_t identity_;
  int operations_ = 0;
};

/// NOTE [kill inside a collective]: `group` whose `nth` operation (from 1,
/// counted from now) calls `die` first — a hook that ends the process, or
/// throws; the group is consumed.
process_group dying_at(process_group group, int64_t nth, std::function<void()> die);

} // namespace troupe::runtime
