// jinja2's filters and tests (filters.py, tests.py) over template values,
// with transformers' tojson.
#include "models/chat_template_detail.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace troupe::models::jinja {

namespace {

// ---------------------------------------------------------------- helpers

value str_value(std::string s) {
  return value::string(std::move(s));
}

/// jinja2's make_attrgetter: "a.b.0" looked up with getitem part by part.
value get_path(const value& item, const value& attribute) {
  if (!attribute.is(kind::string))
    return get_item(item, attribute);
  value v = item;
  std::string_view path = attribute.str();
  while (true) {
    auto dot = path.find('.');
    v = get_item(v, text_key(path.substr(0, dot)));
    if (dot == std::string_view::npos)
      return v;
    path.remove_prefix(dot + 1);
  }
}

value ignore_case(const value& v, bool case_sensitive) {
  return !case_sensitive && v.is(kind::string) ? value::string(text::lower(v.str())) : v;
}

bool flag(const value* v, bool fallback) {
  return v == nullptr ? fallback : truthy(*v);
}

/// Python's sorted(items, key=..., reverse=...): stable either way.
void sort_by(value_list& items, value_list keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? less(keys[b], keys[a]) : less(keys[a], keys[b]);
  });
  value_list sorted;
  sorted.reserve(items.size());
  for (size_t i : order)
    sorted.push_back(std::move(items[i]));
  items = std::move(sorted);
}

// ---------------------------------------------------------------- string filters

value f_trim(renderer&, const value& v, call_args& args) {
  auto a = bind_args(args, {"chars"}, "trim");
  const std::string* chars =
      a[0] == nullptr || a[0]->is(kind::none) ? nullptr : &str_arg(*a[0], "strip arg");
  std::string s = to_str(v);
  return value::string_like(std::string(text::strip(s, chars, true, true)), v);
}

value f_lower(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "lower");
  return value::string_like(text::lower(to_str(v)), v);
}

value f_upper(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "upper");
  return value::string_like(text::upper(to_str(v)), v);
}

value f_capitalize(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "capitalize");
  return value::string_like(text::capitalize(to_str(v)), v);
}

value f_title(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "title");
  return str_value(text::jinja_title(to_str(v)));
}

value f_string(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "string");
  return value::string_like(to_str(v), v);
}

value f_safe(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "safe");
  return v.is_markup() ? v : value::markup(to_str(v));
}

value f_escape(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "escape");
  return text::escape(v);
}

value f_forceescape(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "forceescape");
  return value::markup(text::html_escape(to_str(v)));
}

value f_replace(renderer& r, const value& v, call_args& args) {
  auto a = bind_args(args, {"old", "new", "count"}, "replace");
  if (a[0] == nullptr || a[1] == nullptr)
    fail("do_replace() missing required argument");
  int64_t count = a[2] == nullptr || a[2]->is(kind::none) ? -1 : int_arg(*a[2], "count");
  std::string out = text::replace(to_str(v), to_str(*a[0]), to_str(*a[1]), count);
  r.check_size(out.size());
  return str_value(std::move(out));
}

value f_center(renderer&, const value& v, call_args& args) {
  auto a = bind_args(args, {"width"}, "center");
  std::string s = to_str(v);
  int64_t width = a[0] == nullptr ? 80 : int_arg(*a[0], "width");
  auto len = static_cast<int64_t>(text::cp_length(s));
  if (width <= len)
    return str_value(s);
  int64_t marg = width - len, left = marg / 2 + (marg & width & 1);
  return value::string_like(std::string(static_cast<size_t>(left), ' ') + s +
                                std::string(static_cast<size_t>(marg - left), ' '),
                            v);
}

value f_indent(renderer& r, const value& v, call_args& args) {
  auto a = bind_args(args, {"width", "first", "blank"}, "indent");
  if (v.is_undefined())
    fail_undefined(v);
  if (!v.is(kind::string)) // jinja2 appends "\n" to its argument, then splits lines
    fail("'" + type_name(v) + "' object has no attribute 'splitlines'");
  std::string indention = a[0] != nullptr && a[0]->is(kind::string)
                              ? a[0]->str()
                              : std::string(static_cast<size_t>(std::max<int64_t>(
                                                a[0] == nullptr ? 4 : int_arg(*a[0], "width"), 0)),
                                            ' ');
  value_list lines = text::splitlines(v.str() + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i].str();
    if (i > 0)
      out += '\n';
    if (i > 0 && (flag(a[2], false) || !line.empty()))
      out += indention;
    out += line;
    r.check_size(out.size());
  }
  return value::string_like(flag(a[1], false) ? indention + out : out, v);
}

