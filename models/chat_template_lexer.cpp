// The chat template lexer: jinja2's tokenizer (lexer.py) with
// trim_blocks=True and lstrip_blocks=True, written as a scanner.
//
// Root state: text up to the next "{{", "{%" or "{#" is data. A tag opened
// with '-' strips all whitespace before it; otherwise, for "{%" and "{#"
// (not "{{", and not when opened with '+'), the spaces and tabs between the
// start of the line and the tag are dropped (lstrip_blocks). "%}" and "#}"
// swallow one newline after them (trim_blocks) unless closed with "+%}";
// "-%}", "-}}", "-#}" swallow all whitespace after them. Newlines are
// normalised to "\n" and one trailing newline of the source is dropped.
#include "models/chat_template_detail.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace troupe::models::jinja {

namespace {

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n')
        ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n')
    out.pop_back();
  return out;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

int hex_value(char c) {
  if (is_digit(c))
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/// `\x`, `\u`, `\U`: exactly `n` hex digits after `pos`.
char32_t hex_escape(std::string_view s, size_t& pos, size_t n, char which) {
  char32_t cp = 0;
  for (size_t i = 0; i < n; ++i) {
    int h = pos + i < s.size() ? hex_value(s[pos + i]) : -1;
    if (h < 0)
      fail(std::string("truncated \\") + which + " escape", errc::parse_error);
    cp = cp * 16 + static_cast<char32_t>(h);
  }
  pos += n;
  if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
    fail("illegal Unicode character", errc::parse_error);
  return cp;
}

/// One escape after a backslash (Python's unicode-escape codec).
void decode_escape(std::string_view s, size_t& pos, std::string& out) {
  static constexpr std::string_view simple = "\\'\"abfnrtv";
  static constexpr std::string_view meaning = "\\'\"\a\b\f\n\r\t\v";
  char c = s[pos++];
  if (c == '\n')
    return; // a line continuation
  if (auto i = simple.find(c); i != std::string_view::npos) {
    out += meaning[i];
  } else if (c == 'x' || c == 'u' || c == 'U') {
    text::append_cp(out, hex_escape(s, pos, c == 'x' ? 2 : c == 'u' ? 4 : 8, c));
  } else if (c == 'N') {
    fail("\\N{...} escapes are not supported", errc::unsupported);
  } else if (c >= '0' && c <= '7') {
    char32_t cp = static_cast<char32_t>(c - '0');
    for (int i = 0; i < 2 && pos < s.size() && s[pos] >= '0' && s[pos] <= '7'; ++i)
      cp = cp * 8 + static_cast<char32_t>(s[pos++] - '0');
    text::append_cp(out, cp);
  } else {
    out += '\\'; // unknown escapes keep their backslash
    out += c;
  }
}

std::string decode_string(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (size_t pos = 0; pos < body.size();) {
    char c = body[pos++];
    if (c == '\\' && pos < body.size())
      decode_escape(body, pos, out);
    else
      out += c;
  }
  return out;
}

/// (\d+_)*\d+ at `pos`: the end, or npos.
size_t digits_end(std::string_view s, size_t pos) {
  if (pos >= s.size() || !is_digit(s[pos]))
    return std::string_view::npos;
  while (true) {
    while (pos < s.size() && is_digit(s[pos]))
      ++pos;
    if (pos + 1 < s.size() && s[pos] == '_' && is_digit(s[pos + 1]))
      ++pos;
    else
      return pos;
  }
}

/// The exponent part e[+-]?digits at `pos`: its end, or npos.
size_t exponent_end(std::string_view s, size_t pos) {
  if (pos >= s.size() || (s[pos] != 'e' && s[pos] != 'E'))
    return std::string_view::npos;
  ++pos;
  if (pos < s.size() && (s[pos] == '+' || s[pos] == '-'))
    ++pos;
  return digits_end(s, pos);
}

/// jinja2's float_re at `pos` (which holds a digit): its end, or npos.
size_t float_end(std::string_view s, size_t pos) {
  if (pos > 0 && s[pos - 1] == '.')
    return std::string_view::npos;
  size_t int_end = digits_end(s, pos);
  size_t frac_end =
      int_end < s.size() && s[int_end] == '.' ? digits_end(s, int_end + 1) : std::string_view::npos;
  if (frac_end != std::string_view::npos) {
    size_t e = exponent_end(s, frac_end);
    return e != std::string_view::npos ? e : frac_end;
  }
  return exponent_end(s, int_end);
}

/// jinja2's integer_re at `pos` (which holds a digit): its end and base.
size_t integer_end(std::string_view s, size_t pos, int& base) {
  base = 10;
  if (s[pos] == '0' && pos + 1 < s.size()) {
    char p = static_cast<char>(s[pos + 1] | 0x20);
    base = p == 'b' ? 2 : p == 'o' ? 8 : p == 'x' ? 16 : 10;
    if (base != 10) {
      size_t end = pos + 2;
      auto ok = [&](char c) {
        int h = hex_value(c);
        return h >= 0 && h < base;
      };
      while (end < s.size() &&
             (ok(s[end]) || (s[end] == '_' && end + 1 < s.size() && ok(s[end + 1]))))
        ++end;
      if (end > pos + 2)
        return end;
      base = 10;
    }
  }
  size_t end = pos + 1;
  auto ok = [&](char c) { return s[pos] == '0' ? c == '0' : is_digit(c); };
  while (end < s.size() && (ok(s[end]) || (s[end] == '_' && end + 1 < s.size() && ok(s[end + 1]))))
    ++end;
  return end;
}

constexpr std::string_view two_char_ops[] = {"//", "**", "==", "!=", ">=", "<="};
constexpr std::string_view one_char_ops = "+-/*%~[](){}<>=.:|,;";

class lexer {
public:
  explicit lexer(std::string_view source) : src_(normalize_newlines(source)) {
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n')
        newlines_.push_back(i);
  }

  std::vector<token> run() {
    size_t pos = 0;
    while (pos < src_.size())
      pos = root(pos);
    push(tok::eof, src_.size());
    return std::move(out_);
  }

private:
  int line_at(size_t pos) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) -
                                newlines_.begin());
  }

  token& push(tok type, size_t at, std::string text = {}) {
    out_.push_back(token{type, line_at(at), std::move(text), 0, 0});
    return out_.back();
  }

  [[noreturn]] void error(size_t at, std::string message) {
    throw failure{errc::parse_error, std::move(message), line_at(at)};
  }

  /// One root-state step from `pos`: data, then a tag; the position after.
  size_t root(size_t pos) {
    size_t at = src_.find('{', pos);
    while (at != std::string::npos &&
           (at + 1 >= src_.size() ||
            std::string_view("{%#").find(src_[at + 1]) == std::string_view::npos))
      at = src_.find('{', at + 1);
    if (at == std::string::npos) {
      push(tok::data, pos, src_.substr(pos));
      return src_.size();
    }
    char kind = src_[at + 1];
    char sign =
        at + 2 < src_.size() && (src_[at + 2] == '-' || src_[at + 2] == '+') ? src_[at + 2] : 0;
    emit_data(pos, at, sign, kind != '{');
    size_t raw_body = kind == '%' ? raw_begin_end(at) : std::string::npos;
    size_t inside = at + 2 + (sign != 0 ? 1 : 0);
    if (raw_body != std::string::npos)
      return raw(raw_body);
    if (kind == '#')
      return comment(at, inside);
    return tag(at, kind, inside);
  }

  /// Data in [pos, end) before a tag opened with `sign`.
  void emit_data(size_t pos, size_t end, char sign, bool block_tag) {
    std::string_view text(src_.data() + pos, end - pos);
    if (sign == '-') {
      text = text.substr(0, text::rstrip_end(text));
    } else if (sign != '+' && block_tag) {
      size_t line_start = text.rfind('\n') + 1; // npos + 1 == 0
      if ((line_start > 0 || line_starting_) && line_start < text.size() &&
          text::skip_space(text, line_start) == text.size())
        text = text.substr(0, line_start);
    }
    if (!text.empty())
      push(tok::data, pos, std::string(text));
  }

  /// Whether `pos` starts "{%" [-+]? \s* `word` \s*; the position after.
  size_t tag_word(size_t pos, std::string_view word) const {
    if (src_.compare(pos, 2, "{%") != 0)
      return std::string::npos;
    pos += 2;
    if (pos < src_.size() && (src_[pos] == '-' || src_[pos] == '+'))
      ++pos;
    pos = text::skip_space(src_, pos);
    if (src_.compare(pos, word.size(), word) != 0)
      return std::string::npos;
    return text::skip_space(src_, pos + word.size());
  }

  /// "{% raw %}" at `at`: the position after it, or npos.
  size_t raw_begin_end(size_t at) {
    size_t pos = tag_word(at, "raw");
    if (pos == std::string::npos)
      return pos;
    if (src_.compare(pos, 3, "-%}") == 0) {
      size_t end = text::skip_space(src_, pos + 3);
      line_starting_ = end > 0 && src_[end - 1] == '\n';
      return end;
    }
    if (src_.compare(pos, 2, "%}") == 0) {
      line_starting_ = false;
      return pos + 2;
    }
    return std::string::npos;
  }

  /// A block end ("+%}", "-%}\s*", "%}\n?") at `pos`: the position after it.
  size_t block_end(size_t pos) {
    if (src_.compare(pos, 3, "+%}") == 0) {
      line_starting_ = false;
      return pos + 3;
    }
    if (src_.compare(pos, 3, "-%}") == 0) {
      size_t end = text::skip_space(src_, pos + 3);
      line_starting_ = src_[end - 1] == '\n';
      return end;
    }
    if (src_.compare(pos, 2, "%}") == 0) {
      bool newline = pos + 2 < src_.size() && src_[pos + 2] == '\n';
      line_starting_ = newline;
      return pos + 2 + (newline ? 1 : 0);
    }
    return std::string::npos;
  }

  /// The body of a raw block starting at `pos`, up to its "{% endraw %}".
  size_t raw(size_t pos) {
    const bool after_begin = line_starting_; // the body's lstrip looks at the raw begin
    for (size_t at = src_.find("{%", pos); at != std::string::npos; at = src_.find("{%", at + 1)) {
      size_t word_end = tag_word(at, "endraw");
      size_t end = word_end == std::string::npos ? word_end : block_end(word_end);
      if (end == std::string::npos)
        continue;
      const bool after_end = line_starting_;
      line_starting_ = after_begin;
      char sign = src_[at + 2] == '-' || src_[at + 2] == '+' ? src_[at + 2] : 0;
      emit_data(pos, at, sign, true);
      line_starting_ = after_end;
      return end;
    }
    error(pos, "Missing end of raw directive");
  }

  size_t comment(size_t at, size_t pos) {
    for (; pos < src_.size(); ++pos) {
      if (src_.compare(pos, 3, "+#}") == 0 || src_.compare(pos, 3, "-#}") == 0) {
        size_t end = src_[pos] == '-' ? text::skip_space(src_, pos + 3) : pos + 3;
        line_starting_ = src_[pos] == '-' && src_[end - 1] == '\n';
        return end;
      }
      if (src_.compare(pos, 2, "#}") == 0) {
        bool newline = pos + 2 < src_.size() && src_[pos + 2] == '\n';
        line_starting_ = newline;
        return pos + 2 + (newline ? 1 : 0);
      }
    }
    error(at, "Missing end of comment tag");
  }

  /// A variable end ("-}}\s*", "}}") at `pos`: the position after it.
  size_t variable_end(size_t pos) {
    if (src_.compare(pos, 3, "-}}") == 0) {
      size_t end = text::skip_space(src_, pos + 3);
      line_starting_ = src_[end - 1] == '\n';
      return end;
    }
    if (src_.compare(pos, 2, "}}") == 0) {
      line_starting_ = false;
      return pos + 2;
    }
    return std::string::npos;
  }

  /// The tokens of a "{{ }}" or "{% %}" tag; the position after it.
  size_t tag(size_t at, char kind, size_t pos) {
    push(kind == '{' ? tok::var_begin : tok::block_begin, at);
    std::vector<char> balance;
    while (pos < src_.size()) {
      if (balance.empty()) {
        size_t end = kind == '{' ? variable_end(pos) : block_end(pos);
        if (end != std::string::npos) {
          push(kind == '{' ? tok::var_end : tok::block_end, pos);
          return end;
        }
      }
      pos = tag_token(pos, balance);
    }
    return pos;
  }

  size_t tag_token(size_t pos, std::vector<char>& balance) {
    char c = src_[pos];
    size_t after = pos;
    if (text::is_space(text::next_cp(src_, after)))
      return after;
    if (is_digit(c))
      return number(pos);
    if (is_name_start(c)) {
      size_t end = pos;
      while (end < src_.size() && is_name_char(src_[end]))
        ++end;
      push(tok::name, pos, src_.substr(pos, end - pos));
      return end;
    }
    if (c == '\'' || c == '"')
      return string_literal(pos);
    return operator_token(pos, balance);
  }

  size_t number(size_t pos) {
    size_t end = float_end(src_, pos);
    std::string digits;
    if (end != std::string::npos) {
      for (size_t i = pos; i < end; ++i)
        if (src_[i] != '_')
          digits += src_[i];
      auto& t = push(tok::floating, pos);
      auto res = std::from_chars(digits.data(), digits.data() + digits.size(), t.floating);
      if (res.ec == std::errc::result_out_of_range) {
        // Python rounds an out-of-range literal to inf, or to 0.0 when it is tiny.
        auto e = digits.find_first_of("eE");
        bool huge = e != std::string::npos && digits[e + 1] != '-';
        t.floating = huge ? HUGE_VAL : 0.0;
      }
      return end;
    }
    int base = 10;
    end = integer_end(src_, pos, base);
    for (size_t i = pos + (base == 10 ? 0 : 2); i < end; ++i)
      if (src_[i] != '_')
        digits += src_[i];
    auto& t = push(tok::integer, pos);
    auto res = std::from_chars(digits.data(), digits.data() + digits.size(), t.integer, base);
    if (res.ec != std::errc{})
      throw failure{errc::unsupported, "integer literal " + digits + " does not fit 64 bits",
                    line_at(pos)};
    return end;
  }

  size_t string_literal(size_t pos) {
    char quote = src_[pos];
    size_t end = pos + 1;
    while (end < src_.size() && src_[end] != quote)
      end += src_[end] == '\\' ? 2 : 1;
    if (end >= src_.size())
      error(pos, std::string("unexpected char '") + quote + "' at " + std::to_string(pos));
    try {
      push(tok::string, pos, decode_string(std::string_view(src_).substr(pos + 1, end - pos - 1)));
    } catch (failure& f) {
      f.line = line_at(pos);
      throw;
    }
    return end + 1;
  }

  size_t operator_token(size_t pos, std::vector<char>& balance) {
    for (auto op : two_char_ops)
      if (src_.compare(pos, 2, op) == 0) {
        push(tok::op, pos, std::string(op));
        return pos + 2;
      }
    char c = src_[pos];
    if (one_char_ops.find(c) == std::string_view::npos)
      error(pos, std::string("unexpected char '") + c + "' at " + std::to_string(pos));
    if (c == '(' || c == '[' || c == '{')
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      if (balance.empty())
        error(pos, std::string("unexpected '") + c + "'");
      if (balance.back() != c)
        error(pos, std::string("unexpected '") + c + "', expected '" + balance.back() + "'");
      balance.pop_back();
    }
    push(tok::op, pos, std::string(1, c));
    return pos + 1;
  }

  std::string src_;
  std::vector<size_t> newlines_;
  std::vector<token> out_;
  bool line_starting_ = true;
};

} // namespace

std::vector<token> tokenize(std::string_view source) {
  return lexer(source).run();
}

} // namespace troupe::models::jinja
