// Floats in messages that cross processes (NOTE [wire floats] in
// runtime/wire_float.hpp): inf, NaN and subnormals arrive as themselves, and
// finite values are written as CAF wrote them before.
#include "actors/actor_system.hpp"
#include "actors/inference/engine.hpp"
#include "actors/job/job_actor.hpp"
#include "actors/train/engine_actor.hpp"
#include "runtime/wire_float.hpp"
#include "tests/support/bare_floats.hpp"
#include "tests/support/caf_round_trip.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

using namespace troupe;
using namespace troupe::actors;

namespace {

constexpr double k_inf = std::numeric_limits<double>::infinity();
constexpr double k_nan = std::numeric_limits<double>::quiet_NaN();
constexpr double k_tiny = std::numeric_limits<double>::denorm_min();
constexpr float k_finf = std::numeric_limits<float>::infinity();
constexpr float k_fnan = std::numeric_limits<float>::quiet_NaN();

struct WireFloats : ::testing::Test {
  WireFloats() : sys{(actors::configure(cfg), cfg)} {}
  caf::actor_system_config cfg;
  caf::actor_system sys;

  template <class T>
  std::vector<char> bytes(T x) {
    std::vector<char> out;
    caf::binary_serializer sink{sys, out};
    EXPECT_FALSE(sink(x));
    return out;
  }

  // Through the message form a worker link writes and reads.
  template <class T>
  T through_message(const T& x) {
    auto m = caf::make_message(x);
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    EXPECT_FALSE(sink(m));
    caf::message back;
    caf::binary_deserializer source{sys, buf};
    EXPECT_FALSE(source(back));
    EXPECT_TRUE(back.match_element<T>(0));
    return back.get_as<T>(0);
  }
};

// Same bits, NaN included (== would not do).
template <class T>
bool same_bits(T a, T b) {
  return std::bit_cast<runtime::float_bits_t<T>>(a) == std::bit_cast<runtime::float_bits_t<T>>(b);
}

} // namespace

TEST_F(WireFloats, MetricMapsCarryInfNanAndSubnormals) {
  // A diverging loss: before, writing inf never returned.
  runtime::metric_map m{{"loss", k_inf},  {"kl", -k_inf},     {"grad_norm", k_nan},
                        {"tiny", k_tiny}, {"neg_zero", -0.0}, {"lr", 1e-6}};
  for (const auto& back : {test::round_trip(sys, m), through_message(m)}) {
    ASSERT_EQ(back.size(), m.size());
    for (const auto& [k, v] : m)
      EXPECT_TRUE(same_bits(back.at(k), v)) << k;
  }
}

TEST_F(WireFloats, FiniteValuesKeepCafsBytes) {
  // For finite normal values CAF's packing is the IEEE bit pattern: the
  // bytes of files and peers from before are read the same.
  std::map<std::string, double> plain{{"loss", 0.25}, {"kl", -3.5e-7}, {"big", 1e300}};
  EXPECT_EQ(bytes(runtime::metric_map{plain}), bytes(plain));
  std::vector<float> lp{-0.5f, -12.25f, -1e-30f, 3.0f};
  inference::sample_output s;
  s.logprobs = lp;
  std::vector<char> want;
  caf::binary_serializer sink{sys, want};
  ASSERT_FALSE(sink(s.tokens, lp, s.versions, s.finish_reason));
  EXPECT_EQ(bytes(s), want);
}

