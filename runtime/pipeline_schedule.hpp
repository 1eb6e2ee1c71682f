#pragma once
// NOTE [1F1B]: the pipeline schedule as a pure function. P stages, M
// micro-batches; stage s (0 = first) runs P − s − 1 warm-up forwards, then
// alternates one forward and one backward until its forwards are done,
// then the remaining backwards (cool-down). A stage holds the activations
// of at most P − s micro-batches at once (P on the first), not M as a
// fill-and-drain (GPipe) schedule does, and with equal stage times the
// idle share of the pipeline, its bubble, is (P − 1) / (M + P − 1) either
// way. A forward of micro-batch m on stage s waits for its forward on
// s − 1; its backward waits for the backward on s + 1. The actors run the
// lists this returns in order; the planner prints their grid; the bench
// feeds them measured stage times.

#include "runtime/error.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::runtime {

/// One step of a stage: the forward or the backward of one micro-batch.
struct pipe_action {
  enum kind : uint8_t { forward, backward } op = forward;
  int micro_batch = 0;
  bool operator==(const pipe_action& o) const { return op == o.op && micro_batch == o.micro_batch; }
  bool operator!=(const pipe_action& o) const { return !(*this == o); }
};

/// "F3" / "B0".
std::string to_string(const pipe_action& a);

/// The ordered actions of every stage ([stage][step]).
using pipe_schedule = std::vector<std::vector<pipe_action>>;

/// The 1F1B schedule (NOTE [1F1B]); stages >= 1 and micro_batches >= 1,
/// else invalid_argument.
expected<pipe_schedule> one_f_one_b(int stages, int micro_batches);

/// The forward-only order (log-prob and value requests): every stage runs
/// the micro-batches' forwards in order.
expected<pipe_schedule> forward_only(int stages, int micro_batches);

/// The most micro-batches whose forward a stage has run and whose backward
/// it has not yet, at any point of its list.
int peak_in_flight(const std::vector<pipe_action>& stage);

/// (P − 1) / (M + P − 1).
double ideal_bubble(int stages, int micro_batches);

/// When each action runs, given each stage's forward and backward time.
struct pipe_timeline {
  /// [stage][step]: start and end of the schedule's action.
  std::vector<std::vector<double>> start, end;
  double makespan = 0;
  /// 1 − (busy time of all stages) / (stages × makespan).
  double bubble = 0;
};

/// Runs `schedule` in time: each stage takes its actions in order, an
/// action starting when the stage is free and its input has arrived
/// (NOTE [1F1B]); `forward_seconds[s]` and `backward_seconds[s]` are stage
/// s's times per micro-batch, `transfer_seconds` the time an activation or
/// its gradient takes between stages. A schedule that cannot run (a
/// dependency never met) is invalid_argument.
expected<pipe_timeline> simulate(const pipe_schedule& schedule,
                                 const std::vector<double>& forward_seconds,
                                 const std::vector<double>& backward_seconds,
                                 double transfer_seconds = 0);

/// The grid of `schedule` with unit forward and backward times: a row per
/// stage, a column per time slot ("F0", "B3", or "." idle), then the
/// bubble and the peak in-flight micro-batches.
std::string render_grid(const pipe_schedule& schedule);

} // namespace troupe::runtime
