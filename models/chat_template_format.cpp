// Text the chat template engine produces from values: json.dumps (the
// tojson filter), printf-style `%` formatting and str.format.
#include "models/chat_template_detail.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace troupe::models::jinja {

// ---------------------------------------------------------------- json.dumps

namespace {

void append_hex4(std::string& out, unsigned cp) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\u%04x", cp);
  out += buf;
}

/// json.dumps' two-character escapes; null for the other code points.
const char* short_escape(char32_t cp) {
  static constexpr std::string_view plain = "\"\\\n\r\t\b\f";
  static const char* const escaped[] = {"\\\"", "\\\\", "\\n", "\\r", "\\t", "\\b", "\\f"};
  auto i = cp < 0x80 ? plain.find(static_cast<char>(cp)) : std::string_view::npos;
  return i == std::string_view::npos ? nullptr : escaped[i];
}

void dump_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t pos = 0; pos < s.size();) {
    size_t start = pos;
    char32_t cp = text::next_cp(s, pos);
    if (const char* e = short_escape(cp)) {
      out += e;
    } else if (cp < 0x20 || (ensure_ascii && cp >= 0x7f)) {
      if (cp >= 0x10000) { // a surrogate pair, as Python writes it
        char32_t v = cp - 0x10000;
        append_hex4(out, 0xd800 + static_cast<unsigned>(v >> 10));
        append_hex4(out, 0xdc00 + static_cast<unsigned>(v & 0x3ff));
      } else {
        append_hex4(out, static_cast<unsigned>(cp));
      }
    } else {
      out.append(s.substr(start, pos - start));
    }
  }
  out += '"';
}

void dump_float(std::string& out, double d) {
  if (std::isnan(d))
    out += "NaN";
  else if (std::isinf(d))
    out += d > 0 ? "Infinity" : "-Infinity";
  else
    out += float_repr(d);
}

[[noreturn]] void not_serializable(const value& v) {
  fail("Object of type " + type_name(v) + " is not JSON serializable");
}

