// Python's str semantics over UTF-8 for the chat template engine: whitespace,
// case mapping, strip / split / replace, and markupsafe's escape.
#include "models/chat_template_detail.hpp"
#include "models/tokenizer_unicode.hpp"

#include <algorithm>
#include <unordered_map>

namespace troupe::models::jinja::text {

// ---------------------------------------------------------------- code points

bool is_space(char32_t cp) {
  if (cp < 0x80)
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20);
  return unicode::is_whitespace(cp);
}

char32_t next_cp(std::string_view s, size_t& pos) {
  auto c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) {
    ++pos;
    return c;
  }
  auto unit = unicode::decode_one(s, pos);
  pos += unit.length;
  return unit.cp;
}

void append_cp(std::string& out, char32_t cp) {
  unicode::append_utf8(out, cp);
}

size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size()) {
    size_t next = pos;
    if (!is_space(next_cp(s, next)))
      break;
    pos = next;
  }
  return pos;
}

namespace {

/// The start of the code point that ends just before `end`.
size_t previous_start(std::string_view s, size_t end) {
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80)
    --start;
  size_t probe = start;
  next_cp(s, probe);
  return probe == end ? start : end - 1;
}

} // namespace

size_t rstrip_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = previous_start(s, end);
    size_t probe = start;
    if (!is_space(next_cp(s, probe)))
      break;
    end = start;
  }
  return end;
}

size_t cp_length(std::string_view s) {
  size_t n = 0;
  for (size_t pos = 0; pos < s.size(); ++n)
    next_cp(s, pos);
  return n;
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    size_t start = pos;
    next_cp(s, pos);
    out.push_back(s.substr(start, pos - start));
  }
  return out;
}

// ---------------------------------------------------------------- case

namespace {

/// Uppercase mappings that are not the inverse of a lowercase mapping.
const std::unordered_map<char32_t, std::u32string>& special_uppercase() {
  static const std::unordered_map<char32_t, std::u32string> table = {
      {0xdf, U"SS"},       {0xb5, U"\u039c"},        {0x131, U"I"},       {0x17f, U"S"},
      {0x149, U"\u02bcN"}, {0x1f0, U"J\u030c"},      {0x1c5, U"\u01c4"},  {0x1c8, U"\u01c7"},
      {0x1cb, U"\u01ca"},  {0x1f2, U"\u01f1"},       {0x345, U"\u0399"},  {0x3c2, U"\u03a3"},
      {0x3d0, U"\u0392"},  {0x3d1, U"\u0398"},       {0x3d5, U"\u03a6"},  {0x3d6, U"\u03a0"},
      {0x3f0, U"\u039a"},  {0x3f1, U"\u03a1"},       {0x3f5, U"\u0395"},  {0x1e9b, U"\u1e60"},
      {0x1fbe, U"\u0399"}, {0x587, U"\u0535\u0552"}, {0xfb00, U"FF"},     {0xfb01, U"FI"},
      {0xfb02, U"FL"},     {0xfb03, U"FFI"},         {0xfb04, U"FFL"},    {0xfb05, U"ST"},
      {0xfb06, U"ST"},     {0x1c80, U"\u0412"},      {0x1c81, U"\u0414"}, {0x1c82, U"\u041e"},
      {0x1c83, U"\u0421"}, {0x1c84, U"\u0422"},      {0x1c85, U"\u0422"}, {0x1c86, U"\u042a"},
      {0x1c87, U"\u0462"}, {0x1c88, U"\ua64a"},
  };
  return table;
}

/// One-code-point uppercase mappings: the inverse of the lowercase table
/// (the smallest code point wins: 'k' -> 'K', not the Kelvin sign).
const std::unordered_map<char32_t, char32_t>& inverse_lowercase() {
  static const std::unordered_map<char32_t, char32_t> table = [] {
    std::unordered_map<char32_t, char32_t> t;
    for (size_t i = 0; i < unicode::detail::lowercase_mapping_count; ++i) {
      const auto& m = unicode::detail::lowercase_mappings[i];
      if (m.second != 0 || m.first == m.cp)
        continue;
      auto [it, inserted] = t.emplace(m.first, m.cp);
      if (!inserted && m.cp < it->second)
        it->second = m.cp;
    }
    return t;
  }();
  return table;
}

void append_upper(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp >= 'a' && cp <= 'z' ? cp - 32 : cp);
    return;
  }
  const auto& special = special_uppercase();
  if (auto it = special.find(cp); it != special.end()) {
    for (char32_t c : it->second)
      append_cp(out, c);
    return;
  }
  const auto& inverse = inverse_lowercase();
  auto it = inverse.find(cp);
  append_cp(out, it == inverse.end() ? cp : it->second);
}