TEST_F(WireFloats, EveryFloatingFieldOfTheMessageTypesRoundTrips) {
  inference::request_output out;
  out.ttft_ms = k_inf;
  out.latency_ms = k_nan;
  inference::sample_output s;
  s.tokens = {1, 2, 3};
  s.logprobs = {-k_finf, k_fnan, std::numeric_limits<float>::denorm_min()};
  out.samples.push_back(s);
  auto back = through_message(out);
  EXPECT_TRUE(std::isinf(back.ttft_ms));
  EXPECT_TRUE(std::isnan(back.latency_ms));
  ASSERT_EQ(back.samples.size(), 1u);
  for (size_t i = 0; i < s.logprobs.size(); ++i)
    EXPECT_TRUE(same_bits(back.samples[0].logprobs[i], s.logprobs[i])) << i;

  inference::engine_metrics em;
  em.busy_seconds = k_inf;
  em.prefix_hit_rate = k_nan;
  em.kv_peak_utilization = 0.75;
  auto em_back = through_message(em);
  EXPECT_TRUE(std::isinf(em_back.busy_seconds));
  EXPECT_TRUE(std::isnan(em_back.prefix_hit_rate));
  EXPECT_EQ(em_back.kv_peak_utilization, 0.75);

  train::policy_update_options po;
  po.lr = k_inf;
  po.loss.kl_coef = k_nan;
  po.loss.options.dual_clip_c = 3.0;
  auto po_back = through_message(po);
  EXPECT_TRUE(std::isinf(po_back.lr));
  EXPECT_TRUE(std::isnan(po_back.loss.kl_coef));
  EXPECT_EQ(po_back.loss.options.dual_clip_c, 3.0);

  train::dpo_step_options dpo;
  dpo.loss.beta = -k_inf;
  EXPECT_TRUE(std::isinf(through_message(dpo).loss.beta));

  train::served_metrics sm;
  sm.value = {{"loss", k_nan}};
  sm.busy_s = k_inf;
  auto sm_back = through_message(sm);
  EXPECT_TRUE(std::isnan(sm_back.value.at("loss")));
  EXPECT_TRUE(std::isinf(sm_back.busy_s));

  job::job_status st;
  st.eta_s = k_nan; // before the stage's first step
  st.last_metrics = {{"reward", k_inf}};
  auto st_back = through_message(st);
  EXPECT_TRUE(std::isnan(st_back.eta_s));
  EXPECT_TRUE(std::isinf(st_back.last_metrics.at("reward")));
}

TEST_F(WireFloats, TextFormsShowTheValues) {
  runtime::metric_map m{{"loss", 0.5}};
  EXPECT_NE(caf::deep_to_string(m).find("0.5"), std::string::npos) << caf::deep_to_string(m);
  inference::request_output out;
  out.ttft_ms = 12.5;
  EXPECT_NE(caf::deep_to_string(out).find("12.5"), std::string::npos) << caf::deep_to_string(out);
}

// No message type hands a float to CAF's packing (the role_messages fuzz
// target checks the same of every registered type's seed).
TEST_F(WireFloats, NoMessageTypeWritesAFloatThroughCafsPacking) {
  // The counter sees them where they are.
  EXPECT_EQ(test::bare_floats_of(sys, std::map<std::string, double>{{"a", 1.0}, {"b", 2.0}}), 2);
  EXPECT_EQ(test::bare_floats_of(sys, runtime::metric_map{{"a", 1.0}, {"b", 2.0}}), 0);
  inference::request_output out;
  out.samples.resize(2);
  out.samples[0].tokens = {1, 2};
  out.samples[0].logprobs = {-0.5f, -1.5f};
  EXPECT_EQ(test::bare_floats_of(sys, out), 0);
  inference::generate_request req;
  req.sampling.seed = 7;
  EXPECT_EQ(test::bare_floats_of(sys, req), 0);
  EXPECT_EQ(test::bare_floats_of(sys, inference::engine_metrics{}), 0);
  train::policy_update_options po;
  po.loss.options.dual_clip_c = 3.0;
  EXPECT_EQ(test::bare_floats_of(sys, po), 0);
  EXPECT_EQ(test::bare_floats_of(sys, train::critic_update_options{}), 0);
  EXPECT_EQ(test::bare_floats_of(sys, train::dpo_step_options{}), 0);
  train::served_metrics sm;
  sm.value = {{"loss", 0.5}};
  EXPECT_EQ(test::bare_floats_of(sys, sm), 0);
  job::job_status st;
  st.last_metrics = {{"reward", 1.0}};
  EXPECT_EQ(test::bare_floats_of(sys, st), 0);
  EXPECT_EQ(test::bare_floats_of(sys, job::boundary_reply{}), 0);
}