value f_wordcount(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "wordcount");
  return value::integer(text::word_count(to_str(v)));
}

value f_format(renderer&, const value& v, call_args& args) {
  if (!args.positional.empty() && !args.keywords.empty())
    fail("can't handle positional and keyword arguments at the same time");
  value params;
  if (!args.keywords.empty()) {
    auto m = std::make_shared<mapping>();
    for (const auto& [k, x] : args.keywords)
      m->set(value::string(std::string(k)), x);
    params = value::dict(std::move(m));
  } else {
    params = value::list(args.positional, seq_kind::tuple);
  }
  return value::string_like(text::percent_format(to_str(v), params, v.is_markup()), v);
}

// ---------------------------------------------------------------- json

value f_tojson(renderer& r, const value& v, call_args& args) {
  auto a = bind_args(args, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
  json_options o;
  o.ensure_ascii = flag(a[0], false);
  if (a[1] != nullptr && !a[1]->is(kind::none)) {
    o.has_indent = true;
    o.indent =
        a[1]->is(kind::string)
            ? a[1]->str()
            : std::string(static_cast<size_t>(std::max<int64_t>(int_arg(*a[1], "indent"), 0)), ' ');
    o.item_separator = ",";
  }
  if (a[2] != nullptr && !a[2]->is(kind::none)) {
    value_list seps = iterate(*a[2]);
    if (seps.size() != 2)
      fail("separators must be a pair of strings");
    o.item_separator = str_arg(seps[0], "separator");
    o.key_separator = str_arg(seps[1], "separator");
  }
  o.sort_keys = flag(a[3], false);
  std::string out = dump_json(v, o);
  r.check_size(out.size());
  return str_value(std::move(out));
}

// ---------------------------------------------------------------- sequence filters

value f_length(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "length");
  return value::integer(length_of(v));
}

value f_list(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "list");
  return value::list(iterate(v));
}

value f_first(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "first");
  value out;
  if (v.is(kind::object) && v.obj().is_iterator()) {
    if (next_item(v, out))
      return out;
  } else {
    value_list items = iterate(v);
    if (!items.empty())
      return items.front();
  }
  return value::undefined_hint("No first item, sequence was empty.");
}

value f_last(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "last");
  if (v.is(kind::object)) // generators: reversed() needs a sequence
    fail("'" + type_name(v) + "' object is not reversible");
  value_list items = iterate(v);
  if (items.empty())
    return value::undefined_hint("No last item, sequence was empty.");
  return items.back();
}

value f_join(renderer& r, const value& v, call_args& args) {
  auto a = bind_args(args, {"d", "attribute"}, "join");
  std::string sep = a[0] == nullptr ? "" : to_str(*a[0]);
  std::string out;
  bool first = true;
  for (const auto& item : iterate(v)) {
    if (!first)
      out += sep;
    first = false;
    append_str(out, a[1] != nullptr && !a[1]->is(kind::none) ? get_path(item, *a[1]) : item);
    r.check_size(out.size());
  }
  return str_value(std::move(out));
}

value f_default(renderer&, const value& v, call_args& args) {
  auto a = bind_args(args, {"default_value", "boolean"}, "default");
  if (v.is_undefined() || (flag(a[1], false) && !truthy(v)))
    return a[0] == nullptr ? str_value("") : *a[0];
  return v;
}

value f_items(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "items");
  if (v.is_undefined())
    return make_generator({}, "do_items");
  if (!v.is(kind::mapping))
    fail("Can only get item pairs from a mapping.");
  value_list out;
  for (const auto& [k, x] : v.map().entries)
    out.push_back(value::list({k, x}, seq_kind::tuple));
  return make_generator(std::move(out), "do_items");
}

