#include "models/tokenizer_unicode.hpp"

#include <algorithm>
#include <array>
#include <unordered_map>

namespace troupe::models::unicode {

namespace {

// Hangul syllable algorithm constants (Unicode chapter 3.12).
constexpr char32_t s_base = 0xAC00, l_base = 0x1100, v_base = 0x1161, t_base = 0x11A7;
constexpr char32_t l_count = 19, v_count = 21, t_count = 28;
constexpr char32_t n_count = v_count * t_count, s_count = l_count * n_count;

// Invalid input bytes travel through NFC as these non-characters.
constexpr char32_t invalid_marker = 0x110000;

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
      if (d.composes) {
        const auto* parts = detail::decomposition_pool + d.offset;
        t.emplace((uint64_t{parts[0]} << 32) | parts[1], d.cp);
      }
    }
    return t;
  }();
  return table;
}

// Full decomposition of `cp` (canonical; compatibility too when `compat`).
void decompose(char32_t cp, bool compat, std::vector<char32_t>& out) {
  if (cp >= s_base && cp < s_base + s_count) {
    auto s = cp - s_base;
    out.push_back(l_base + s / n_count);
    out.push_back(v_base + (s % n_count) / t_count);
    if (s % t_count != 0)
      out.push_back(t_base + s % t_count);
    return;
  }
  if (const auto* d = find_decomposition(cp); d != nullptr && (compat || !d->compat)) {
    for (uint8_t k = 0; k < d->length; ++k)
      decompose(detail::decomposition_pool[d->offset + k], compat, out);
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

utf8_unit decode_one(std::string_view text, size_t i) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  unsigned char b0 = s[i];
  auto offset = static_cast<uint32_t>(i);
  if (b0 < 0x80)
    return {b0, offset, 1, true};
  size_t need = 0;
  char32_t cp = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    lo = b0 == 0xE0 ? 0xA0 : 0x80;
    hi = b0 == 0xED ? 0x9F : 0xBF;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    lo = b0 == 0xF0 ? 0x90 : 0x80;
    hi = b0 == 0xF4 ? 0x8F : 0xBF;
  }
  if (need == 0 || i + need >= n)
    return {b0, offset, 1, false};
  for (size_t k = 1; k <= need; ++k) {
    unsigned char b = s[i + k];
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h)
      return {b0, offset, 1, false};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, offset, static_cast<uint32_t>(need + 1), true};
}

std::vector<utf8_unit> decode_utf8(std::string_view text) {
  std::vector<utf8_unit> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    out.push_back(decode_one(text, i));
    i += out.back().length;
  }
  return out;
}

bool is_valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    auto u = decode_one(text, i);
    if (!u.valid)
      return false;
    i += u.length;
  }
  return true;
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

namespace {

// Categories of the Basic Multilingual Plane by direct lookup (64 KiB, built
// once); the rest by binary search over the ranges.
const std::array<uint8_t, 0x10000>& bmp_categories() {
  static const auto table = [] {
    std::array<uint8_t, 0x10000> t{};
    for (size_t i = 0; i < detail::category_range_count; ++i) {
      const auto& r = detail::category_ranges[i];
      for (char32_t cp = r.first; cp <= r.last && cp < 0x10000; ++cp)
        t[cp] = r.cat;
    }
    return t;
  }();
  return table;
}

} // namespace

category general_category(char32_t cp) {
  if (cp < 0x10000)
    return static_cast<category>(bmp_categories()[cp]);
  auto* begin = detail::category_ranges;
  auto* end = begin + detail::category_range_count;
  auto* it = std::upper_bound(
      begin, end, cp, [](char32_t x, const detail::category_range& e) { return x < e.first; });
  if (it == begin || cp > (it - 1)->last)
    return category::Cn;
  return static_cast<category>((it - 1)->cat);
}

namespace {

bool category_in(char32_t cp, category first, category last) {
  auto c = general_category(cp);
  return c >= first && c <= last;
}

} // namespace

bool is_letter(char32_t cp) {
  if (cp < 0x80)
    return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return category_in(cp, category::Lu, category::Lo);
}

bool is_number(char32_t cp) {
  if (cp < 0x80)
    return cp >= '0' && cp <= '9';
  return category_in(cp, category::Nd, category::No);
}

bool is_mark(char32_t cp) {
  return category_in(cp, category::Mn, category::Me);
}

bool is_punctuation(char32_t cp) {
  return category_in(cp, category::Pc, category::Po);
}

bool is_symbol(char32_t cp) {
  return category_in(cp, category::Sm, category::So);
}

bool is_word_char(char32_t cp) {
  auto c = general_category(cp);
  return (c >= category::Lu && c <= category::Me) || c == category::Nd || c == category::Pc;
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

namespace {

// Canonical ordering: a stable sort of every run of non-starters by class.
void canonical_order(std::vector<char32_t>& cps) {
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
}

// Canonical composition (Unicode 3.11, D117) in place.
void canonical_compose(std::vector<char32_t>& cps) {
  if (cps.empty())
    return;
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

} // namespace

std::string normalize(std::string_view text, normal_form form) {
  // Fast path: code points below U+0300 are stable under NFC, those below
  // U+0080 under every form.
  const unsigned char first_unstable = form == normal_form::nfc ? 0xCC : 0x80;
  bool simple = true;
  for (unsigned char ch : text) {
    if (ch >= first_unstable) {
      simple = false;
      break;
    }
  }
  if (simple)
    return std::string{text};
  const bool compat = form == normal_form::nfkc || form == normal_form::nfkd;
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (const auto& u : decode_utf8(text)) {
    if (!u.valid)
      cps.push_back(invalid_marker + u.cp);
    else
      decompose(u.cp, compat, cps);
  }
  canonical_order(cps);
  if (form == normal_form::nfc || form == normal_form::nfkc)
    canonical_compose(cps);
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

void append_lowercase(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return;
  }
  auto* begin = detail::lowercase_mappings;
  auto* end = begin + detail::lowercase_mapping_count;
  auto* it = std::lower_bound(begin, end, cp,
                              [](const detail::case_mapping& m, char32_t x) { return m.cp < x; });
  if (it == end || it->cp != cp) {
    append_utf8(out, cp);
    return;
  }
  append_utf8(out, it->first);
  if (it->second != 0)
    append_utf8(out, it->second);
}

std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const auto& u : decode_utf8(text)) {
    if (u.valid)
      append_lowercase(out, u.cp);
    else
      out += static_cast<char>(u.cp);
  }
  return out;
}

} // namespace troupe::models::unicode
