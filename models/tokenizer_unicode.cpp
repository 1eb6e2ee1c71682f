#include "models/tokenizer_unicode.hpp"

#include <algorithm>
#include <unordered_map>

namespace troupe::models::unicode {

namespace {

// Hangul syllable algorithm constants (Unicode chapter 3.12).
constexpr char32_t s_base = 0xAC00, l_base = 0x1100, v_base = 0x1161, t_base = 0x11A7;
constexpr char32_t l_count = 19, v_count = 21, t_count = 28;
constexpr char32_t n_count = v_count * t_count, s_count = l_count * n_count;

// Invalid input bytes travel through NFC as these non-characters.
constexpr char32_t invalid_marker = 0x110000;

bool in_ranges(const detail::code_range* r, size_t n, char32_t cp) {
  auto* end = r + n;
  auto* it = std::upper_bound(r, end, cp,
                              [](char32_t x, const detail::code_range& e) { return x < e.first; });
  return it != r && cp <= (it - 1)->last;
}

const detail::decomposition* find_decomposition(char32_t cp) {
  auto* begin = detail::decompositions;
  auto* end = begin + detail::decomposition_count;
  auto* it = std::lower_bound(begin, end, cp,
                              [](const detail::decomposition& d, char32_t x) { return d.cp < x; });
  return it != end && it->cp == cp ? it : nullptr;
}

const std::unordered_map<uint64_t, char32_t>& composition_table() {
  static const auto table = [] {
    std::unordered_map<uint64_t, char32_t> t;
    for (size_t i = 0; i < detail::decomposition_count; ++i) {
      const auto& d = detail::decompositions[i];
      if (d.composes)
        t.emplace((uint64_t{d.first} << 32) | d.second, d.cp);
    }
    return t;
  }();
  return table;
}

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= s_base && cp < s_base + s_count) {
    auto s = cp - s_base;
    out.push_back(l_base + s / n_count);
    out.push_back(v_base + (s % n_count) / t_count);
    if (s % t_count != 0)
      out.push_back(t_base + s % t_count);
    return;
  }
  if (const auto* d = find_decomposition(cp)) {
    decompose(d->first, out);
    if (d->second != 0)
      decompose(d->second, out);
    return;
  }
  out.push_back(cp);
}

char32_t compose(char32_t a, char32_t b) {
  if (a >= l_base && a < l_base + l_count && b >= v_base && b < v_base + v_count)
    return s_base + ((a - l_base) * v_count + (b - v_base)) * t_count;
  if (a >= s_base && a < s_base + s_count && (a - s_base) % t_count == 0 && b > t_base &&
      b < t_base + t_count)
    return a + (b - t_base);
  const auto& t = composition_table();
  auto it = t.find((uint64_t{a} << 32) | b);
  return it == t.end() ? 0 : it->second;
}

uint8_t ccc_of(char32_t cp) {
  return cp >= invalid_marker ? 0 : combining_class(cp);
}

} // namespace

