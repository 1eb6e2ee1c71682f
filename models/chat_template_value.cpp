// Template values: construction, Python's truthiness, str(), repr(), ==, <,
// len() and iter() (NOTE [chat template engine] in chat_template.hpp).
#include "models/chat_template_detail.hpp"
#include "models/tokenizer_unicode.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace troupe::models::jinja {

void fail(std::string message, errc code) {
  throw failure{code, std::move(message), 0};
}

namespace {

thread_local uint32_t value_nesting = 0;

uint32_t checked_depth(uint32_t deepest_child) {
  if (deepest_child + 1 > max_value_nesting)
    fail("a value nests deeper than " + std::to_string(max_value_nesting) + " levels",
         errc::out_of_range);
  return deepest_child + 1;
}

} // namespace

uint32_t depth_of(const value& v) {
  switch (v.kind()) {
  case kind::sequence:
    return v.seq().depth;
  case kind::mapping:
    return v.map().depth;
  case kind::object:
    return v.obj().depth();
  default:
    return 0;
  }
}

uint32_t nested_depth(const value_list& items) {
  uint32_t deepest = 0;
  for (const auto& item : items)
    deepest = std::max(deepest, depth_of(item));
  return checked_depth(deepest);
}

uint32_t nested_depth(const mapping& m) {
  uint32_t deepest = 0;
  for (const auto& [k, v] : m.entries)
    deepest = std::max({deepest, depth_of(k), depth_of(v)});
  return checked_depth(deepest);
}

nesting_guard::nesting_guard() {
  if (++value_nesting > max_value_nesting) {
    --value_nesting;
    fail("a value nests deeper than " + std::to_string(max_value_nesting) + " levels",
         errc::out_of_range);
  }
}

nesting_guard::~nesting_guard() {
  --value_nesting;
}

// ---------------------------------------------------------------- construction

value value::none() {
  value v;
  v.kind_ = jinja::kind::none;
  return v;
}

value value::boolean(bool b) {
  value v;
  v.kind_ = jinja::kind::boolean;
  v.scalar_.b = b;
  return v;
}

value value::integer(int64_t i) {
  value v;
  v.kind_ = jinja::kind::integer;
  v.scalar_.i = i;
  return v;
}

value value::floating(double f) {
  value v;
  v.kind_ = jinja::kind::floating;
  v.scalar_.f = f;
  return v;
}

value value::string(std::string s) {
  return string(std::make_shared<const std::string>(std::move(s)));
}

value value::markup(std::string s) {
  value v = string(std::move(s));
  v.markup_ = true;
  return v;
}

value value::string_like(std::string s, const value& like) {
  return like.is_markup() ? markup(std::move(s)) : string(std::move(s));
}

value value::string(string_ptr s) {
  value v;
  v.kind_ = jinja::kind::string;
  v.ptr_ = std::const_pointer_cast<std::string>(std::move(s));
  return v;
}

value value::list(value_list items, seq_kind k) {
  auto s = std::make_shared<jinja::sequence>();
  s->kind = k;
  s->depth = nested_depth(items);
  s->items = std::move(items);
  value v;
  v.kind_ = jinja::kind::sequence;
  v.ptr_ = std::move(s);
  return v;
}

value value::range(int64_t start, int64_t stop, int64_t step) {
  value_list items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    items.push_back(integer(i));
  value v = list(std::move(items), seq_kind::range);
  v.seq().start = start;
  v.seq().stop = stop;
  v.seq().step = step;
  return v;
}

value value::dict(std::shared_ptr<mapping> m) {
  m->depth = nested_depth(*m);
  value v;
  v.kind_ = jinja::kind::mapping;
  v.ptr_ = std::move(m);
  return v;
}

value value::dict() {
  return dict(std::make_shared<mapping>());
}

value value::object(std::shared_ptr<jinja::object> o) {
  value v;
  v.kind_ = jinja::kind::object;
  v.ptr_ = std::move(o);
  return v;
}

value value::undefined(undefined_info info) {
  value v;
  v.ptr_ = std::make_shared<undefined_info>(std::move(info));
  return v;
}

value value::undefined_hint(std::string hint) {
  undefined_info info;
  info.text = std::make_shared<const std::string>(std::move(hint));
  return undefined(std::move(info));
}

double value::as_double() const {
  switch (kind_) {
  case jinja::kind::boolean:
    return scalar_.b ? 1.0 : 0.0;
  case jinja::kind::integer:
    return static_cast<double>(scalar_.i);
  default:
    return scalar_.f;
  }
}