/// Python's titlecase mapping: uppercase except for the digraphs and
/// ligatures, whose title forms keep the second letter small.
void append_title(std::string& out, char32_t cp) {
  static const std::unordered_map<char32_t, std::u32string> table = {
      {0x1c4, U"\u01c5"}, {0x1c5, U"\u01c5"}, {0x1c6, U"\u01c5"}, {0x1c7, U"\u01c8"},
      {0x1c8, U"\u01c8"}, {0x1c9, U"\u01c8"}, {0x1ca, U"\u01cb"}, {0x1cb, U"\u01cb"},
      {0x1cc, U"\u01cb"}, {0x1f1, U"\u01f2"}, {0x1f2, U"\u01f2"}, {0x1f3, U"\u01f2"},
      {0xdf, U"Ss"},      {0xfb00, U"Ff"},    {0xfb01, U"Fi"},    {0xfb02, U"Fl"},
      {0xfb03, U"Ffi"},   {0xfb04, U"Ffl"},   {0xfb05, U"St"},    {0xfb06, U"St"},
  };
  if (auto it = table.find(cp); it != table.end()) {
    for (char32_t c : it->second)
      append_cp(out, c);
    return;
  }
  append_upper(out, cp);
}

bool is_cased(char32_t cp) {
  using unicode::category;
  auto c = unicode::general_category(cp);
  return c == category::Lu || c == category::Ll || c == category::Lt;
}

bool is_case_ignorable(char32_t cp) {
  using unicode::category;
  auto c = unicode::general_category(cp);
  return c == category::Mn || c == category::Me || c == category::Cf || c == category::Lm ||
         c == category::Sk || cp == '\'' || cp == 0x2019;
}

/// Python's Final_Sigma rule for U+03A3 at code point `i` of `cps`.
bool final_sigma(const std::vector<char32_t>& cps, size_t i) {
  size_t j = i;
  while (j > 0 && is_case_ignorable(cps[j - 1]))
    --j;
  if (j == 0 || !is_cased(cps[j - 1]))
    return false;
  size_t k = i + 1;
  while (k < cps.size() && is_case_ignorable(cps[k]))
    ++k;
  return k == cps.size() || !is_cased(cps[k]);
}

std::vector<char32_t> decode(std::string_view s) {
  std::vector<char32_t> cps;
  cps.reserve(s.size());
  for (size_t pos = 0; pos < s.size();)
    cps.push_back(next_cp(s, pos));
  return cps;
}

void append_lower(std::string& out, const std::vector<char32_t>& cps, size_t i) {
  if (cps[i] == 0x3a3)
    append_cp(out, final_sigma(cps, i) ? 0x3c2 : 0x3c3);
  else
    unicode::append_lowercase(out, cps[i]);
}

} // namespace

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; })) {
    for (char c : s)
      out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return out;
  }
  auto cps = decode(s);
  for (size_t i = 0; i < cps.size(); ++i)
    append_lower(out, cps, i);
  return out;
}

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();)
    append_upper(out, next_cp(s, pos));
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  auto cps = decode(s);
  bool previous_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (previous_cased)
      append_lower(out, cps, i);
    else
      append_title(out, cps[i]);
    previous_cased = is_cased(cps[i]);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  auto cps = decode(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0)
      append_title(out, cps[i]);
    else
      append_lower(out, cps, i);
  }
  return out;
}

