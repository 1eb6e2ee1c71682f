#pragma once
// Floating-point values in CAF messages, written as their IEEE-754 bits.
//
// NOTE [wire floats]
// CAF 0.17 writes a float or a double through its own IEEE-754 packing
// (caf::detail::pack754), which never returns on ±inf (it halves the value
// until it drops below 2), writes NaN and subnormals as other numbers, and
// whose reader turns an all-ones exponent into inf. A diverging loss — inf in
// a metric map — sent to another process would hang the sending worker, and
// bytes from a peer that read back as inf would hang whoever writes them
// again (the role_messages fuzz target found it). So every floating field of
// a troupe message type crosses as its bit pattern, an unsigned integer of
// the same width: `wire(x)` in the type's inspect function. For finite
// normal values pack754 writes exactly that bit pattern, so the bytes are
// those CAF wrote before and state files written earlier read back the same.
// Metric maps are the type below rather than a std::map for the same reason.
// A bare double in a message still goes through CAF's packing: troupe's
// actors take one only as log_probs' temperature, and refuse it unless it is
// finite and positive (train_engine::log_probs).
#include <bit>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace troupe::runtime {

template <class T>
using float_bits_t = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;

/// A floating field as an inspect function hands it on: `wire(x.loss)`.
template <class T>
struct wire_float {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  T* x;
};

/// A vector of floating values, as one sequence of bit patterns.
template <class T>
struct wire_floats {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  std::vector<T>* xs;
};

inline wire_float<float> wire(float& x) {
  return {&x};
}
inline wire_float<double> wire(double& x) {
  return {&x};
}
inline wire_floats<float> wire(std::vector<float>& xs) {
  return {&xs};
}
inline wire_floats<double> wire(std::vector<double>& xs) {
  return {&xs};
}

namespace wire_detail {

// CAF's inspectors: the stringification inspector returns void and prints
// values; a serializer reads state; a deserializer writes it.
template <class Inspector>
constexpr bool prints = std::is_void_v<typename Inspector::result_type>;

} // namespace wire_detail

template <class Inspector, class T>
typename Inspector::result_type inspect(Inspector& f, wire_float<T>& w) {
  using bits_t = float_bits_t<T>;
  if constexpr (wire_detail::prints<Inspector>) {
    return f(*w.x);
  } else if constexpr (Inspector::reads_state) {
    auto bits = std::bit_cast<bits_t>(*w.x);
    return f(bits);
  } else {
    bits_t bits = 0;
    if (auto err = f(bits))
      return err;
    *w.x = std::bit_cast<T>(bits);
    return {};
  }
}

template <class Inspector, class T>
typename Inspector::result_type inspect(Inspector& f, wire_floats<T>& w) {
  using bits_t = float_bits_t<T>;
  if constexpr (wire_detail::prints<Inspector>) {
    return f(*w.xs);
  } else if constexpr (Inspector::reads_state) {
    std::vector<bits_t> bits(w.xs->size());
    for (size_t i = 0; i < bits.size(); ++i)
      bits[i] = std::bit_cast<bits_t>((*w.xs)[i]);
    return f(bits);
  } else {
    std::vector<bits_t> bits;
    if (auto err = f(bits))
      return err;
    w.xs->resize(bits.size());
    for (size_t i = 0; i < bits.size(); ++i)
      (*w.xs)[i] = std::bit_cast<T>(bits[i]);
    return {};
  }
}

/// Named scalar metrics (a step's loss, KL, throughput): a std::map whose
/// values cross processes as bit patterns (NOTE [wire floats]), so inf and
/// NaN arrive as themselves.
struct metric_map : std::map<std::string, double> {
  using base = std::map<std::string, double>;
  using base::base;
  using base::operator=;
  metric_map() = default;
  metric_map(base m) : base(std::move(m)) {}
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, metric_map& m) {
  using base = metric_map::base;
  if constexpr (wire_detail::prints<Inspector>) {
    return f(static_cast<base&>(m));
  } else if constexpr (Inspector::reads_state) {
    std::map<std::string, uint64_t> bits;
    for (const auto& [k, v] : m)
      bits.emplace_hint(bits.end(), k, std::bit_cast<uint64_t>(v));
    return f(bits);
  } else {
    std::map<std::string, uint64_t> bits;
    if (auto err = f(bits))
      return err;
    m.clear();
    for (const auto& [k, v] : bits)
      m.emplace_hint(m.end(), k, std::bit_cast<double>(v));
    return {};
  }
}

} // namespace troupe::runtime
