#pragma once
// A CAF-inspectable value as bytes and back (CAF's binary form): what
// checkpoint files and opaque snapshots carry.

#include "runtime/error.hpp"

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace troupe::runtime {

/// `x` in CAF's binary form; an internal error naming `what` if it fails.
template <class T>
expected<std::string> to_bytes(T& x, std::string_view what) {
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  if (auto err = sink(x))
    return make_error(errc::internal, std::string{what} + ": serialising");
  return std::string(buf.begin(), buf.end());
}

/// Reads `x` back from `bytes`; a corrupted error naming `what` if they are
/// malformed.
template <class T>
expected<void> from_bytes(const std::string& bytes, T& x, std::string_view what) {
  caf::binary_deserializer source{nullptr, bytes.data(), bytes.size()};
  if (auto err = source(x))
    return make_error(errc::corrupted, std::string{what} + ": malformed");
  return caf::unit;
}

} // namespace troupe::runtime