std::string jinja_title(std::string_view s) {
  // "".join(w[0].upper() + w[1:].lower()) over the pieces of re.split(r"([-\s({\[<]+)").
  auto separator = [](char32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || is_space(cp);
  };
  std::string out;
  for (size_t pos = 0; pos < s.size();) {
    size_t start = pos;
    char32_t cp = next_cp(s, pos);
    if (separator(cp)) {
      out.append(s.substr(start, pos - start));
      continue;
    }
    size_t end = pos;
    while (end < s.size()) {
      size_t probe = end;
      if (separator(next_cp(s, probe)))
        break;
      end = probe;
    }
    append_upper(out, cp);
    out += lower(s.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

namespace {

// Python's str.islower / str.isupper: at least one cased character, all of
// them in `wanted`'s case (Lt, titlecase, counts as neither).
bool all_cased_as(std::string_view s, unicode::category wanted) {
  bool cased = false;
  for (size_t pos = 0; pos < s.size();) {
    auto c = unicode::general_category(next_cp(s, pos));
    bool is_cased =
        c == unicode::category::Lu || c == unicode::category::Ll || c == unicode::category::Lt;
    if (is_cased && c != wanted)
      return false;
    cased = cased || is_cased;
  }
  return cased;
}

} // namespace

bool is_lower(std::string_view s) {
  return all_cased_as(s, unicode::category::Ll);
}

bool is_upper(std::string_view s) {
  return all_cased_as(s, unicode::category::Lu);
}

// ---------------------------------------------------------------- strip, split, replace

std::string_view strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<char32_t> set;
  if (chars != nullptr)
    set = decode(*chars);
  auto strippable = [&](char32_t cp) {
    return chars == nullptr ? is_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t begin = 0, end = s.size();
  while (left && begin < end) {
    size_t probe = begin;
    if (!strippable(next_cp(s, probe)))
      break;
    begin = probe;
  }
  while (right && end > begin) {
    size_t start = previous_start(s, end);
    size_t probe = start;
    if (!strippable(next_cp(s, probe)))
      break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

namespace {

value_list split_on_space(std::string_view s, int64_t maxsplit) {
  auto cps = code_points(s);
  auto space = [&](size_t i) {
    size_t p = 0;
    return is_space(next_cp(cps[i], p));
  };
  auto join = [&](size_t a, size_t b) {
    return value::string(std::string(cps[a].data(), cps[b - 1].data() + cps[b - 1].size()));
  };
  value_list out;
  size_t i = 0, n = cps.size();
  for (int64_t left = maxsplit < 0 ? INT64_MAX : maxsplit; left > 0; --left) {
    while (i < n && space(i))
      ++i;
    if (i == n)
      break;
    size_t j = i;
    while (i < n && !space(i))
      ++i;
    out.push_back(join(j, i));
  }
  while (i < n && space(i))
    ++i;
  if (i < n)
    out.push_back(join(i, n));
  return out;
}

value_list rsplit_on_space(std::string_view s, int64_t maxsplit) {
  auto cps = code_points(s);
  auto space = [&](size_t i) {
    size_t p = 0;
    return is_space(next_cp(cps[i], p));
  };
  auto join = [&](size_t a, size_t b) {
    return value::string(std::string(cps[a].data(), cps[b - 1].data() + cps[b - 1].size()));
  };
  value_list out;
  size_t i = cps.size(); // one past the next code point to look at
  for (int64_t left = maxsplit < 0 ? INT64_MAX : maxsplit; left > 0; --left) {
    while (i > 0 && space(i - 1))
      --i;
    if (i == 0)
      break;
    size_t j = i;
    while (i > 0 && !space(i - 1))
      --i;
    out.push_back(join(i, j));
  }
  while (i > 0 && space(i - 1))
    --i;
  if (i > 0)
    out.push_back(join(0, i));
  std::reverse(out.begin(), out.end());
  return out;
}

value_list split_on(std::string_view s, std::string_view sep, int64_t maxsplit, bool from_right) {
  value_list out;
  if (!from_right) {
    size_t start = 0;
    for (int64_t left = maxsplit < 0 ? INT64_MAX : maxsplit; left > 0; --left) {
      auto at = s.find(sep, start);
      if (at == std::string_view::npos)
        break;
      out.push_back(value::string(std::string(s.substr(start, at - start))));
      start = at + sep.size();
    }
    out.push_back(value::string(std::string(s.substr(start))));
    return out;
  }
  size_t end = s.size();
  for (int64_t left = maxsplit < 0 ? INT64_MAX : maxsplit; left > 0 && end >= sep.size(); --left) {
    auto at = s.substr(0, end).rfind(sep);
    if (at == std::string_view::npos)
      break;
    out.push_back(value::string(std::string(s.substr(at + sep.size(), end - at - sep.size()))));
    end = at;
  }
  out.push_back(value::string(std::string(s.substr(0, end))));
  std::reverse(out.begin(), out.end());
  return out;
}

} // namespace

value_list split(std::string_view s, const std::string* sep, int64_t maxsplit, bool from_right) {
  if (sep == nullptr)
    return from_right ? rsplit_on_space(s, maxsplit) : split_on_space(s, maxsplit);
  if (sep->empty())
    fail("empty separator");
  return split_on(s, *sep, maxsplit, from_right);
}

value_list splitlines(std::string_view s, bool keepends) {
  value_list out;
  size_t start = 0, pos = 0;
  while (pos < s.size()) {
    size_t at = pos;
    char32_t cp = next_cp(s, pos);
    bool brk = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) ||
               cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!brk)
      continue;
    if (cp == '\r' && pos < s.size() && s[pos] == '\n')
      ++pos;
    out.push_back(value::string(std::string(s.substr(start, (keepends ? pos : at) - start))));
    start = pos;
  }
  if (start < s.size())
    out.push_back(value::string(std::string(s.substr(start))));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view now, int64_t count) {
  if (count < 0)
    count = INT64_MAX;
  std::string out;
  if (old.empty()) {
    auto cps = code_points(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count > 0) {
        out += now;
        --count;
      }
      if (i < cps.size())
        out += cps[i];
    }
    return out;
  }
  size_t start = 0;
  for (; count > 0; --count) {
    auto at = s.find(old, start);
    if (at == std::string_view::npos)
      break;
    out.append(s.substr(start, at - start));
    out.append(now);
    start = at + old.size();
  }
  out.append(s.substr(start));
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '\'':
      out += "&#39;";
      break;
    case '"':
      out += "&#34;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

value escape(const value& v) {
  if (v.is_markup())
    return v;
  return value::markup(html_escape(to_str(v)));
}

int64_t word_count(std::string_view s) {
  int64_t words = 0;
  bool in_word = false;
  for (size_t pos = 0; pos < s.size();) {
    char32_t cp = next_cp(s, pos);
    bool word = cp == '_' || unicode::is_letter(cp) || unicode::is_number(cp);
    if (word && !in_word)
      ++words;
    in_word = word;
  }
  return words;
}

} // namespace troupe::models::jinja::text