/// The type of reversed(v) in Python.
std::string reverse_iterator_type(const value& v) {
  if (v.is(kind::mapping))
    return "dict_reversekeyiterator";
  if (!v.is(kind::sequence))
    return "reversed";
  switch (v.seq().kind) {
  case seq_kind::list:
    return "list_reverseiterator";
  case seq_kind::range:
    return "range_iterator";
  case seq_kind::dict_keys:
    return "dict_reversekeyiterator";
  case seq_kind::dict_values:
    return "dict_reversevalueiterator";
  case seq_kind::dict_items:
    return "dict_reverseitemiterator";
  case seq_kind::tuple:
    return "reversed";
  }
  return "reversed";
}

value f_reverse(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "reverse");
  if (v.is(kind::string)) {
    auto cps = text::code_points(v.str());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it)
      out += *it;
    return value::string_like(std::move(out), v);
  }
  value_list items = iterate(v);
  std::reverse(items.begin(), items.end());
  if (v.is(kind::object)) // a generator: jinja2 reverses a list of it
    return value::list(std::move(items));
  return make_generator(std::move(items), "", reverse_iterator_type(v));
}

value f_sum(renderer& r, const value& v, call_args& args) {
  auto a = bind_args(args, {"attribute", "start"}, "sum");
  value total = a[1] == nullptr ? value::integer(0) : *a[1];
  if (total.is(kind::string))
    fail("sum() can't sum strings [use ''.join(seq) instead]");
  for (const auto& item : iterate(v))
    total = binary(binop::add, total,
                   a[0] != nullptr && !a[0]->is(kind::none) ? get_path(item, *a[0]) : item, r);
  return total;
}

value min_max(const value& v, call_args& args, bool want_max) {
  auto a = bind_args(args, {"case_sensitive", "attribute"}, want_max ? "max" : "min");
  value_list items = iterate(v);
  if (items.empty())
    return value::undefined_hint("No aggregated item, sequence was empty.");
  auto key = [&](const value& item) {
    value k = a[1] != nullptr && !a[1]->is(kind::none) ? get_path(item, *a[1]) : item;
    return ignore_case(k, flag(a[0], false));
  };
  size_t best = 0;
  value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    value k = key(items[i]);
    if (want_max ? less(best_key, k) : less(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

value f_max(renderer&, const value& v, call_args& args) {
  return min_max(v, args, true);
}
value f_min(renderer&, const value& v, call_args& args) {
  return min_max(v, args, false);
}

value f_sort(renderer&, const value& v, call_args& args) {
  auto a = bind_args(args, {"reverse", "case_sensitive", "attribute"}, "sort");
  value_list items = iterate(v);
  value_list keys;
  keys.reserve(items.size());
  bool case_sensitive = flag(a[1], false);
  for (const auto& item : items) {
    value_list parts;
    if (a[2] == nullptr || a[2]->is(kind::none)) {
      parts.push_back(ignore_case(item, case_sensitive));
    } else if (a[2]->is(kind::string)) {
      static const std::string comma = ",";
      for (const auto& attr : text::split(a[2]->str(), &comma, -1, false))
        parts.push_back(ignore_case(get_path(item, attr), case_sensitive));
    } else {
      parts.push_back(ignore_case(get_item(item, *a[2]), case_sensitive));
    }
    keys.push_back(value::list(std::move(parts)));
  }
  sort_by(items, std::move(keys), flag(a[0], false));
  return value::list(std::move(items));
}

value f_dictsort(renderer&, const value& v, call_args& args) {
  auto a = bind_args(args, {"case_sensitive", "by", "reverse"}, "dictsort");
  if (!v.is(kind::mapping))
    fail("'" + type_name(v) + "' object has no attribute 'items'");
  std::string by = a[1] == nullptr ? "key" : to_str(*a[1]);
  if (by != "key" && by != "value")
    fail("You can only sort by either \"key\" or \"value\"");
  value_list items, keys;
  for (const auto& [k, x] : v.map().entries) {
    items.push_back(value::list({k, x}, seq_kind::tuple));
    keys.push_back(ignore_case(by == "key" ? k : x, flag(a[0], false)));
  }
  sort_by(items, std::move(keys), flag(a[2], false));
  return value::list(std::move(items));
}

value f_unique(renderer&, const value& v, call_args& args) {
  auto a = bind_args(args, {"case_sensitive", "attribute"}, "unique");
  value_list out, seen;
  for (const auto& item : iterate(v)) {
    value k = ignore_case(a[1] != nullptr && !a[1]->is(kind::none) ? get_path(item, *a[1]) : item,
                          flag(a[0], false));
    if (!hashable(k))
      fail("unhashable type: '" + type_name(k) + "'");
    if (std::none_of(seen.begin(), seen.end(), [&](const value& s) { return equals(s, k); })) {
      seen.push_back(k);
      out.push_back(item);
    }
  }
  return make_generator(std::move(out), "do_unique");
}

value f_batch(renderer&, const value& v, call_args& args) {
  auto a = bind_args(args, {"linecount", "fill_with"}, "batch");
  if (a[0] == nullptr)
    fail("do_batch() missing 1 required positional argument: 'linecount'");
  int64_t n = int_arg(*a[0], "linecount");
  value_list out, row;
  for (const auto& item : iterate(v)) {
    if (static_cast<int64_t>(row.size()) == n) {
      out.push_back(value::list(std::move(row)));
      row.clear();
    }
    row.push_back(item);
  }
  if (!row.empty()) {
    while (a[1] != nullptr && !a[1]->is(kind::none) && static_cast<int64_t>(row.size()) < n)
      row.push_back(*a[1]);
    out.push_back(value::list(std::move(row)));
  }
  return make_generator(std::move(out), "do_batch");
}

// ---------------------------------------------------------------- numbers

value f_abs(renderer&, const value& v, call_args& args) {
  bind_args(args, {}, "abs");
  if (v.is_int_like())
    return v.as_int() < 0 ? negate(v) : value::integer(v.as_int());
  if (v.is(kind::floating))
    return value::floating(std::fabs(v.as_double()));
  if (v.is_undefined())
    fail_undefined(v);
  fail("bad operand type for abs(): '" + type_name(v) + "'");
}

/// Python's int(text, base); false when it does not parse.
bool parse_int(std::string_view s, int base, int64_t& out) {
  s = text::strip(s, nullptr, true, true);
  bool negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+'))
    s.remove_prefix(1);
  if (s.size() > 2 && s[0] == '0') {
    char p = static_cast<char>(s[1] | 0x20);
    int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefixed != 0 && (base == prefixed || base == 0)) {
      base = prefixed;
      s.remove_prefix(2);
      if (!s.empty() && s[0] == '_')
        s.remove_prefix(1);
    }
  }
  if (base == 0)
    base = 10;
  std::string digits;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && s[i - 1] != '_')
      continue;
    digits += s[i];
  }
  if (digits.empty())
    return false;
  int64_t v = 0;
  auto res = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
  if (res.ec != std::errc{} || res.ptr != digits.data() + digits.size())
    return false;
  out = negative ? -v : v;
  return true;
}