const value* mapping::find(const value& key) const {
  if (key.is(kind::string))
    return find(std::string_view{key.str()});
  for (const auto& [k, v] : entries)
    if (equals(k, key))
      return &v;
  return nullptr;
}

const value* mapping::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k.is(kind::string) && k.str() == key)
      return &v;
  return nullptr;
}

void mapping::set(value key, value v) {
  for (auto& [k, old] : entries)
    if (equals(k, key)) {
      old = std::move(v);
      return;
    }
  entries.emplace_back(std::move(key), std::move(v));
}

value object::attribute(const std::string& name) {
  undefined_info info;
  info.why = undefined_info::reason::attribute;
  info.text = std::make_shared<const std::string>(name);
  info.owner = type_name() + " object";
  return value::undefined(std::move(info));
}

value object::call(renderer&, call_args&) {
  fail("'" + type_name() + "' object is not callable");
}

bool object::set_attribute(const std::string&, value) {
  return false;
}

// ---------------------------------------------------------------- truthiness, names

bool truthy(const value& v) {
  switch (v.kind()) {
  case kind::undefined:
  case kind::none:
    return false;
  case kind::boolean:
    return v.as_bool();
  case kind::integer:
    return v.as_int() != 0;
  case kind::floating:
    return v.as_double() != 0.0;
  case kind::string:
    return !v.str().empty();
  case kind::sequence:
    return !v.seq().items.empty();
  case kind::mapping:
    return !v.map().entries.empty();
  case kind::object:
    return v.obj().length() != 0;
  }
  return false;
}

std::string type_name(const value& v) {
  switch (v.kind()) {
  case kind::undefined:
    return "Undefined";
  case kind::none:
    return "NoneType";
  case kind::boolean:
    return "bool";
  case kind::integer:
    return "int";
  case kind::floating:
    return "float";
  case kind::string:
    return v.is_markup() ? "Markup" : "str";
  case kind::mapping:
    return "dict";
  case kind::object:
    return v.obj().type_name();
  case kind::sequence:
    break;
  }
  switch (v.seq().kind) {
  case seq_kind::list:
    return "list";
  case seq_kind::tuple:
    return "tuple";
  case seq_kind::dict_keys:
    return "dict_keys";
  case seq_kind::dict_values:
    return "dict_values";
  case seq_kind::dict_items:
    return "dict_items";
  case seq_kind::range:
    return "range";
  }
  return "object";
}

std::string type_repr(const value& v) {
  if (v.is(kind::none))
    return "None";
  return type_name(v) + " object";
}

// ---------------------------------------------------------------- repr, str

std::string float_repr(double d) {
  if (std::isnan(d))
    return "nan";
  if (std::isinf(d))
    return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  auto e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.')
      digits += c;
  int exp = std::atoi(std::string(sci.substr(e + 1)).c_str());
  if (exp < -4 || exp >= 16) {
    out += digits[0];
    if (digits.size() > 1)
      out += "." + digits.substr(1);
    char tail[16];
    std::snprintf(tail, sizeof tail, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + tail;
  }
  if (exp < 0)
    return out + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  auto int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len)
    return out + digits + std::string(int_len - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

namespace {

bool printable(char32_t cp) {
  using unicode::category;
  if (cp < 0x7f)
    return cp >= 0x20;
  switch (unicode::general_category(cp)) {
  case category::Cc:
  case category::Cf:
  case category::Cs:
  case category::Co:
  case category::Cn:
  case category::Zl:
  case category::Zp:
  case category::Zs:
    return false;
  default:
    return true;
  }
}

void append_escaped_cp(std::string& out, char32_t cp) {
  char buf[16];
  if (cp <= 0xff)
    std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
  else if (cp <= 0xffff)
    std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
  else
    std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(cp));
  out += buf;
}

void append_joined_repr(std::string& out, const value_list& items) {
  nesting_guard guard;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0)
      out += ", ";
    append_repr(out, items[i]);
  }
}

void append_mapping_repr(std::string& out, const mapping& m) {
  nesting_guard guard;
  out += '{';
  for (size_t i = 0; i < m.entries.size(); ++i) {
    if (i > 0)
      out += ", ";
    append_repr(out, m.entries[i].first);
    out += ": ";
    append_repr(out, m.entries[i].second);
  }
  out += '}';
}

