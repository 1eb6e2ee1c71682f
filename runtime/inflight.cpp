#include "runtime/inflight.hpp"

#include "runtime/hash.hpp"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

namespace troupe::runtime {

namespace {

using clock_type = std::chrono::steady_clock;

struct open_call {
  uint64_t group;
  int32_t rank, size;
  collective_op op;
  clock_type::time_point since;
};

// NOTE [calls in flight]: slot → call; a slot number is never reused.
struct call_table {
  std::mutex mu;
  uint64_t next = 1;
  std::map<uint64_t, open_call> open;
};

call_table& table() {
  static auto* t = new call_table; // never destroyed: heartbeat threads outlive statics
  return *t;
}

// This thread's registered calls, innermost last.
thread_local std::vector<uint64_t> this_threads_calls;

} // namespace

scoped_call::scoped_call(uint64_t group, int rank, int size, collective_op op) {
  if (group == 0)
    return;
  auto& t = table();
  const auto now = clock_type::now();
  std::lock_guard lock{t.mu};
  slot_ = t.next++;
  t.open.emplace(slot_, open_call{group, rank, size, op, now});
  this_threads_calls.push_back(slot_);
}

scoped_call::~scoped_call() {
  if (slot_ == 0)
    return;
  auto& t = table();
  {
    std::lock_guard lock{t.mu};
    t.open.erase(slot_);
  }
  auto& mine = this_threads_calls;
  if (auto it = std::find(mine.rbegin(), mine.rend(), slot_); it != mine.rend())
    mine.erase(std::next(it).base());
}

void note_progress() {
  if (this_threads_calls.empty())
    return;
  auto& t = table();
  const auto now = clock_type::now();
  std::lock_guard lock{t.mu};
  if (auto it = t.open.find(this_threads_calls.back()); it != t.open.end())
    it->second.since = now;
}

std::vector<call_in_flight> calls_in_flight(size_t max) {
  auto& t = table();
  const auto now = clock_type::now();
  std::vector<call_in_flight> out;
  {
    std::lock_guard lock{t.mu};
    for (const auto& [slot, c] : t.open)
      out.push_back({c.group, c.rank, c.size, c.op,
                     std::chrono::duration_cast<std::chrono::milliseconds>(now - c.since).count()});
  }
  // The longest-running first (ties: the earlier registered).
  std::stable_sort(out.begin(), out.end(), [](const call_in_flight& a, const call_in_flight& b) {
    return a.age_ms > b.age_ms;
  });
  if (out.size() > max)
    out.resize(max);
  return out;
}

uint64_t group_identity(uint64_t parent, std::string_view name) {
  const auto h = hash64(name.data(), name.size(), parent ^ 0x67726f7570ull /* "group" */);
  return h == 0 ? 1 : h;
}

} // namespace troupe::runtime
