// Python's operators over template values, and jinja2's sandboxed attribute,
// item and slice access.
#include "models/chat_template_detail.hpp"

#include <cmath>
#include <limits>

namespace troupe::models::jinja {

namespace {

constexpr std::string_view op_symbol[] = {"+", "-", "*", "/", "//", "%", "**"};

[[noreturn]] void unsupported_operands(binop op, const value& a, const value& b) {
  fail("unsupported operand type(s) for " + std::string(op_symbol[static_cast<int>(op)]) + ": '" +
       type_name(a) + "' and '" + type_name(b) + "'");
}

[[noreturn]] void overflow() {
  fail("integer overflow (integers are 64-bit here)", errc::unsupported);
}

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    overflow();
  return r;
}

int64_t checked_sub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r))
    overflow();
  return r;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    overflow();
  return r;
}

int64_t int_pow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1)
      result = checked_mul(result, base);
    exp >>= 1;
    if (exp > 0)
      base = checked_mul(base, base);
  }
  return result;
}

int64_t int_floordiv(int64_t a, int64_t b) {
  if (b == 0)
    fail("integer division or modulo by zero");
  if (a == std::numeric_limits<int64_t>::min() && b == -1)
    overflow();
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int64_t int_mod(int64_t a, int64_t b) {
  if (b == 0)
    fail("integer division or modulo by zero");
  if (b == -1)
    return 0;
  int64_t m = a % b;
  return (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
}

/// CPython's float divmod: (floor quotient, remainder with the divisor's sign).
std::pair<double, double> float_divmod(double a, double b) {
  if (b == 0.0)
    fail("float divmod()");
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0.0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, b);
  }
  double floordiv = 0.0;
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5)
      floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, a / b);
  }
  return {floordiv, mod};
}

value numeric(binop op, const value& a, const value& b) {
  bool ints = a.is_int_like() && b.is_int_like();
  if (ints) {
    int64_t x = a.as_int(), y = b.as_int();
    switch (op) {
    case binop::add:
      return value::integer(checked_add(x, y));
    case binop::sub:
      return value::integer(checked_sub(x, y));
    case binop::mul:
      return value::integer(checked_mul(x, y));
    case binop::floordiv:
      return value::integer(int_floordiv(x, y));
    case binop::mod:
      return value::integer(int_mod(x, y));
    case binop::pow:
      if (y >= 0)
        return value::integer(int_pow(x, y));
      break;
    case binop::div:
      break;
    }
  }
  double x = a.as_double(), y = b.as_double();
  switch (op) {
  case binop::add:
    return value::floating(x + y);
  case binop::sub:
    return value::floating(x - y);
  case binop::mul:
    return value::floating(x * y);
  case binop::div:
    if (y == 0.0)
      fail(ints ? "division by zero" : "float division by zero");
    return value::floating(x / y);
  case binop::floordiv:
    return value::floating(float_divmod(x, y).first);
  case binop::mod:
    return value::floating(float_divmod(x, y).second);
  case binop::pow:
    if (x == 0.0 && y < 0)
      fail("0.0 cannot be raised to a negative power");
    if (x < 0 && y != std::floor(y))
      fail("a negative number raised to a fractional power is complex", errc::unsupported);
    return value::floating(std::pow(x, y));
  }
  return {};
}

value repeat(const value& seq, const value& times, const renderer& r) {
  int64_t n = std::max<int64_t>(times.as_int(), 0);
  if (seq.is(kind::string)) {
    const std::string& s = seq.str();
    if (n > 0 && s.size() > 0)
      r.check_size(s.size() * static_cast<size_t>(std::min<int64_t>(n, INT32_MAX)));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      out += s;
    return value::string_like(std::move(out), seq);
  }
  const auto& items = seq.seq().items;
  if (n > 0 && !items.empty())
    r.check_size(items.size() * static_cast<size_t>(std::min<int64_t>(n, INT32_MAX)) *
                 sizeof(value));
  value_list out;
  for (int64_t i = 0; i < n; ++i)
    out.insert(out.end(), items.begin(), items.end());
  return value::list(std::move(out), seq.seq().kind);
}

bool is_list_or_tuple(const value& v) {
  return v.is(kind::sequence) &&
         (v.seq().kind == seq_kind::list || v.seq().kind == seq_kind::tuple);
}