void append_sequence_repr(std::string& out, const sequence& s) {
  switch (s.kind) {
  case seq_kind::tuple:
    out += '(';
    append_joined_repr(out, s.items);
    out += s.items.size() == 1 ? ",)" : ")";
    return;
  case seq_kind::range:
    out += "range(" + std::to_string(s.start) + ", " + std::to_string(s.stop);
    out += s.step == 1 ? ")" : ", " + std::to_string(s.step) + ")";
    return;
  case seq_kind::dict_keys:
    out += "dict_keys(";
    break;
  case seq_kind::dict_values:
    out += "dict_values(";
    break;
  case seq_kind::dict_items:
    out += "dict_items(";
    break;
  case seq_kind::list:
    break;
  }
  out += '[';
  append_joined_repr(out, s.items);
  out += ']';
  if (s.kind != seq_kind::list)
    out += ')';
}

} // namespace

void append_string_repr(std::string& out, std::string_view s) {
  char quote = '\'';
  if (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos)
    quote = '"';
  out += quote;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    char32_t cp = text::next_cp(s, pos);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (printable(cp)) {
      out.append(s.substr(start, pos - start));
    } else {
      append_escaped_cp(out, cp);
    }
  }
  out += quote;
}

void append_repr(std::string& out, const value& v) {
  switch (v.kind()) {
  case kind::undefined:
    out += "Undefined";
    return;
  case kind::string:
    if (v.is_markup()) {
      out += "Markup(";
      append_string_repr(out, v.str());
      out += ')';
      return;
    }
    append_string_repr(out, v.str());
    return;
  case kind::sequence:
    append_sequence_repr(out, v.seq());
    return;
  case kind::mapping:
    append_mapping_repr(out, v.map());
    return;
  case kind::object:
    out += v.obj().repr();
    return;
  default:
    append_str(out, v);
    return;
  }
}

std::string repr(const value& v) {
  std::string out;
  append_repr(out, v);
  return out;
}

void append_str(std::string& out, const value& v) {
  switch (v.kind()) {
  case kind::undefined:
    return;
  case kind::none:
    out += "None";
    return;
  case kind::boolean:
    out += v.as_bool() ? "True" : "False";
    return;
  case kind::integer:
    out += std::to_string(v.as_int());
    return;
  case kind::floating:
    out += float_repr(v.as_double());
    return;
  case kind::string:
    out += v.str();
    return;
  default:
    append_repr(out, v);
    return;
  }
}

std::string to_str(const value& v) {
  if (v.is(kind::string))
    return v.str();
  std::string out;
  append_str(out, v);
  return out;
}

// ---------------------------------------------------------------- ==, <

namespace {

bool numbers_equal(const value& a, const value& b) {
  if (a.is_int_like() && b.is_int_like())
    return a.as_int() == b.as_int();
  return a.as_double() == b.as_double();
}

bool sequences_equal(const sequence& a, const sequence& b) {
  if (a.kind != b.kind || a.items.size() != b.items.size())
    return false;
  nesting_guard guard;
  for (size_t i = 0; i < a.items.size(); ++i)
    if (!equals(a.items[i], b.items[i]))
      return false;
  return true;
}

bool mappings_equal(const mapping& a, const mapping& b) {
  if (a.entries.size() != b.entries.size())
    return false;
  nesting_guard guard;
  for (const auto& [k, v] : a.entries) {
    const value* other = b.find(k);
    if (other == nullptr || !equals(v, *other))
      return false;
  }
  return true;
}

} // namespace

bool equals(const value& a, const value& b) {
  if (a.is_number() && b.is_number())
    return numbers_equal(a, b);
  if (a.kind() != b.kind())
    return false;
  switch (a.kind()) {
  case kind::undefined:
  case kind::none:
    return true;
  case kind::string:
    return a.str() == b.str();
  case kind::sequence:
    return sequences_equal(a.seq(), b.seq());
  case kind::mapping:
    return mappings_equal(a.map(), b.map());
  case kind::object:
    return a.identity() == b.identity();
  default:
    return false;
  }
}

bool less(const value& a, const value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int_like() && b.is_int_like())
      return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is(kind::string) && b.is(kind::string))
    return a.str() < b.str();
  bool lists = a.is(kind::sequence) && b.is(kind::sequence) && a.seq().kind == b.seq().kind &&
               (a.seq().kind == seq_kind::list || a.seq().kind == seq_kind::tuple);
  if (lists) {
    nesting_guard guard;
    const auto& x = a.seq().items;
    const auto& y = b.seq().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equals(x[i], y[i]))
        return less(x[i], y[i], op);
    return x.size() < y.size();
  }
  if (a.is_undefined())
    fail_undefined(a);
  if (b.is_undefined())
    fail_undefined(b);
  fail("'" + std::string(op) + "' not supported between instances of '" + type_name(a) + "' and '" +
       type_name(b) + "'");
}

