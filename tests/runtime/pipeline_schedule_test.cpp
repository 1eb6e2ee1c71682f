#include "runtime/pipeline_schedule.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace troupe::runtime {
namespace {

// "F0 F1 B0" → the actions.
std::vector<pipe_action> parse(const std::string& text) {
  std::vector<pipe_action> out;
  for (size_t i = 0; i < text.size();) {
    auto end = text.find(' ', i);
    if (end == std::string::npos)
      end = text.size();
    auto word = text.substr(i, end - i);
    out.push_back(
        {word[0] == 'F' ? pipe_action::forward : pipe_action::backward, std::stoi(word.substr(1))});
    i = end + 1;
  }
  return out;
}

std::string print(const std::vector<pipe_action>& stage) {
  std::string out;
  for (const auto& a : stage)
    out += (out.empty() ? "" : " ") + to_string(a);
  return out;
}

TEST(PipelineSchedule, TwoStagesFourMicroBatchesIsTheOneFOneBGrid) {
  auto s = one_f_one_b(2, 4);
  ASSERT_TRUE(s.engaged());
  ASSERT_EQ(s->size(), 2U);
  EXPECT_EQ(print((*s)[0]), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(print((*s)[1]), "F0 B0 F1 B1 F2 B2 F3 B3");
}

TEST(PipelineSchedule, FourStagesEightMicroBatchesWarmUpSteadyCoolDown) {
  auto s = one_f_one_b(4, 8);
  ASSERT_TRUE(s.engaged());
  ASSERT_EQ(s->size(), 4U);
  EXPECT_EQ((*s)[0], parse("F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"));
  EXPECT_EQ((*s)[1], parse("F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7"));
  EXPECT_EQ((*s)[2], parse("F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7"));
  EXPECT_EQ((*s)[3], parse("F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"));
}

TEST(PipelineSchedule, EachStageRunsEveryMicroBatchOnceAndHoldsAtMostPOfThem) {
  for (int P : {1, 2, 3, 4, 8})
    for (int M : {1, 2, 4, 5, 8, 16}) {
      auto s = one_f_one_b(P, M);
      ASSERT_TRUE(s.engaged());
      for (int stage = 0; stage < P; ++stage) {
        const auto& list = (*s)[static_cast<size_t>(stage)];
        ASSERT_EQ(list.size(), static_cast<size_t>(2 * M)) << P << " " << M;
        std::vector<int> forwards, backwards;
        for (const auto& a : list)
          (a.op == pipe_action::forward ? forwards : backwards).push_back(a.micro_batch);
        for (int m = 0; m < M; ++m) { // in order, each once
          EXPECT_EQ(forwards[static_cast<size_t>(m)], m);
          EXPECT_EQ(backwards[static_cast<size_t>(m)], m);
        }
        EXPECT_EQ(peak_in_flight(list), std::min(P - stage, M)) << P << " " << M << " " << stage;
        EXPECT_LE(peak_in_flight(list), P);
      }
    }
}

TEST(PipelineSchedule, EqualStageTimesGiveTheFormulaBubble) {
  for (auto [P, M] : std::vector<std::pair<int, int>>{{2, 4}, {4, 8}, {2, 8}, {4, 16}, {8, 8}}) {
    auto s = one_f_one_b(P, M);
    ASSERT_TRUE(s.engaged());
    std::vector<double> unit(static_cast<size_t>(P), 1.0);
    auto t = simulate(*s, unit, unit);
    ASSERT_TRUE(t.engaged()) << describe(t.error());
    EXPECT_DOUBLE_EQ(t->makespan, 2.0 * (M + P - 1)) << P << " " << M;
    EXPECT_NEAR(t->bubble, ideal_bubble(P, M), 1e-12) << P << " " << M;
  }
  EXPECT_NEAR(ideal_bubble(4, 4), 3.0 / 7.0, 1e-12);
  EXPECT_NEAR(ideal_bubble(4, 16), 3.0 / 19.0, 1e-12);
}

TEST(PipelineSchedule, SimulatedTimesFollowTheDependencies) {
  auto s = one_f_one_b(2, 2);
  ASSERT_TRUE(s.engaged());
  // Stage 0: F0 F1 B0 B1; stage 1: F0 B0 F1 B1. Forwards take 1 and 2,
  // backwards 3 and 4, a transfer 0.5.
  auto t = simulate(*s, {1, 2}, {3, 4}, 0.5);
  ASSERT_TRUE(t.engaged());
  EXPECT_DOUBLE_EQ(t->start[1][0], 1.5);  // F0 on stage 1: after F0 on stage 0 and its transfer
  EXPECT_DOUBLE_EQ(t->start[1][1], 3.5);  // B0 on stage 1: after its own F0
  EXPECT_DOUBLE_EQ(t->start[1][2], 7.5);  // F1: the stage was busy with B0
  EXPECT_DOUBLE_EQ(t->start[0][2], 8.0);  // B0 on stage 0: after B0 on stage 1 and its transfer
  EXPECT_DOUBLE_EQ(t->start[1][3], 9.5);  // B1 on stage 1: after its F1
  EXPECT_DOUBLE_EQ(t->start[0][3], 14.0); // B1 on stage 0: after B1 on stage 1 (9.5 + 4 + 0.5)
  EXPECT_DOUBLE_EQ(t->makespan, 17.0);
}

TEST(PipelineSchedule, ForwardOnlyRunsEachStageInMicroBatchOrder) {
  auto s = forward_only(3, 4);
  ASSERT_TRUE(s.engaged());
  for (const auto& list : *s)
    EXPECT_EQ(print(list), "F0 F1 F2 F3");
  auto t = simulate(*s, {1, 1, 1}, {0, 0, 0});
  ASSERT_TRUE(t.engaged());
  EXPECT_DOUBLE_EQ(t->makespan, 4 + 3 - 1);
}

TEST(PipelineSchedule, TheGridShowsEachSlot) {
  auto s = one_f_one_b(2, 4);
  ASSERT_TRUE(s.engaged());
  EXPECT_EQ(render_grid(*s), "stage 0 | F0 F1 .  B0 F2 B1 F3 B2 .  B3\n"
                             "stage 1 | .  F0 B0 F1 B1 F2 B2 F3 B3 .\n"
                             "bubble 20.0% of 10 slots, peak 2 micro-batches in flight\n");
}

TEST(PipelineSchedule, BadSchedulesAreRefusedWithTheStep) {
  EXPECT_FALSE(one_f_one_b(0, 4).engaged());
  EXPECT_FALSE(one_f_one_b(2, 0).engaged());
  auto describe_of = [](const pipe_schedule& s) {
    auto t = simulate(s, std::vector<double>(s.size(), 1), std::vector<double>(s.size(), 1));
    return t ? std::string{"ran"} : describe(t.error());
  };
  EXPECT_NE(describe_of({parse("F0 F0 B0")}).find("stage 0 step 1 (F0) is listed twice"),
            std::string::npos);
  EXPECT_NE(describe_of({parse("B0 F0")}).find("comes before its forward"), std::string::npos);
  // Stage 0 wants B0 before F1; stage 1 runs F1 before B0: neither moves.
  EXPECT_NE(describe_of({parse("F0 B0 F1 B1"), parse("F0 F1 B0 B1")}).find("waits forever"),
            std::string::npos);
  EXPECT_FALSE(simulate({parse("F0 B0")}, {1, 1}, {1}).engaged());
}

} // namespace
} // namespace troupe::runtime
