#pragma once
// A value through CAF's binary serializers, as it crosses a process
// boundary (a message between actors of two processes).

#include <caf/actor_system.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <gtest/gtest.h>

#include <vector>

namespace troupe::test {

/// `x` serialized and read back; a failure on either side fails the test.
template <class T>
T round_trip(caf::actor_system& sys, T x) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  EXPECT_FALSE(sink(x)) << "serializing";
  T back;
  caf::binary_deserializer source{sys, buf};
  EXPECT_FALSE(source(back)) << "deserializing";
  return back;
}

} // namespace troupe::test
