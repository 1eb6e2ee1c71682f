#include "runtime/utf8.hpp"

namespace troupe::runtime {

size_t invalid_utf8_at(std::string_view text) noexcept {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  for (size_t i = 0; i < text.size();) {
    unsigned char c = byte(i);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n = 0;
    char32_t cp = 0, min = 0;
    if (c >= 0xC2 && c <= 0xDF)
      n = 1, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
      n = 2, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
      n = 3, cp = c & 0x07, min = 0x10000;
    else
      return i; // a continuation byte, an overlong lead (C0, C1) or F5..FF
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= text.size() || (byte(i + k) & 0xC0) != 0x80)
        return i;
      cp = (cp << 6) | (byte(i + k) & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += n + 1;
  }
  return std::string_view::npos;
}

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    auto at = invalid_utf8_at(text);
    if (at == std::string_view::npos) {
      out.append(text);
      break;
    }
    out.append(text.substr(0, at));
    out.append("\xEF\xBF\xBD"); // U+FFFD
    text.remove_prefix(at + 1);
  }
  return out;
}

} // namespace troupe::runtime
