#pragma once
// Finds floats written through CAF 0.17's own packing, which hangs on inf
// (NOTE [wire floats] in runtime/wire_float.hpp): troupe's message types
// write none.

#include <caf/actor_system.hpp>
#include <caf/error.hpp>
#include <caf/serializer.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace troupe::test {

// A serializer that writes nothing and notes each float, double or long
// double handed to CAF's own packing.
class bare_float_counter final : public caf::serializer {
public:
  explicit bare_float_counter(caf::actor_system& sys) : caf::serializer(sys) {}
  int floats = 0;

  caf::error begin_object(uint16_t&, std::string&) override { return {}; }
  caf::error end_object() override { return {}; }
  caf::error begin_sequence(size_t&) override { return {}; }
  caf::error end_sequence() override { return {}; }
  caf::error apply_raw(size_t, void*) override { return {}; }

protected:
  caf::error apply_impl(int8_t&) override { return {}; }
  caf::error apply_impl(uint8_t&) override { return {}; }
  caf::error apply_impl(int16_t&) override { return {}; }
  caf::error apply_impl(uint16_t&) override { return {}; }
  caf::error apply_impl(int32_t&) override { return {}; }
  caf::error apply_impl(uint32_t&) override { return {}; }
  caf::error apply_impl(int64_t&) override { return {}; }
  caf::error apply_impl(uint64_t&) override { return {}; }
  caf::error apply_impl(float&) override { return ++floats, caf::error{}; }
  caf::error apply_impl(double&) override { return ++floats, caf::error{}; }
  caf::error apply_impl(long double&) override { return ++floats, caf::error{}; }
  caf::error apply_impl(std::string&) override { return {}; }
  caf::error apply_impl(std::u16string&) override { return {}; }
  caf::error apply_impl(std::u32string&) override { return {}; }
};

/// How many floats `x` hands to CAF's packing when serialized.
template <class T>
int bare_floats_of(caf::actor_system& sys, T x) {
  bare_float_counter count{sys};
  if (auto err = count(x))
    return -1;
  return count.floats;
}

} // namespace troupe::test
