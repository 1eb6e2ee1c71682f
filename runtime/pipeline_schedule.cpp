#include "runtime/pipeline_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

namespace troupe::runtime {

std::string to_string(const pipe_action& a) {
  return (a.op == pipe_action::forward ? "F" : "B") + std::to_string(a.micro_batch);
}

namespace {

expected<void> check_sizes(int stages, int micro_batches) {
  if (stages < 1 || micro_batches < 1)
    return make_error(errc::invalid_argument, "pipeline schedule: stages (" +
                                                  std::to_string(stages) + ") and micro-batches (" +
                                                  std::to_string(micro_batches) + ") must be >= 1");
  return {};
}

} // namespace

expected<pipe_schedule> one_f_one_b(int stages, int micro_batches) {
  if (auto ok = check_sizes(stages, micro_batches); !ok)
    return ok.error();
  pipe_schedule out(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    auto& list = out[static_cast<size_t>(s)];
    const int warm_up = std::min(stages - s - 1, micro_batches);
    int forwards = 0, backwards = 0;
    for (; forwards < warm_up; ++forwards)
      list.push_back({pipe_action::forward, forwards});
    for (; forwards < micro_batches; ++forwards, ++backwards) {
      list.push_back({pipe_action::forward, forwards});
      list.push_back({pipe_action::backward, backwards});
    }
    for (; backwards < micro_batches; ++backwards)
      list.push_back({pipe_action::backward, backwards});
  }
  return out;
}

expected<pipe_schedule> forward_only(int stages, int micro_batches) {
  if (auto ok = check_sizes(stages, micro_batches); !ok)
    return ok.error();
  pipe_schedule out(static_cast<size_t>(stages));
  for (auto& list : out)
    for (int m = 0; m < micro_batches; ++m)
      list.push_back({pipe_action::forward, m});
  return out;
}

int peak_in_flight(const std::vector<pipe_action>& stage) {
  int now = 0, peak = 0;
  for (const auto& a : stage) {
    now += a.op == pipe_action::forward ? 1 : -1;
    peak = std::max(peak, now);
  }
  return peak;
}

double ideal_bubble(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

namespace {

// Where each (stage, op, micro-batch) sits in its stage's list; an action
// listed twice, or a backward before its forward, is an error.
expected<std::vector<std::map<std::pair<int, int>, size_t>>>
index_actions(const pipe_schedule& schedule) {
  std::vector<std::map<std::pair<int, int>, size_t>> at(schedule.size());
  for (size_t s = 0; s < schedule.size(); ++s)
    for (size_t i = 0; i < schedule[s].size(); ++i) {
      const auto& a = schedule[s][i];
      auto where = "pipeline schedule: stage " + std::to_string(s) + " step " + std::to_string(i) +
                   " (" + to_string(a) + ")";
      if (!at[s].emplace(std::pair{static_cast<int>(a.op), a.micro_batch}, i).second)
        return make_error(errc::invalid_argument, where + " is listed twice");
      if (a.op == pipe_action::backward && !at[s].count({pipe_action::forward, a.micro_batch}))
        return make_error(errc::invalid_argument, where + " comes before its forward");
    }
  return at;
}

} // namespace

expected<pipe_timeline> simulate(const pipe_schedule& schedule,
                                 const std::vector<double>& forward_seconds,
                                 const std::vector<double>& backward_seconds,
                                 double transfer_seconds) {
  const size_t P = schedule.size();
  if (forward_seconds.size() != P || backward_seconds.size() != P)
    return make_error(errc::invalid_argument,
                      "pipeline simulate: " + std::to_string(P) + " stages but " +
                          std::to_string(forward_seconds.size()) + " forward and " +
                          std::to_string(backward_seconds.size()) + " backward times");
  auto at = index_actions(schedule);
  if (!at)
    return at.error();
  constexpr double unset = -1;
  pipe_timeline t;
  for (const auto& list : schedule) {
    t.start.emplace_back(list.size(), unset);
    t.end.emplace_back(list.size(), unset);
  }
  // When stage s's input for action a is ready (unset: not yet known;
  // infinity: it never comes).
  auto ready = [&](size_t s, const pipe_action& a) -> double {
    const bool fwd = a.op == pipe_action::forward;
    if ((fwd && s == 0) || (!fwd && s + 1 == P)) // the first forward, the last backward
      return fwd ? 0.0 : t.end[s][(*at)[s].at({pipe_action::forward, a.micro_batch})];
    const size_t from = fwd ? s - 1 : s + 1;
    auto it = (*at)[from].find({static_cast<int>(a.op), a.micro_batch});
    if (it == (*at)[from].end())
      return std::numeric_limits<double>::infinity();
    const double done = t.end[from][it->second];
    return done == unset ? unset : done + transfer_seconds;
  };
  std::vector<size_t> next(P, 0);
  std::vector<double> free_at(P, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t s = 0; s < P; ++s)
      while (next[s] < schedule[s].size()) {
        const auto& a = schedule[s][next[s]];
        const double in = ready(s, a);
        if (in == unset || std::isinf(in))
          break;
        const double cost = a.op == pipe_action::forward ? forward_seconds[s] : backward_seconds[s];
        t.start[s][next[s]] = std::max(in, free_at[s]);
        free_at[s] = t.end[s][next[s]] = t.start[s][next[s]] + cost;
        ++next[s];
        progress = true;
      }
  }
  double busy = 0;
  for (size_t s = 0; s < P; ++s) {
    if (next[s] < schedule[s].size())
      return make_error(errc::invalid_argument, "pipeline simulate: stage " + std::to_string(s) +
                                                    " waits forever at " +
                                                    to_string(schedule[s][next[s]]));
    for (size_t i = 0; i < schedule[s].size(); ++i)
      busy += t.end[s][i] - t.start[s][i];
    t.makespan = std::max(t.makespan, free_at[s]);
  }
  t.bubble = t.makespan > 0 ? 1.0 - busy / (static_cast<double>(P) * t.makespan) : 0.0;
  return t;
}

std::string render_grid(const pipe_schedule& schedule) {
  const std::vector<double> unit(schedule.size(), 1.0);
  auto t = simulate(schedule, unit, unit);
  if (!t)
    return describe(t.error()) + "\n";
  const auto slots = static_cast<size_t>(std::lround(t->makespan));
  size_t width = 2;
  for (const auto& list : schedule)
    for (const auto& a : list)
      width = std::max(width, to_string(a).size());
  std::string out;
  int peak = 0;
  for (size_t s = 0; s < schedule.size(); ++s) {
    std::vector<std::string> row(slots, ".");
    for (size_t i = 0; i < schedule[s].size(); ++i)
      row[static_cast<size_t>(std::lround(t->start[s][i]))] = to_string(schedule[s][i]);
    char head[32];
    std::snprintf(head, sizeof head, "stage %zu |", s);
    std::string line = head;
    for (const auto& cell : row)
      line += " " + cell + std::string(width - cell.size(), ' ');
    out += line.substr(0, line.find_last_not_of(' ') + 1) + "\n";
    peak = std::max(peak, peak_in_flight(schedule[s]));
  }
  char tail[128];
  std::snprintf(tail, sizeof tail, "bubble %.1f%% of %zu slots, peak %d micro-batch%s in flight\n",
                100 * t->bubble, slots, peak, peak == 1 ? "" : "es");
  return out + tail;
}

} // namespace troupe::runtime