value add(const value& a, const value& b, const renderer& r) {
  if (a.is(kind::string) && b.is(kind::string)) {
    r.check_size(a.str().size() + b.str().size());
    if (a.is_markup() || b.is_markup()) // Markup escapes the other side
      return value::markup(text::escape(a).str() + text::escape(b).str());
    return value::string(a.str() + b.str());
  }
  if (is_list_or_tuple(a) && is_list_or_tuple(b) && a.seq().kind == b.seq().kind) {
    value_list items = a.seq().items;
    items.insert(items.end(), b.seq().items.begin(), b.seq().items.end());
    return value::list(std::move(items), a.seq().kind);
  }
  if (a.is(kind::string))
    fail("can only concatenate str (not \"" + type_name(b) + "\") to str");
  if (is_list_or_tuple(a))
    fail("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " +
         type_name(a));
  unsupported_operands(binop::add, a, b);
}

} // namespace

value binary(binop op, const value& a, const value& b, const renderer& r) {
  if (a.is_undefined())
    fail_undefined(a);
  if (op == binop::mod && a.is(kind::string)) { // str % Undefined works: it has __getitem__
    std::string s = text::percent_format(a.str(), b, a.is_markup());
    r.check_size(s.size());
    return value::string_like(std::move(s), a);
  }
  if (b.is_undefined())
    fail_undefined(b);
  if (a.is_number() && b.is_number())
    return numeric(op, a, b);
  if (op == binop::add)
    return add(a, b, r);
  if (op == binop::mul && (a.is(kind::string) || is_list_or_tuple(a)) && b.is_int_like())
    return repeat(a, b, r);
  if (op == binop::mul && a.is_int_like() && (b.is(kind::string) || is_list_or_tuple(b)))
    return repeat(b, a, r);
  unsupported_operands(op, a, b);
}

value concat(const value_list& parts, const renderer& r) {
  std::string out;
  for (const auto& p : parts) {
    append_str(out, p);
    r.check_size(out.size());
  }
  return value::string(std::move(out));
}

value negate(const value& v) {
  if (v.is_int_like()) {
    if (v.as_int() == std::numeric_limits<int64_t>::min())
      overflow();
    return value::integer(-v.as_int());
  }
  if (v.is(kind::floating))
    return value::floating(-v.as_double());
  if (v.is_undefined())
    fail_undefined(v);
  fail("bad operand type for unary -: '" + type_name(v) + "'");
}

value positive(const value& v) {
  if (v.is_int_like())
    return value::integer(v.as_int());
  if (v.is(kind::floating))
    return v;
  if (v.is_undefined())
    fail_undefined(v);
  fail("bad operand type for unary +: '" + type_name(v) + "'");
}

bool contains(const value& container, const value& item) {
  switch (container.kind()) {
  case kind::undefined:
    return false;
  case kind::string:
    if (!item.is(kind::string))
      fail("'in <string>' requires string as left operand, not " + type_name(item));
    return container.str().find(item.str()) != std::string::npos;
  case kind::mapping:
    if (!hashable(item))
      fail("unhashable type: '" + type_name(item) + "'");
    return container.map().find(item) != nullptr;
  case kind::sequence:
  case kind::object:
    if (container.is(kind::sequence) || container.obj().is_iterator()) {
      for (const auto& v : iterate(container))
        if (equals(v, item))
          return true;
      return false;
    }
    break;
  default:
    break;
  }
  fail("argument of type '" + type_name(container) + "' is not iterable");
}

// ---------------------------------------------------------------- attribute and item access

namespace {

value missing_attribute(const value& obj, const std::string& name) {
  undefined_info info;
  info.why = undefined_info::reason::attribute;
  info.text = std::make_shared<const std::string>(name);
  info.owner = type_repr(obj);
  return value::undefined(std::move(info));
}

value missing_element(const value& obj, const value& key) {
  if (key.is(kind::string))
    return missing_attribute(obj, key.str());
  undefined_info info;
  info.why = undefined_info::reason::element;
  info.text = std::make_shared<const std::string>(repr(key));
  info.owner = type_repr(obj);
  return value::undefined(std::move(info));
}

/// Python's index adjustment for obj[i]; false when out of range.
bool adjust_index(int64_t& i, size_t size) {
  auto n = static_cast<int64_t>(size);
  if (i < 0)
    i += n;
  return i >= 0 && i < n;
}

value item_of_sequence(const value& obj, const value& key) {
  const sequence& s = obj.seq();
  bool subscriptable =
      s.kind == seq_kind::list || s.kind == seq_kind::tuple || s.kind == seq_kind::range;
  if (subscriptable && key.is_int_like()) {
    int64_t i = key.as_int();
    return adjust_index(i, s.items.size()) ? s.items[static_cast<size_t>(i)]
                                           : missing_element(obj, key);
  }
  return missing_element(obj, key);
}

value item_of_string(const value& obj, const value& key) {
  if (!key.is_int_like())
    return missing_element(obj, key);
  auto cps = text::code_points(obj.str());
  int64_t i = key.as_int();
  if (!adjust_index(i, cps.size()))
    return missing_element(obj, key);
  return value::string_like(std::string(cps[static_cast<size_t>(i)]), obj);
}

} // namespace