/// Python's float(text); false when it does not parse.
bool parse_float(std::string_view s, double& out) {
  s = text::strip(s, nullptr, true, true);
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    bool between_digits = i > 0 && i + 1 < s.size() &&
                          std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
                          std::isdigit(static_cast<unsigned char>(s[i + 1]));
    if (s[i] == '_' && between_digits)
      continue;
    t += static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
  }
  std::string_view body = t;
  bool negative = !body.empty() && body[0] == '-';
  if (!body.empty() && (body[0] == '-' || body[0] == '+'))
    body.remove_prefix(1);
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : HUGE_VAL;
    out = negative ? -out : out;
    return true;
  }
  if (body.empty() || body.find_first_not_of("0123456789.e+-") != std::string_view::npos)
    return false;
  auto res = std::from_chars(t.data(), t.data() + t.size(), out);
  return res.ec == std::errc{} && res.ptr == t.data() + t.size();
}

value f_int(renderer&, const value& v, call_args& args) {
  auto a = bind_args(args, {"default", "base"}, "int");
  value fallback = a[0] == nullptr ? value::integer(0) : *a[0];
  if (v.is_undefined())
    fail_undefined(v);
  if (v.is_int_like())
    return value::integer(v.as_int());
  double d = 0;
  if (v.is(kind::string)) {
    int64_t i = 0;
    if (parse_int(v.str(), a[1] == nullptr ? 10 : static_cast<int>(int_arg(*a[1], "base")), i))
      return value::integer(i);
    if (!parse_float(v.str(), d))
      return fallback;
  } else if (v.is(kind::floating)) {
    d = v.as_double();
  } else {
    return fallback;
  }
  if (std::isnan(d))
    return fallback;
  if (std::isinf(d) || std::fabs(d) >= 9.2e18)
    fail("cannot convert float infinity to integer", errc::unsupported);
  return value::integer(static_cast<int64_t>(d));
}