std::vector<utf8_unit> decode_utf8(std::string_view text) {
  std::vector<utf8_unit> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned char b0 = s[i];
    auto offset = static_cast<uint32_t>(i);
    if (b0 < 0x80) {
      out.push_back({b0, offset, 1, true});
      ++i;
      continue;
    }
    size_t need = 0;
    char32_t cp = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      need = 1;
      cp = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      need = 2;
      cp = b0 & 0x0F;
      if (b0 == 0xE0)
        lo = 0xA0;
      if (b0 == 0xED)
        hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      need = 3;
      cp = b0 & 0x07;
      if (b0 == 0xF0)
        lo = 0x90;
      if (b0 == 0xF4)
        hi = 0x8F;
    }
    bool ok = need > 0 && i + need < n;
    if (ok) {
      for (size_t k = 1; k <= need; ++k) {
        unsigned char b = s[i + k];
        unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) {
          ok = false;
          break;
        }
        cp = (cp << 6) | (b & 0x3F);
      }
    }
    if (!ok) {
      out.push_back({b0, offset, 1, false});
      ++i;
      continue;
    }
    out.push_back({cp, offset, static_cast<uint32_t>(need + 1), true});
    i += need + 1;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string to_valid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  std::string out;
  out.reserve(n);
  size_t i = 0;
  while (i < n) {
    unsigned char b0 = s[i];
    if (b0 < 0x80) {
      out += static_cast<char>(b0);
      ++i;
      continue;
    }
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      need = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      need = 2;
      lo = b0 == 0xE0 ? 0xA0 : 0x80;
      hi = b0 == 0xED ? 0x9F : 0xBF;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      need = 3;
      lo = b0 == 0xF0 ? 0x90 : 0x80;
      hi = b0 == 0xF4 ? 0x8F : 0xBF;
    }
    // Length of the longest valid prefix (the "maximal subpart").
    size_t k = 1;
    if (need > 0) {
      while (k <= need && i + k < n) {
        unsigned char b = s[i + k];
        unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h)
          break;
        ++k;
      }
    }
    if (need > 0 && k == need + 1) {
      out.append(text.substr(i, k));
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += k;
  }
  return out;
}

bool is_letter(char32_t cp) {
  return in_ranges(detail::letter_ranges, detail::letter_range_count, cp);
}

bool is_number(char32_t cp) {
  return in_ranges(detail::number_ranges, detail::number_range_count, cp);
}

bool is_whitespace(char32_t cp) {
  switch (cp) {
  case 0x09:
  case 0x0A:
  case 0x0B:
  case 0x0C:
  case 0x0D:
  case 0x20:
  case 0x85:
  case 0xA0:
  case 0x1680:
  case 0x2028:
  case 0x2029:
  case 0x202F:
  case 0x205F:
  case 0x3000:
    return true;
  default:
    return cp >= 0x2000 && cp <= 0x200A;
  }
}

uint8_t combining_class(char32_t cp) {
  auto* begin = detail::ccc_ranges;
  auto* end = begin + detail::ccc_range_count;
  auto* it = std::upper_bound(begin, end, cp,
                              [](char32_t x, const detail::class_range& e) { return x < e.first; });
  if (it == begin || cp > (it - 1)->last)
    return 0;
  return (it - 1)->ccc;
}

std::string nfc(std::string_view text) {
  // Fast path: text made only of code points below U+0300 is already NFC.
  bool simple = true;
  for (unsigned char ch : text) {
    if (ch >= 0xCC) { // lead bytes of U+0300 and above
      simple = false;
      break;
    }
  }
  if (simple)
    return std::string{text};

  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (const auto& u : decode_utf8(text)) {
    if (!u.valid)
      cps.push_back(invalid_marker + u.cp);
    else
      decompose(u.cp, cps);
  }
  // Canonical ordering: stable sort of every run of non-starters by class.
  for (size_t i = 0; i < cps.size();) {
    if (ccc_of(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc_of(cps[j]) != 0)
      ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j,
                     [](char32_t a, char32_t b) { return ccc_of(a) < ccc_of(b); });
    i = j;
  }
  // Canonical composition.
  if (!cps.empty()) {
    size_t starter = 0;
    int last_class = ccc_of(cps[0]) == 0 ? 0 : 256;
    size_t kept = 1;
    for (size_t i = 1; i < cps.size(); ++i) {
      char32_t ch = cps[i];
      int cls = ccc_of(ch);
      char32_t composite =
          ch >= invalid_marker || cps[starter] >= invalid_marker ? 0 : compose(cps[starter], ch);
      if (composite != 0 && (last_class < cls || last_class == 0)) {
        cps[starter] = composite;
        continue;
      }
      if (cls == 0)
        starter = kept;
      last_class = cls;
      cps[kept++] = ch;
    }
    cps.resize(kept);
  }
  std::string out;
  out.reserve(text.size());
  for (auto cp : cps) {
    if (cp >= invalid_marker)
      out += static_cast<char>(cp - invalid_marker);
    else
      append_utf8(out, cp);
  }
  return out;
}

} // namespace troupe::models::unicode
