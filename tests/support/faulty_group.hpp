#pragma once
// A process group that misbehaves on purpose (test support only): it wraps
// one rank's real backend and, from a chosen operation on, makes that rank
// fail the way a lost or slow process does, while its peers keep their real
// gloo ranks. An "operation" is one call into the backend: a native
// collective, or one started send or receive (a ring collective is several).
//
//   never_arrive  the rank stops taking part: its calls fail at once and
//                 nothing reaches the wire, so its peers wait until their
//                 timeout (a process that hangs or never started).
//   late          the operation starts `late_ms` late, then runs (a slow
//                 rank: with late_ms past the timeout, the peers time out).
//   abort         the rank's gloo context is destroyed, closing its
//                 connections mid-collective (a process that dies); this
//                 and every later call fail with errc::cancelled.

#include "runtime/collectives.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace troupe::test {

struct fault_plan {
  enum class kind { never_arrive, late, abort };
  kind what = kind::never_arrive;
  /// The first operation (0-based) that the fault hits.
  int at_operation = 0;
  /// late: how long the operation waits before it starts.
  int late_ms = 0;
};

class faulty_backend final : public runtime::collective_backend {
public:
  faulty_backend(std::unique_ptr<runtime::collective_backend> inner, fault_plan plan)
      : inner_(std::move(inner)), plan_(plan), rank_(inner_->rank()), size_(inner_->size()) {}

  /// Operations this rank attempted so far (hit or not).
  int operations() const { return operations_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  expected<void> all_reduce(at::Tensor& t, runtime::reduce_op op) override {
    return pass("all_reduce", [&] { return inner_->all_reduce(t, op); });
  }
  expected<void> broadcast(at::Tensor& t, int root) override {
    return pass("broadcast", [&] { return inner_->broadcast(t, root); });
  }
  expected<void> reduce(at::Tensor& t, int root, runtime::reduce_op op) override {
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
  expected<std::unique_ptr<runtime::pending_transfer>> start_send(at::Tensor& t, int dst,
                                                                  int tag) override {
    return pass("send", [&] { return inner_->start_send(t, dst, tag); });
  }
  expected<std::unique_ptr<runtime::pending_transfer>> start_recv(at::Tensor& t, int src,
                                                                  int tag) override {
    return pass("recv", [&] { return inner_->start_recv(t, src, tag); });
  }
  expected<std::unique_ptr<runtime::collective_backend>>
  subgroup(const std::string& name, const std::vector<int>& ranks) override {
    return pass("subgroup", [&] { return inner_->subgroup(name, ranks); });
  }

private:
  template <class F>
  auto pass(const char* op, F&& call) -> decltype(call()) {
    int index = operations_++;
    std::string where = std::string{"injected fault at operation "} + std::to_string(index) + " (" +
                        op + ", rank " + std::to_string(rank_) + ")";
    if (!inner_)
      return make_error(errc::cancelled, where + ": the group was aborted");
    if (index >= plan_.at_operation) {
      switch (plan_.what) {
      case fault_plan::kind::never_arrive:
        return make_error(errc::unavailable, where + ": this rank never arrives");
      case fault_plan::kind::abort:
        inner_.reset(); // closes the rank's gloo pairs: peers see the connections drop
        return make_error(errc::cancelled, where + ": aborted");
      case fault_plan::kind::late:
        if (index == plan_.at_operation)
          std::this_thread::sleep_for(std::chrono::milliseconds(plan_.late_ms));
        break;
      }
    }
    return call();
  }

  std::unique_ptr<runtime::collective_backend> inner_;
  fault_plan plan_;
  int rank_;
  int size_;
  int operations_ = 0;
};

/// `group` with `plan` injected into its rank (the group is consumed).
inline runtime::process_group with_faults(runtime::process_group group, fault_plan plan) {
  return runtime::process_group{
      std::make_unique<faulty_backend>(std::move(group).release_backend(), plan)};
}

} // namespace troupe::test
