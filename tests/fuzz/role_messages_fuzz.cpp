// Fuzz target: what crosses processes between the driver, the workers and
// the role actors — every registered message type (actors/actor_system.cpp,
// cluster/workers.cpp), tensor batches in their wire form among them
// (runtime/tensor_batch.hpp) — as CAF's binary form of a message, which a
// worker link hands to the deserializer. The input is those bytes.
// Reading succeeds or fails; a message read re-serialises to bytes that
// read back to the same bytes again (a batch's tensors rebuilt and checked
// on the way). Troupe's own types carry floats as bit patterns (NOTE [wire
// floats] in runtime/wire_float.hpp): none of them writes a float through
// CAF's packing, so inf and NaN round-trip. A bare float element is CAF's
// own encoding, which cannot write inf back; no troupe actor sends or
// forwards one that is not finite, and the round trip skips it.
// LibTorch-linked: a replay executable of the normal build (scripts/fuzz.sh).
#include "actors/actor_system.hpp"
#include "cluster/workers.hpp"
#include "tests/fuzz/fuzz_input.hpp"
#include "tests/support/bare_floats.hpp"

#include <caf/all.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

using namespace troupe;

namespace {

// The process's system, never destroyed: CAF's teardown at exit races the
// libraries' own static state (the process ends with it anyway).
caf::actor_system& message_system() {
  static caf::actor_system* sys = [] {
    auto* cfg = new caf::actor_system_config;
    actors::configure(*cfg);
    cluster::configure_network(*cfg);
    cfg->set("scheduler.max-threads", size_t{1});
    return new caf::actor_system{*cfg};
  }();
  return *sys;
}

std::vector<char> bytes_of(caf::message& m) {
  std::vector<char> out;
  caf::binary_serializer sink{message_system(), out};
  if (auto err = sink(m))
    fuzz::broken();
  return out;
}

bool is_bare_float(const caf::message& m, size_t i) {
  return m.match_element<double>(i) || m.match_element<float>(i) || m.match_element<long double>(i);
}

// Each element that is not a bare float writes no float through CAF's
// packing (a floating field without runtime::wire, a std::map of doubles).
void expect_wire_floats(const caf::message& m) {
  for (size_t i = 0; i < m.size(); ++i) {
    if (is_bare_float(m, i))
      continue;
    test::bare_float_counter spot{message_system()};
    if (auto err = m.save(i, spot))
      fuzz::broken("an element that was read cannot be written");
    if (spot.floats > 0)
      fuzz::broken(
          "a troupe message type writes a float through CAF's packing (NOTE [wire floats])");
  }
}

// A bare float, double or long double element that is not finite.
bool has_bare_non_finite(const caf::message& m) {
  for (size_t i = 0; i < m.size(); ++i) {
    if (m.match_element<double>(i) && !std::isfinite(m.get_as<double>(i)))
      return true;
    if (m.match_element<float>(i) && !std::isfinite(m.get_as<float>(i)))
      return true;
    if (m.match_element<long double>(i) && !std::isfinite(m.get_as<long double>(i)))
      return true;
  }
  return false;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& sys = message_system();
  caf::message msg;
  caf::binary_deserializer source{sys, reinterpret_cast<const char*>(data), size};
  if (auto err = source(msg))
    return 0;
  expect_wire_floats(msg);
  if (has_bare_non_finite(msg))
    return 0;
  const auto once = bytes_of(msg);
  caf::message again;
  caf::binary_deserializer back{sys, once};
  if (auto err = back(again))
    fuzz::broken();
  if (bytes_of(again) != once)
    fuzz::broken();
  return 0;
}