bool safe_repr(const value& v) {
  switch (v.kind()) {
  case kind::none:
  case kind::boolean:
  case kind::integer:
  case kind::floating:
  case kind::string:
    return true;
  case kind::sequence:
    if (v.seq().kind != seq_kind::list && v.seq().kind != seq_kind::tuple &&
        v.seq().kind != seq_kind::range)
      return false;
    return std::all_of(v.seq().items.begin(), v.seq().items.end(),
                       [](const value& x) { return safe_repr(x); });
  case kind::mapping:
    return std::all_of(v.map().entries.begin(), v.map().entries.end(),
                       [](const auto& e) { return safe_repr(e.first) && safe_repr(e.second); });
  default:
    return false;
  }
}

bool hashable(const value& v) {
  if (v.is(kind::mapping))
    return false;
  if (v.is(kind::sequence)) {
    if (v.seq().kind != seq_kind::tuple && v.seq().kind != seq_kind::range)
      return false;
    nesting_guard guard;
    for (const auto& item : v.seq().items)
      if (!hashable(item))
        return false;
  }
  return true;
}

// ---------------------------------------------------------------- JSON, undefined, iteration

value from_json(const nlohmann::ordered_json& j) {
  using t = nlohmann::ordered_json::value_t;
  nesting_guard guard;
  switch (j.type()) {
  case t::null:
    return value::none();
  case t::boolean:
    return value::boolean(j.get<bool>());
  case t::number_integer:
    return value::integer(j.get<int64_t>());
  case t::number_unsigned: {
    auto u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail("integer " + std::to_string(u) + " does not fit 64 bits", errc::unsupported);
    return value::integer(static_cast<int64_t>(u));
  }
  case t::number_float:
    return value::floating(j.get<double>());
  case t::string:
    return value::string(j.get<std::string>());
  case t::array: {
    value_list items;
    items.reserve(j.size());
    for (const auto& e : j)
      items.push_back(from_json(e));
    return value::list(std::move(items));
  }
  case t::object: {
    auto m = std::make_shared<mapping>();
    m->entries.reserve(j.size());
    for (const auto& [k, e] : j.items())
      m->entries.emplace_back(value::string(k), from_json(e));
    return value::dict(std::move(m));
  }
  default:
    fail("binary JSON values are not template values", errc::unsupported);
  }
}

void fail_undefined(const value& v) {
  const undefined_info* info = v.undef();
  if (info == nullptr)
    fail("value is undefined");
  switch (info->why) {
  case undefined_info::reason::name:
    fail("'" + *info->text + "' is undefined", info->code);
  case undefined_info::reason::attribute:
    fail("'" + info->owner + "' has no attribute '" + *info->text + "'", info->code);
  case undefined_info::reason::element:
    fail(info->owner + " has no element " + *info->text, info->code);
  case undefined_info::reason::hint:
    fail(*info->text, info->code);
  }
  fail("value is undefined");
}

value_list iterate(const value& v) {
  switch (v.kind()) {
  case kind::undefined:
    return {};
  case kind::sequence:
    return v.seq().items;
  case kind::string: {
    value_list out;
    for (auto cp : text::code_points(v.str()))
      out.push_back(value::string(std::string(cp)));
    return out;
  }
  case kind::mapping: {
    value_list out;
    out.reserve(v.map().entries.size());
    for (const auto& entry : v.map().entries)
      out.push_back(entry.first);
    return out;
  }
  case kind::object:
    if (v.obj().is_iterator())
      return v.obj().drain();
    break;
  default:
    break;
  }
  fail("'" + type_name(v) + "' object is not iterable");
}

int64_t length_of(const value& v) {
  switch (v.kind()) {
  case kind::undefined:
    return 0;
  case kind::string:
    return static_cast<int64_t>(text::cp_length(v.str()));
  case kind::sequence:
    return static_cast<int64_t>(v.seq().items.size());
  case kind::mapping:
    return static_cast<int64_t>(v.map().entries.size());
  case kind::object:
    if (v.obj().length() >= 0)
      return v.obj().length();
    break;
  default:
    break;
  }
  fail("object of type '" + type_name(v) + "' has no len()");
}

} // namespace troupe::models::jinja