std::string json_key(const value& k) {
  switch (k.kind()) {
  case kind::string:
    return k.str();
  case kind::none:
    return "null";
  case kind::boolean:
    return k.as_bool() ? "true" : "false";
  case kind::integer:
    return std::to_string(k.as_int());
  case kind::floating: {
    std::string s;
    dump_float(s, k.as_double());
    return s;
  }
  default:
    fail("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

class json_writer {
public:
  json_writer(std::string& out, const json_options& opts) : out_(out), opts_(opts) {}

  void write(const value& v) {
    nesting_guard guard;
    switch (v.kind()) {
    case kind::none:
      out_ += "null";
      return;
    case kind::boolean:
      out_ += v.as_bool() ? "true" : "false";
      return;
    case kind::integer:
      out_ += std::to_string(v.as_int());
      return;
    case kind::floating:
      dump_float(out_, v.as_double());
      return;
    case kind::string:
      dump_string(out_, v.str(), opts_.ensure_ascii);
      return;
    case kind::sequence:
      write_array(v);
      return;
    case kind::mapping:
      write_object(v.map());
      return;
    default:
      not_serializable(v);
    }
  }

private:
  void open(char bracket) {
    out_ += bracket;
    ++level_;
    newline();
  }
  void close(char bracket) {
    --level_;
    newline();
    out_ += bracket;
  }
  void newline() {
    if (!opts_.has_indent)
      return;
    out_ += '\n';
    for (int i = 0; i < level_; ++i)
      out_ += opts_.indent;
  }
  void separate() {
    out_ += opts_.item_separator;
    newline();
  }

  void write_array(const value& v) {
    auto k = v.seq().kind;
    if (k != seq_kind::list && k != seq_kind::tuple)
      not_serializable(v);
    const auto& items = v.seq().items;
    if (items.empty()) {
      out_ += "[]";
      return;
    }
    open('[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0)
        separate();
      write(items[i]);
    }
    close(']');
  }

  void write_object(const mapping& m) {
    if (m.entries.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<const std::pair<value, value>*> entries;
    for (const auto& e : m.entries)
      entries.push_back(&e);
    if (opts_.sort_keys)
      std::stable_sort(entries.begin(), entries.end(),
                       [](auto* a, auto* b) { return less(a->first, b->first); });
    open('{');
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i > 0)
        separate();
      dump_string(out_, json_key(entries[i]->first), opts_.ensure_ascii);
      out_ += opts_.key_separator;
      write(entries[i]->second);
    }
    close('}');
  }

  std::string& out_;
  const json_options& opts_;
  int level_ = 0;
};

} // namespace

std::string dump_json(const value& v, const json_options& opts) {
  std::string out;
  json_writer(out, opts).write(v);
  return out;
}

// ---------------------------------------------------------------- % formatting

namespace {

struct percent_spec {
  std::string flags;
  int width = -1, precision = -1;
  char conversion = 's';
};

std::string pad(std::string s, const percent_spec& spec) {
  auto len = static_cast<int>(text::cp_length(s));
  if (spec.width <= len)
    return s;
  std::string fill(static_cast<size_t>(spec.width - len), ' ');
  return spec.flags.find('-') != std::string::npos ? s + fill : fill + s;
}

std::string c_format(const percent_spec& spec, const char* length, char conversion, auto arg) {
  std::string f = "%" + spec.flags;
  if (spec.width >= 0)
    f += std::to_string(spec.width);
  if (spec.precision >= 0)
    f += "." + std::to_string(spec.precision);
  f += length;
  f += conversion;
  int n = std::snprintf(nullptr, 0, f.c_str(), arg);
  std::string out(static_cast<size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, f.c_str(), arg);
  return out;
}

int64_t percent_integer(const value& v, char conversion) {
  if (v.is_int_like())
    return v.as_int();
  if (v.is(kind::floating) && (conversion == 'd' || conversion == 'i' || conversion == 'u'))
    return static_cast<int64_t>(v.as_double());
  fail(std::string("%") + conversion +
       " format: " + (conversion == 'd' || conversion == 'i' ? "a real number" : "an integer") +
       " is required, not " + type_name(v));
}

std::string convert(const percent_spec& spec, const value& v) {
  char c = spec.conversion;
  switch (c) {
  case 's':
  case 'r':
  case 'a': {
    std::string s = c == 's' ? to_str(v) : repr(v);
    if (spec.precision >= 0) {
      auto cps = text::code_points(s);
      if (cps.size() > static_cast<size_t>(spec.precision))
        s.resize(static_cast<size_t>(cps[static_cast<size_t>(spec.precision)].data() - s.data()));
    }
    return pad(std::move(s), spec);
  }
  case 'd':
  case 'i':
  case 'u':
    return c_format(spec, "ll", 'd', static_cast<long long>(percent_integer(v, c)));
  case 'x':
  case 'X':
  case 'o': {
    auto i = percent_integer(v, c);
    auto body = c_format(spec, "ll", c, static_cast<unsigned long long>(i < 0 ? -i : i));
    return i < 0 ? "-" + body : body;
  }
  case 'f':
  case 'F':
  case 'e':
  case 'E':
  case 'g':
  case 'G':
    if (!v.is_number())
      fail("must be real number, not " + type_name(v));
    return c_format(spec, "", c, v.as_double());
  case 'c':
    if (v.is(kind::string) && text::cp_length(v.str()) == 1)
      return pad(v.str(), spec);
    if (v.is_int_like()) {
      std::string s;
      text::append_cp(s, static_cast<char32_t>(v.as_int()));
      return pad(std::move(s), spec);
    }
    fail("%c requires int or char");
  default:
    fail(std::string("unsupported format character '") + c + "'", errc::unsupported);
  }
}

int read_number(std::string_view fmt, size_t& pos) {
  int n = 0;
  while (pos < fmt.size() && fmt[pos] >= '0' && fmt[pos] <= '9')
    n = n * 10 + (fmt[pos++] - '0');
  return n;
}

class percent_formatter {
public:
  percent_formatter(const value& args, bool escape_args) : escape_(escape_args) {
    bool tuple = args.is(kind::sequence) && args.seq().kind == seq_kind::tuple;
    if (tuple)
      positional_ = args.seq().items;
    else
      positional_.push_back(args);
    if (args.is(kind::mapping))
      named_ = &args.map();
    // Python leaves out the "not all arguments converted" check when the
    // argument has __getitem__ (a dict, a list, a range).
    subscriptable_ = !tuple && (args.is(kind::mapping) || args.is_undefined() ||
                                (args.is(kind::sequence) && (args.seq().kind == seq_kind::list ||
                                                             args.seq().kind == seq_kind::range)));
  }

  std::string run(std::string_view fmt) {
    std::string out;
    size_t pos = 0;
    while (pos < fmt.size()) {
      auto at = fmt.find('%', pos);
      out.append(fmt.substr(pos, at == std::string_view::npos ? at : at - pos));
      if (at == std::string_view::npos)
        break;
      pos = at + 1;
      out += field(fmt, pos);
    }
    if (!subscriptable_ && next_ < positional_.size())
      fail("not all arguments converted during string formatting");
    return out;
  }

private:
  const value& take(const std::string* key) {
    if (key != nullptr) {
      const value* v = named_ != nullptr ? named_->find(std::string_view{*key}) : nullptr;
      if (named_ == nullptr)
        fail("format requires a mapping");
      if (v == nullptr)
        fail("'" + *key + "'");
      return *v;
    }
    if (next_ >= positional_.size())
      fail("not enough arguments for format string");
    return positional_[next_++];
  }

  std::string field(std::string_view fmt, size_t& pos) {
    std::string key;
    bool keyed = pos < fmt.size() && fmt[pos] == '(';
    if (keyed) {
      auto close = fmt.find(')', pos);
      if (close == std::string_view::npos)
        fail("incomplete format key");
      key = std::string(fmt.substr(pos + 1, close - pos - 1));
      pos = close + 1;
    }
    percent_spec spec;
    while (pos < fmt.size() && std::string_view("-+ #0").find(fmt[pos]) != std::string_view::npos)
      spec.flags += fmt[pos++];
    if (pos < fmt.size() && fmt[pos] == '*') {
      ++pos;
      spec.width = static_cast<int>(int_arg(take(nullptr), "* wants int"));
    } else if (pos < fmt.size() && fmt[pos] >= '0' && fmt[pos] <= '9') {
      spec.width = read_number(fmt, pos);
    }
    if (pos < fmt.size() && fmt[pos] == '.') {
      ++pos;
      spec.precision = read_number(fmt, pos);
    }
    while (pos < fmt.size() && (fmt[pos] == 'h' || fmt[pos] == 'l' || fmt[pos] == 'L'))
      ++pos;
    if (pos >= fmt.size())
      fail("incomplete format");
    spec.conversion = fmt[pos++];
    if (spec.conversion == '%')
      return "%";
    const value& arg = take(keyed ? &key : nullptr);
    std::string text = convert(spec, arg);
    // Markup % args escapes what str() and repr() give (markupsafe's helper).
    bool textual = spec.conversion == 's' || spec.conversion == 'r' || spec.conversion == 'a';
    if (escape_ && textual && !(spec.conversion == 's' && arg.is_markup()))
      return text::html_escape(text);
    return text;
  }

  value_list positional_;
  const mapping* named_ = nullptr;
  bool subscriptable_ = false;
  bool escape_;
  size_t next_ = 0;
};

} // namespace

std::string text::percent_format(std::string_view fmt, const value& args, bool escape_args) {
  return percent_formatter(args, escape_args).run(fmt);
}

// ---------------------------------------------------------------- str.format

namespace {

struct format_spec {
  std::string fill = " ";
  char align = 0;
  int width = 0;
  percent_spec body; // flags, precision, conversion
};

bool is_align(char c) {
  return c == '<' || c == '>' || c == '^' || c == '=';
}

/// [[fill]align][sign][0][width][.precision][type] of format()'s mini-language.
format_spec parse_spec(std::string_view spec) {
  format_spec s;
  size_t pos = 0;
  if (spec.size() >= 2 && is_align(spec[1])) {
    s.fill = std::string(1, spec[0]);
    s.align = spec[1];
    pos = 2;
  } else if (is_align(spec[0])) {
    s.align = spec[pos++];
  }
  if (pos < spec.size() && (spec[pos] == '+' || spec[pos] == ' '))
    s.body.flags += spec[pos++];
  else if (pos < spec.size() && spec[pos] == '-')
    ++pos;
  if (pos < spec.size() && spec[pos] == '0' && s.align == 0) {
    s.fill = "0";
    s.align = '=';
    ++pos;
  }
  s.width = read_number(spec, pos);
  if (pos < spec.size() && spec[pos] == '.') {
    ++pos;
    s.body.precision = read_number(spec, pos);
  }
  s.body.conversion = pos < spec.size() ? spec[pos++] : 0;
  bool known = std::string_view("sdfFeEgGxXo").find(s.body.conversion) != std::string_view::npos;
  if (pos != spec.size() || (s.body.conversion != 0 && !known))
    fail("unsupported format specification '" + std::string(spec) + "'", errc::unsupported);
  return s;
}

std::string format_body(const value& v, format_spec& s) {
  char& type = s.body.conversion;
  if (!v.is(kind::string) && !v.is_number())
    fail("unsupported format string passed to " + type_name(v) + ".__format__");
  if (type == 0 && v.is(kind::floating) && s.body.precision < 0)
    return float_repr(v.as_double());
  if (type == 0)
    type = v.is(kind::string) ? 's' : (v.is_int_like() ? 'd' : 'g');
  if (type == 's' && !v.is(kind::string))
    fail("Unknown format code 's' for object of type '" + type_name(v) + "'");
  return convert(s.body, v);
}

/// format(v, spec).
std::string apply_spec(const value& v, std::string_view spec) {
  if (spec.empty())
    return to_str(v);
  auto s = parse_spec(spec);
  std::string body = format_body(v, s);
  auto len = static_cast<int>(text::cp_length(body));
  if (s.width <= len)
    return body;
  auto n = static_cast<size_t>(s.width - len);
  auto repeat = [&](size_t k) {
    std::string r;
    for (size_t i = 0; i < k; ++i)
      r += s.fill;
    return r;
  };
  switch (s.align != 0 ? s.align : (v.is(kind::string) ? '<' : '>')) {
  case '<':
    return body + repeat(n);
  case '^':
    return repeat(n / 2) + body + repeat(n - n / 2);
  case '=': {
    size_t sign = !body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ') ? 1 : 0;
    return body.substr(0, sign) + repeat(n) + body.substr(sign);
  }
  default:
    return repeat(n) + body;
  }
}

class brace_formatter {
public:
  brace_formatter(const call_args& args, bool escape_fields)
      : args_(args), escape_(escape_fields) {}

  std::string run(std::string_view fmt) {
    std::string out;
    for (size_t pos = 0; pos < fmt.size();) {
      char c = fmt[pos];
      if ((c == '{' || c == '}') && pos + 1 < fmt.size() && fmt[pos + 1] == c) {
        out += c;
        pos += 2;
      } else if (c == '}') {
        fail("Single '}' encountered in format string");
      } else if (c == '{') {
        auto close = fmt.find('}', pos);
        if (close == std::string_view::npos)
          fail("Single '{' encountered in format string");
        out += field(fmt.substr(pos + 1, close - pos - 1));
        pos = close + 1;
      } else {
        out += c;
        ++pos;
      }
    }
    return out;
  }

private:
  value first(std::string_view name) {
    value key = text_key(name);
    if (name.empty() || key.is(kind::integer)) {
      bool automatic = name.empty();
      if ((automatic && manual_) || (!automatic && automatic_))
        fail("cannot switch between automatic and manual field numbering");
      (automatic ? automatic_ : manual_) = true;
      auto index = automatic ? next_++ : static_cast<size_t>(key.as_int());
      if (index >= args_.positional.size())
        fail("Replacement index " + std::to_string(index) +
             " out of range for positional args tuple");
      return args_.positional[index];
    }
    for (const auto& [k, v] : args_.keywords)
      if (k == name)
        return v;
    fail("'" + std::string(name) + "'");
  }

  value lookup(std::string_view field) {
    size_t end = field.find_first_of(".[");
    value v = first(field.substr(0, end));
    while (end != std::string_view::npos && end < field.size()) {
      if (field[end] == '.') {
        size_t next = field.find_first_of(".[", end + 1);
        v = get_attribute(v, std::string(field.substr(
                                 end + 1, next == std::string_view::npos ? next : next - end - 1)));
        end = next;
        continue;
      }
      size_t close = field.find(']', end);
      if (close == std::string_view::npos)
        fail("Missing ']' in format string");
      v = get_item(v, text_key(field.substr(end + 1, close - end - 1)));
      end = close + 1;
    }
    return v;
  }

  std::string field(std::string_view f) {
    if (f.find('{') != std::string_view::npos)
      fail("nested replacement fields are not supported", errc::unsupported);
    size_t colon = f.find(':');
    std::string_view spec = colon == std::string_view::npos ? "" : f.substr(colon + 1);
    f = f.substr(0, colon);
    char conversion = 0;
    if (auto bang = f.find('!'); bang != std::string_view::npos) {
      conversion = bang + 1 < f.size() ? f[bang + 1] : 0;
      f = f.substr(0, bang);
    }
    value v = lookup(f);
    if (conversion == 'r' || conversion == 'a')
      v = value::string(repr(v));
    else if (conversion == 's')
      v = value::string(to_str(v));
    else if (conversion != 0)
      fail(std::string("Unknown conversion specifier ") + conversion);
    if (escape_ && !v.is_markup()) // markupsafe's EscapeFormatter
      return text::html_escape(apply_spec(v, spec));
    return apply_spec(v, spec);
  }

  const call_args& args_;
  bool escape_;
  size_t next_ = 0;
  bool automatic_ = false, manual_ = false;
};

} // namespace

std::string text::brace_format(std::string_view fmt, const call_args& args, bool escape_fields) {
  return brace_formatter(args, escape_fields).run(fmt);
}

} // namespace troupe::models::jinja
