#pragma once
// What the fuzz targets share (NOTE [fuzz targets] in replay_main.cpp): an
// input made of several files is sections cut at lines "%%", and a target
// that finds an invariant broken stops with a trap, which libFuzzer and
// the replay both report with the input.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::fuzz {

inline std::string_view text_of(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// `text` cut at each line "%%" (the line itself dropped); one section at least.
inline std::vector<std::string> sections_of(std::string_view text) {
  std::vector<std::string> out;
  constexpr std::string_view cut = "\n%%\n";
  while (true) {
    const auto at = text.find(cut);
    out.emplace_back(text.substr(0, at));
    if (at == std::string_view::npos)
      return out;
    text.remove_prefix(at + cut.size());
  }
}

/// Section `i`, or "" past the end.
inline const std::string& section(const std::vector<std::string>& s, size_t i) {
  static const std::string none;
  return i < s.size() ? s[i] : none;
}

/// Stops the run: an invariant of the target does not hold for this input.
[[noreturn]] inline void broken() {
  __builtin_trap();
}

/// The same, saying which invariant first (traps of one function may be
/// merged, so a stack trace alone does not tell).
[[noreturn]] inline void broken(const char* why) {
  std::fprintf(stderr, "fuzz target: broken: %s\n", why);
  __builtin_trap();
}

} // namespace troupe::fuzz