value get_attribute(const value& obj, const std::string& name) {
  switch (obj.kind()) {
  case kind::undefined:
    fail_undefined(obj);
  case kind::object:
    return obj.obj().attribute(name);
  default:
    break;
  }
  bool found = false;
  value method = find_method(obj, name, found);
  if (found)
    return method;
  if (obj.is(kind::mapping)) {
    if (const value* v = obj.map().find(std::string_view{name}))
      return *v;
  }
  return missing_attribute(obj, name);
}

value get_item(const value& obj, const value& key) {
  switch (obj.kind()) {
  case kind::undefined:
    fail_undefined(obj);
  case kind::mapping:
    if (hashable(key))
      if (const value* v = obj.map().find(key))
        return *v;
    break;
  case kind::sequence:
    if (!key.is(kind::string))
      return item_of_sequence(obj, key);
    break;
  case kind::string:
    if (!key.is(kind::string))
      return item_of_string(obj, key);
    break;
  case kind::object:
    if (key.is(kind::string))
      return obj.obj().attribute(key.str());
    return missing_element(obj, key);
  default:
    break;
  }
  if (!key.is(kind::string))
    return missing_element(obj, key);
  bool found = false;
  value method = find_method(obj, key.str(), found);
  return found ? method : missing_attribute(obj, key.str());
}

namespace {

struct slice_indices {
  int64_t start, stop, step, count;
};

/// CPython's PySlice_AdjustIndices.
slice_indices adjust_slice(const value* start, const value* stop, const value* step, size_t size) {
  auto n = static_cast<int64_t>(size);
  slice_indices s{0, 0, step != nullptr ? step->as_int() : 1, 0};
  if (s.step == 0)
    fail("slice step cannot be zero");
  auto bound = [&](const value* v, int64_t fallback) {
    if (v == nullptr)
      return fallback;
    int64_t i = v->as_int();
    if (i < 0) {
      i += n;
      if (i < 0)
        i = s.step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = s.step < 0 ? n - 1 : n;
    }
    return i;
  };
  s.start = bound(start, s.step < 0 ? n - 1 : 0);
  s.stop = bound(stop, s.step < 0 ? -1 : n);
  if (s.step > 0)
    s.count = s.stop > s.start ? (s.stop - s.start - 1) / s.step + 1 : 0;
  else
    s.count = s.start > s.stop ? (s.start - s.stop - 1) / (-s.step) + 1 : 0;
  return s;
}

template <class T>
std::vector<T> take_slice(const std::vector<T>& items, const slice_indices& s) {
  std::vector<T> out;
  out.reserve(static_cast<size_t>(s.count));
  for (int64_t k = 0, i = s.start; k < s.count; ++k, i += s.step)
    out.push_back(items[static_cast<size_t>(i)]);
  return out;
}

} // namespace

value get_slice(const value& obj, const value* start, const value* stop, const value* step,
                bool lenient) {
  // jinja2 compiles a slice to a plain Python subscript (the sandbox's
  // getitem is bypassed), so type errors surface instead of undefined.
  if (obj.is_undefined())
    fail_undefined(obj);
  auto type_error = [&](std::string message) {
    if (!lenient)
      fail(std::move(message));
    return value::undefined_hint(std::move(message));
  };
  for (const value* b : {start, stop, step})
    if (b != nullptr && !b->is_int_like())
      return type_error("slice indices must be integers or None or have an __index__ method");
  if (obj.is(kind::string)) {
    auto cps = text::code_points(obj.str());
    std::string out;
    for (auto cp : take_slice(cps, adjust_slice(start, stop, step, cps.size())))
      out += cp;
    return value::string_like(std::move(out), obj);
  }
  if (obj.is(kind::mapping))
    return type_error("unhashable type: 'slice'");
  bool sliceable = obj.is(kind::sequence) &&
                   (obj.seq().kind == seq_kind::list || obj.seq().kind == seq_kind::tuple ||
                    obj.seq().kind == seq_kind::range);
  if (!sliceable)
    return type_error("'" + type_name(obj) + "' object is not subscriptable");
  const sequence& seq = obj.seq();
  auto s = adjust_slice(start, stop, step, seq.items.size());
  value out = value::list(take_slice(seq.items, s), seq.kind);
  if (seq.kind == seq_kind::range) {
    out.seq().start = seq.start + s.start * seq.step;
    out.seq().stop = seq.start + (s.start + s.count * s.step) * seq.step;
    out.seq().step = seq.step * s.step;
  }
  return out;
}

} // namespace troupe::models::jinja
