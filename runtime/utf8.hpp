#pragma once
// UTF-8 validation for text that enters from files and the network.

#include <cstddef>
#include <string>
#include <string_view>

namespace troupe::runtime {

/// The byte offset of the first invalid UTF-8 sequence in `text` (a bad
/// lead or continuation byte, a truncated, overlong or surrogate sequence,
/// or a code point above U+10FFFF); std::string_view::npos when it is valid.
size_t invalid_utf8_at(std::string_view text) noexcept;

/// `text` with each byte that starts an invalid sequence replaced by U+FFFD
/// (what a model's decoded bytes become before they are sent as text).
std::string valid_utf8(std::string_view text);

} // namespace troupe::runtime