value f_float(renderer&, const value& v, call_args& args) {
  auto a = bind_args(args, {"default"}, "float");
  value fallback = a[0] == nullptr ? value::floating(0.0) : *a[0];
  if (v.is_undefined())
    fail_undefined(v);
  if (v.is_number())
    return value::floating(v.as_double());
  double d = 0;
  if (v.is(kind::string) && parse_float(v.str(), d))
    return value::floating(d);
  return fallback;
}

/// Python's round(x, n) for a float: correctly rounded, ties to even.
double round_float(double x, int64_t digits) {
  if (!std::isfinite(x))
    return x;
  if (digits >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(digits, 300)), x);
    return std::strtod(buf, nullptr);
  }
  double scale = std::pow(10.0, static_cast<double>(-digits));
  return std::nearbyint(x / scale) * scale;
}

value f_round(renderer&, const value& v, call_args& args) {
  auto a = bind_args(args, {"precision", "method"}, "round");
  int64_t precision = a[0] == nullptr ? 0 : int_arg(*a[0], "precision");
  std::string method = a[1] == nullptr ? "common" : to_str(*a[1]);
  if (method != "common" && method != "ceil" && method != "floor")
    fail("method must be common, ceil or floor");
  if (!v.is_number())
    fail("type " + type_name(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (!v.is_int_like())
      return value::floating(round_float(v.as_double(), precision));
    if (precision >= 0)
      return value::integer(v.as_int());
    double scale = std::pow(10.0, static_cast<double>(-precision));
    return value::integer(
        static_cast<int64_t>(std::nearbyint(static_cast<double>(v.as_int()) / scale) * scale));
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_double() * scale;
  return value::floating((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

// ---------------------------------------------------------------- higher-order filters

value f_attr(renderer&, const value& v, call_args& args) {
  auto a = bind_args(args, {"name"}, "attr");
  if (a[0] == nullptr)
    fail("do_attr() missing 1 required positional argument: 'name'");
  const std::string& name = str_arg(*a[0], "attribute name");
  if (v.is(kind::object) || v.is_undefined())
    return get_attribute(v, name);
  bool found = false;
  value method = find_method(v, name, found);
  return found ? method
               : value::undefined_hint("'" + type_repr(v) + "' has no attribute '" + name + "'");
}

/// The arguments after the first `skip` positional ones.
call_args rest_of(const call_args& args, size_t skip) {
  call_args rest;
  rest.positional.assign(args.positional.begin() +
                             static_cast<std::ptrdiff_t>(std::min(skip, args.positional.size())),
                         args.positional.end());
  rest.keywords = args.keywords;
  return rest;
}

value f_map(renderer& r, const value& v, call_args& args) {
  if (!truthy(v))
    return make_generator({}, "sync_do_map");
  value_list out;
  if (args.positional.empty()) {
    const value *attribute = nullptr, *fallback = nullptr;
    for (const auto& [k, x] : args.keywords) {
      if (k != "attribute" && k != "default")
        fail("Unexpected keyword argument '" + std::string(k) + "'");
      (k == "attribute" ? attribute : fallback) = &x;
    }
    if (attribute == nullptr)
      fail("map requires a filter argument");
    for (const auto& item : iterate(v)) {
      value x = get_path(item, *attribute);
      out.push_back(x.is_undefined() && fallback != nullptr && !fallback->is(kind::none) ? *fallback
                                                                                         : x);
    }
  } else {
    std::string name = to_str(args.positional[0]);
    call_args rest = rest_of(args, 1);
    for (const auto& item : iterate(v)) {
      call_args each = rest;
      out.push_back(r.apply_filter(name, item, each));
    }
  }
  return make_generator(std::move(out), "sync_do_map");
}

/// select / reject / selectattr / rejectattr.
value select_or_reject(renderer& r, const value& v, const call_args& args, bool keep, bool attr) {
  const char* fname = "select_or_reject";
  if (!truthy(v))
    return make_generator({}, fname);
  if (attr && args.positional.empty())
    fail("Missing parameter for attribute name");
  size_t off = attr ? 1 : 0;
  bool has_test = args.positional.size() > off;
  std::string test = has_test ? to_str(args.positional[off]) : "";
  call_args rest = rest_of(args, off + 1);
  value_list out;
  for (const auto& item : iterate(v)) {
    value subject = attr ? get_path(item, args.positional[0]) : item;
    call_args each = rest;
    bool hit = has_test ? r.apply_test(test, subject, each) : truthy(subject);
    if (hit == keep)
      out.push_back(item);
  }
  return make_generator(std::move(out), fname);
}

value f_select(renderer& r, const value& v, call_args& args) {
  return select_or_reject(r, v, args, true, false);
}
value f_reject(renderer& r, const value& v, call_args& args) {
  return select_or_reject(r, v, args, false, false);
}
value f_selectattr(renderer& r, const value& v, call_args& args) {
  return select_or_reject(r, v, args, true, true);
}
value f_rejectattr(renderer& r, const value& v, call_args& args) {
  return select_or_reject(r, v, args, false, true);
}

// ---------------------------------------------------------------- tests

const value& test_arg(const call_args& args, std::string_view name) {
  auto a = bind_args(args, {"other"}, name);
  if (a[0] == nullptr)
    fail("test '" + std::string(name) + "' takes one argument");
  return *a[0];
}

void no_test_args(const call_args& args, std::string_view name) {
  bind_args(args, {}, name);
}

bool t_defined(renderer&, const value& v, call_args& a) {
  no_test_args(a, "defined");
  return !v.is_undefined();
}
bool t_undefined(renderer&, const value& v, call_args& a) {
  no_test_args(a, "undefined");
  return v.is_undefined();
}
bool t_none(renderer&, const value& v, call_args& a) {
  no_test_args(a, "none");
  return v.is(kind::none);
}
bool t_boolean(renderer&, const value& v, call_args& a) {
  no_test_args(a, "boolean");
  return v.is(kind::boolean);
}
bool t_true(renderer&, const value& v, call_args& a) {
  no_test_args(a, "true");
  return v.is(kind::boolean) && v.as_bool();
}
bool t_false(renderer&, const value& v, call_args& a) {
  no_test_args(a, "false");
  return v.is(kind::boolean) && !v.as_bool();
}
bool t_integer(renderer&, const value& v, call_args& a) {
  no_test_args(a, "integer");
  return v.is(kind::integer);
}
bool t_float(renderer&, const value& v, call_args& a) {
  no_test_args(a, "float");
  return v.is(kind::floating);
}
bool t_number(renderer&, const value& v, call_args& a) {
  no_test_args(a, "number");
  return v.is_number();
}
bool t_string(renderer&, const value& v, call_args& a) {
  no_test_args(a, "string");
  return v.is(kind::string);
}
bool t_mapping(renderer&, const value& v, call_args& a) {
  no_test_args(a, "mapping");
  return v.is(kind::mapping);
}
bool t_lower(renderer&, const value& v, call_args& a) {
  no_test_args(a, "lower");
  return text::is_lower(to_str(v));
}
bool t_upper(renderer&, const value& v, call_args& a) {
  no_test_args(a, "upper");
  return text::is_upper(to_str(v));
}
bool t_escaped(renderer&, const value& v, call_args& a) {
  no_test_args(a, "escaped");
  return v.is_markup();
}

/// len() and __getitem__: str, list, tuple, range, dict, Undefined.
bool t_sequence(renderer&, const value& v, call_args& a) {
  no_test_args(a, "sequence");
  if (v.is(kind::sequence))
    return v.seq().kind == seq_kind::list || v.seq().kind == seq_kind::tuple ||
           v.seq().kind == seq_kind::range;
  return v.is(kind::string) || v.is(kind::mapping) || v.is_undefined();
}

bool t_iterable(renderer&, const value& v, call_args& a) {
  no_test_args(a, "iterable");
  switch (v.kind()) {
  case kind::string:
  case kind::sequence:
  case kind::mapping:
  case kind::undefined:
    return true;
  case kind::object:
    return v.obj().is_iterator() || v.obj().type_name() == "LoopContext";
  default:
    return false;
  }
}

bool t_callable(renderer&, const value& v, call_args& a) {
  no_test_args(a, "callable");
  return v.is_undefined() || (v.is(kind::object) && v.obj().callable());
}

bool t_odd(renderer& r, const value& v, call_args& a) {
  no_test_args(a, "odd");
  return equals(binary(binop::mod, v, value::integer(2), r), value::integer(1));
}
bool t_even(renderer& r, const value& v, call_args& a) {
  no_test_args(a, "even");
  return equals(binary(binop::mod, v, value::integer(2), r), value::integer(0));
}
bool t_divisibleby(renderer& r, const value& v, call_args& a) {
  return equals(binary(binop::mod, v, test_arg(a, "divisibleby"), r), value::integer(0));
}

bool t_sameas(renderer&, const value& v, call_args& a) {
  const value& other = test_arg(a, "sameas");
  if (v.kind() != other.kind())
    return false;
  switch (v.kind()) {
  case kind::none:
  case kind::undefined:
    return v.identity() == other.identity();
  case kind::boolean:
    return v.as_bool() == other.as_bool();
  case kind::integer:
    return v.as_int() == other.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
  case kind::floating:
    return false;
  default:
    return v.identity() == other.identity();
  }
}

bool t_in(renderer&, const value& v, call_args& a) {
  return contains(test_arg(a, "in"), v);
}
bool t_eq(renderer&, const value& v, call_args& a) {
  return equals(v, test_arg(a, "eq"));
}
bool t_ne(renderer&, const value& v, call_args& a) {
  return !equals(v, test_arg(a, "ne"));
}
bool t_lt(renderer&, const value& v, call_args& a) {
  return less(v, test_arg(a, "lt"), "<");
}
bool t_gt(renderer&, const value& v, call_args& a) {
  return less(test_arg(a, "gt"), v, ">");
}
bool t_le(renderer&, const value& v, call_args& a) {
  return !less(test_arg(a, "le"), v, "<=");
}
bool t_ge(renderer&, const value& v, call_args& a) {
  return !less(v, test_arg(a, "ge"), ">=");
}
bool t_filter(renderer&, const value& v, call_args& a) {
  no_test_args(a, "filter");
  return v.is(kind::string) && jinja_has_filter(v.str());
}
bool t_test(renderer&, const value& v, call_args& a) {
  no_test_args(a, "test");
  return v.is(kind::string) && jinja_has_test(v.str());
}

// ---------------------------------------------------------------- registries

struct filter_entry {
  std::string_view name;
  filter_fn fn;
};

constexpr filter_entry filter_table[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_forceescape},
    {"format", f_format},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
};

/// jinja2's filters this engine leaves out.
constexpr std::string_view other_jinja_filters[] = {
    "filesizeformat", "groupby",   "pprint", "random",   "slice",  "striptags",
    "truncate",       "urlencode", "urlize", "wordwrap", "xmlattr"};

struct test_entry {
  std::string_view name;
  test_fn fn;
};

constexpr test_entry test_table[] = {
    {"odd", t_odd},
    {"even", t_even},
    {"divisibleby", t_divisibleby},
    {"defined", t_defined},
    {"undefined", t_undefined},
    {"filter", t_filter},
    {"test", t_test},
    {"none", t_none},
    {"boolean", t_boolean},
    {"false", t_false},
    {"true", t_true},
    {"integer", t_integer},
    {"float", t_float},
    {"lower", t_lower},
    {"upper", t_upper},
    {"string", t_string},
    {"mapping", t_mapping},
    {"number", t_number},
    {"sequence", t_sequence},
    {"iterable", t_iterable},
    {"callable", t_callable},
    {"sameas", t_sameas},
    {"escaped", t_escaped},
    {"in", t_in},
    {"==", t_eq},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"!=", t_ne},
    {"ne", t_ne},
    {">", t_gt},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {"ge", t_ge},
    {">=", t_ge},
    {"<", t_lt},
    {"lt", t_lt},
    {"lessthan", t_lt},
    {"<=", t_le},
    {"le", t_le},
};

} // namespace

filter_fn find_filter(std::string_view name) {
  for (const auto& f : filter_table)
    if (f.name == name)
      return f.fn;
  return nullptr;
}

test_fn find_test(std::string_view name) {
  for (const auto& t : test_table)
    if (t.name == name)
      return t.fn;
  return nullptr;
}

bool jinja_has_filter(std::string_view name) {
  return find_filter(name) != nullptr ||
         std::find(std::begin(other_jinja_filters), std::end(other_jinja_filters), name) !=
             std::end(other_jinja_filters);
}

bool jinja_has_test(std::string_view name) {
  return find_test(name) != nullptr;
}

} // namespace troupe::models::jinja
