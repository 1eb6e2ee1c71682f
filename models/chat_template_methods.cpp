// The objects of the chat template engine (namespaces, loop objects, macros,
// generators, functions, bound methods), Python's str / dict / list methods
// and jinja2's globals as the sandbox lets a template reach them.
#include "models/chat_template_detail.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <ctime>
#include <unordered_map>

#include "models/tokenizer_unicode.hpp"

namespace troupe::models::jinja {

// ---------------------------------------------------------------- argument binding

std::vector<const value*> bind_args(const call_args& args,
                                    std::initializer_list<std::string_view> names,
                                    std::string_view function) {
  std::vector<const value*> out(names.size(), nullptr);
  if (args.positional.size() > names.size())
    fail(std::string(function) + "() takes at most " + std::to_string(names.size()) +
         " argument(s) (" + std::to_string(args.positional.size()) + " given)");
  for (size_t i = 0; i < args.positional.size(); ++i)
    out[i] = &args.positional[i];
  for (const auto& [key, v] : args.keywords) {
    auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end())
      fail(std::string(function) + "() got an unexpected keyword argument '" + std::string(key) +
           "'");
    auto i = static_cast<size_t>(it - names.begin());
    if (out[i] != nullptr)
      fail(std::string(function) + "() got multiple values for argument '" + std::string(key) +
           "'");
    out[i] = &v;
  }
  return out;
}

value text_key(std::string_view text) {
  bool digits = !text.empty() &&
                std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits)
    return value::string(std::string(text));
  int64_t i = 0;
  auto res = std::from_chars(text.data(), text.data() + text.size(), i);
  if (res.ec != std::errc{})
    fail("index " + std::string(text) + " does not fit 64 bits", errc::unsupported);
  return value::integer(i);
}

int64_t int_arg(const value& v, std::string_view what) {
  if (!v.is_int_like())
    fail("'" + type_name(v) + "' object cannot be interpreted as an integer (" + std::string(what) +
         ")");
  return v.as_int();
}

const std::string& str_arg(const value& v, std::string_view what) {
  if (!v.is(kind::string))
    fail(std::string(what) + " must be str, not " + type_name(v));
  return v.str();
}

// ---------------------------------------------------------------- objects

namespace {

using function_fn = value (*)(renderer& r, call_args& args);
using method_fn = value (*)(renderer& r, const value& self, call_args& args);

class builtin_function : public object {
public:
  builtin_function(std::string name, function_fn fn) : name_(std::move(name)), fn_(fn) {}
  std::string type_name() const override { return "function"; }
  std::string repr() const override { return "<function " + name_ + ">"; }
  bool callable() const override { return true; }
  value call(renderer& r, call_args& args) override { return fn_(r, args); }

private:
  std::string name_;
  function_fn fn_;
};

/// The str methods markupsafe's Markup overrides to return Markup.
constexpr std::string_view markup_methods[] = {
    "split",   "rsplit",    "splitlines", "capitalize",   "title",        "lower",  "upper",
    "replace", "ljust",     "rjust",      "lstrip",       "rstrip",       "center", "strip",
    "zfill",   "partition", "rpartition", "removeprefix", "removesuffix", "format", "join"};

/// `v` (a str, or a list / tuple of them) as Markup.
value as_markup(const value& v) {
  if (v.is(kind::string))
    return value::markup(v.str());
  if (!v.is(kind::sequence))
    return v;
  value_list items;
  for (const auto& item : v.seq().items)
    items.push_back(as_markup(item));
  return value::list(std::move(items), v.seq().kind);
}

class bound_method : public object {
public:
  bound_method(value self, std::string_view name, method_fn fn, bool keywords = false)
      : self_(std::move(self)), name_(name), fn_(fn), keywords_(keywords),
        depth_(nested_depth(value_list{self_})) {}
  uint32_t depth() const override { return depth_; }
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override {
    return "<built-in method " + name_ + " of " + jinja::type_name(self_) + " object>";
  }
  bool callable() const override { return true; }
  value call(renderer& r, call_args& args) override {
    if (fn_ == nullptr)
      fail("unsupported method '" + name_ + "' of " + jinja::type_name(self_), errc::unsupported);
    if (!keywords_ && !args.keywords.empty())
      fail(name_ + "() takes no keyword arguments");
    value result = fn_(r, self_, args);
    bool keeps_markup = self_.is_markup() &&
                        std::find(std::begin(markup_methods), std::end(markup_methods), name_) !=
                            std::end(markup_methods);
    return keeps_markup ? as_markup(result) : result;
  }

private:
  value self_;
  std::string name_;
  method_fn fn_;  // null: a Python method outside the subset
  bool keywords_; // Python's builtin methods mostly take positional arguments only
  uint32_t depth_;
};

class namespace_object : public object {
public:
  std::string type_name() const override { return "Namespace"; }
  std::string repr() const override {
    nesting_guard guard; // a namespace may hold itself
    std::string out = "<Namespace {";
    for (size_t i = 0; i < attrs_.entries.size(); ++i) {
      out += i > 0 ? ", " : "";
      append_repr(out, attrs_.entries[i].first);
      out += ": ";
      append_repr(out, attrs_.entries[i].second);
    }
    return out + "}>";
  }
  value attribute(const std::string& name) override {
    const value* v = attrs_.find(std::string_view{name});
    return v != nullptr ? *v : object::attribute(name);
  }
  bool set_attribute(const std::string& name, value v) override {
    uint32_t d = nested_depth(value_list{v});
    attrs_.set(value::string(name), std::move(v));
    attrs_.depth = std::max(attrs_.depth, d);
    return true;
  }
  uint32_t depth() const override { return attrs_.depth; }
  void release() override { attrs_.entries.clear(); }
  mapping attrs_;
};

class macro_object : public object {
public:
  macro_object(const macro_def& m, std::shared_ptr<scope> closure)
      : def_(m), closure_(std::move(closure)) {}
  std::string type_name() const override { return "Macro"; }
  std::string repr() const override { return "<Macro '" + def_.name + "'>"; }
  bool callable() const override { return true; }
  value call(renderer& r, call_args& args) override {
    return value::string(r.call_macro(def_, closure_, args));
  }

private:
  const macro_def& def_;
  std::shared_ptr<scope> closure_;
};

class iterator_object : public object {
public:
  iterator_object(value_list items, std::string name, std::string type)
      : depth_(nested_depth(items)), items_(std::move(items)), name_(std::move(name)),
        type_(std::move(type)) {}
  uint32_t depth() const override { return depth_; }
  std::string type_name() const override { return type_; }
  std::string repr() const override { return "<" + type_ + " object " + name_ + ">"; }
  bool is_iterator() const override { return true; }
  value_list drain() override {
    value_list rest(items_.begin() + static_cast<std::ptrdiff_t>(pos_), items_.end());
    pos_ = items_.size();
    return rest;
  }
  bool next(value& out) {
    if (pos_ >= items_.size())
      return false;
    out = items_[pos_++];
    return true;
  }

private:
  uint32_t depth_;
  value_list items_;
  size_t pos_ = 0;
  std::string name_, type_;
};

/// The `loop` of a for loop; one object per loop, advanced per iteration.
class loop_object : public object {
public:
  explicit loop_object(std::shared_ptr<loop_feed> feed)
      : feed_(std::move(feed)), depth_(feed_->depth()) {}
  uint32_t depth() const override { return depth_; }
  std::string type_name() const override { return "LoopContext"; }
  std::string repr() const override {
    return "<LoopContext " + std::to_string(index0_ + 1) + "/" + std::to_string(size()) + ">";
  }
  int64_t length() const override { return size(); }
  value attribute(const std::string& name) override;
  bool callable() const override { return true; }
  value call(renderer&, call_args&) override {
    fail("The loop must have the 'recursive' marker to be called recursively.");
  }

  int64_t size() const { return static_cast<int64_t>(feed_->count()); }
  bool has(int64_t i) const { return i >= 0 && feed_->has(static_cast<size_t>(i)); }
  value item(int64_t i) const { return feed_->at(static_cast<size_t>(i)); }

  std::shared_ptr<loop_feed> feed_;
  uint32_t depth_;
  int64_t index0_ = 0;
  value last_changed_;
  bool changed_called_ = false;
};

value loop_cycle(renderer&, const value& self, call_args& args) {
  auto& loop = static_cast<loop_object&>(self.obj());
  if (args.positional.empty())
    fail("no items for cycling given");
  auto n = static_cast<int64_t>(args.positional.size());
  return args.positional[static_cast<size_t>(loop.index0_ % n)];
}

value loop_changed(renderer&, const value& self, call_args& args) {
  auto& loop = static_cast<loop_object&>(self.obj());
  value now = value::list(args.positional, seq_kind::tuple);
  if (loop.changed_called_ && equals(loop.last_changed_, now))
    return value::boolean(false);
  loop.changed_called_ = true;
  loop.last_changed_ = now;
  return value::boolean(true);
}

value loop_object::attribute(const std::string& name) {
  const int64_t i = index0_;
  if (name == "index0" || name == "index")
    return value::integer(name == "index" ? i + 1 : i);
  if (name == "revindex" || name == "revindex0")
    return value::integer(name == "revindex" ? size() - i : size() - i - 1);
  if (name == "first" || name == "last")
    return value::boolean(name == "first" ? i == 0 : !has(i + 1));
  if (name == "length")
    return value::integer(size());
  if (name == "depth" || name == "depth0")
    return value::integer(name == "depth" ? 1 : 0);
  if (name == "previtem")
    return i > 0 ? item(i - 1) : value::undefined_hint("there is no previous item");
  if (name == "nextitem")
    return has(i + 1) ? item(i + 1) : value::undefined_hint("there is no next item");
  if (name == "cycle" || name == "changed")
    return value::object(std::make_shared<bound_method>(
        value::object(shared_from_this()), name, name == "cycle" ? loop_cycle : loop_changed));
  return object::attribute(name);
}

} // namespace

std::shared_ptr<object> make_loop(std::shared_ptr<loop_feed> feed) {
  return std::make_shared<loop_object>(std::move(feed));
}

void advance_loop(object& loop, size_t index0) {
  static_cast<loop_object&>(loop).index0_ = static_cast<int64_t>(index0);
}

value make_macro(const macro_def& m, std::shared_ptr<scope> closure) {
  return value::object(std::make_shared<macro_object>(m, std::move(closure)));
}

value make_generator(value_list items, std::string function_name, std::string type) {
  return value::object(std::make_shared<iterator_object>(std::move(items), std::move(function_name),
                                                         std::move(type)));
}

bool next_item(const value& generator, value& out) {
  return static_cast<iterator_object&>(generator.obj()).next(out);
}

// ---------------------------------------------------------------- str methods

namespace {

value str_val(std::string s) {
  return value::string(std::move(s));
}

/// The code point range [start, end) of `s` that the optional start / end
/// arguments select (Python's ADJUST_INDICES), as byte offsets.
std::pair<size_t, size_t> sub_range(std::string_view s, const value* start, const value* end,
                                    std::vector<std::string_view>& cps) {
  cps = text::code_points(s);
  auto n = static_cast<int64_t>(cps.size());
  auto adjust = [&](const value* v, int64_t fallback) {
    if (v == nullptr || v->is(kind::none))
      return fallback;
    int64_t i = int_arg(*v, "slice index");
    if (i < 0)
      i = std::max<int64_t>(i + n, 0);
    return std::min(i, n);
  };
  int64_t a = adjust(start, 0), b = adjust(end, n);
  auto offset = [&](int64_t i) {
    return i >= n ? s.size() : static_cast<size_t>(cps[static_cast<size_t>(i)].data() - s.data());
  };
  if (a > b)
    return {std::string_view::npos, 0};
  return {offset(a), offset(b)};
}

size_t cp_index(std::string_view s, size_t byte_offset) {
  return text::cp_length(s.substr(0, byte_offset));
}

value str_affix(const value& self, call_args& args, bool prefix) {
  auto a = bind_args(args, {"affix", "start", "end"}, prefix ? "startswith" : "endswith");
  if (a[0] == nullptr)
    fail(std::string(prefix ? "startswith" : "endswith") +
         "() takes at least 1 argument (0 given)");
  std::vector<std::string_view> cps;
  auto [from, to] = sub_range(self.str(), a[1], a[2], cps);
  if (from == std::string_view::npos)
    return value::boolean(false);
  std::string_view s = std::string_view(self.str()).substr(from, to - from);
  value_list choices = a[0]->is(kind::sequence) && a[0]->seq().kind == seq_kind::tuple
                           ? a[0]->seq().items
                           : value_list{*a[0]};
  for (const auto& c : choices) {
    const std::string& x = str_arg(c, prefix ? "startswith first arg" : "endswith first arg");
    bool hit = prefix ? s.substr(0, x.size()) == x
                      : s.size() >= x.size() && s.substr(s.size() - x.size()) == x;
    if (hit)
      return value::boolean(true);
  }
  return value::boolean(false);
}

value str_startswith(renderer&, const value& self, call_args& args) {
  return str_affix(self, args, true);
}
value str_endswith(renderer&, const value& self, call_args& args) {
  return str_affix(self, args, false);
}

value str_split_impl(const value& self, call_args& args, bool from_right) {
  auto a = bind_args(args, {"sep", "maxsplit"}, from_right ? "rsplit" : "split");
  const std::string* sep =
      a[0] == nullptr || a[0]->is(kind::none) ? nullptr : &str_arg(*a[0], "sep");
  int64_t maxsplit = a[1] == nullptr ? -1 : int_arg(*a[1], "maxsplit");
  return value::list(text::split(self.str(), sep, maxsplit, from_right));
}

value str_split(renderer&, const value& self, call_args& args) {
  return str_split_impl(self, args, false);
}
value str_rsplit(renderer&, const value& self, call_args& args) {
  return str_split_impl(self, args, true);
}

value str_strip_impl(const value& self, call_args& args, bool left, bool right) {
  auto a = bind_args(args, {"chars"}, "strip");
  const std::string* chars =
      a[0] == nullptr || a[0]->is(kind::none) ? nullptr : &str_arg(*a[0], "strip arg");
  return str_val(std::string(text::strip(self.str(), chars, left, right)));
}

value str_strip(renderer&, const value& self, call_args& args) {
  return str_strip_impl(self, args, true, true);
}
value str_lstrip(renderer&, const value& self, call_args& args) {
  return str_strip_impl(self, args, true, false);
}
value str_rstrip(renderer&, const value& self, call_args& args) {
  return str_strip_impl(self, args, false, true);
}

value str_replace(renderer& r, const value& self, call_args& args) {
  auto a = bind_args(args, {"old", "new", "count"}, "replace");
  if (a[0] == nullptr || a[1] == nullptr)
    fail("replace() takes at least 2 arguments");
  int64_t count = a[2] == nullptr ? -1 : int_arg(*a[2], "count");
  std::string out = text::replace(self.str(), str_arg(*a[0], "replace() argument 1"),
                                  str_arg(*a[1], "replace() argument 2"), count);
  r.check_size(out.size());
  return str_val(std::move(out));
}

value no_args(const call_args& args, std::string_view name) {
  if (!args.positional.empty() || !args.keywords.empty())
    fail(std::string(name) + "() takes no arguments");
  return {};
}

value str_lower(renderer&, const value& self, call_args& args) {
  no_args(args, "lower");
  return str_val(text::lower(self.str()));
}
value str_upper(renderer&, const value& self, call_args& args) {
  no_args(args, "upper");
  return str_val(text::upper(self.str()));
}
value str_title(renderer&, const value& self, call_args& args) {
  no_args(args, "title");
  return str_val(text::title(self.str()));
}
/// str.casefold() as lower() with the common full foldings (ß -> ss).
value str_casefold(renderer&, const value& self, call_args& args) {
  no_args(args, "casefold");
  return str_val(text::replace(text::lower(self.str()), "\u00df", "ss", -1));
}

value str_capitalize(renderer&, const value& self, call_args& args) {
  no_args(args, "capitalize");
  return str_val(text::capitalize(self.str()));
}

/// find / rfind / index / rindex / count over an optional [start, end).
value str_search(const value& self, call_args& args, std::string_view name) {
  auto a = bind_args(args, {"sub", "start", "end"}, name);
  if (a[0] == nullptr)
    fail(std::string(name) + "() takes at least 1 argument (0 given)");
  const std::string& sub = str_arg(*a[0], "must be str");
  std::vector<std::string_view> cps;
  auto [from, to] = sub_range(self.str(), a[1], a[2], cps);
  std::string_view s = from == std::string_view::npos
                           ? std::string_view{}
                           : std::string_view(self.str()).substr(from, to - from);
  if (name == "count") {
    if (from == std::string_view::npos)
      return value::integer(0);
    if (sub.empty())
      return value::integer(static_cast<int64_t>(text::cp_length(s)) + 1);
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size()))
      ++n;
    return value::integer(n);
  }
  bool right = name[0] == 'r';
  size_t at = from == std::string_view::npos ? std::string_view::npos
                                             : (right ? s.rfind(sub) : s.find(sub));
  if (at == std::string_view::npos) {
    if (name == "index" || name == "rindex")
      fail("substring not found");
    return value::integer(-1);
  }
  return value::integer(static_cast<int64_t>(cp_index(self.str(), from + at)));
}

value str_find(renderer&, const value& self, call_args& args) {
  return str_search(self, args, "find");
}
value str_rfind(renderer&, const value& self, call_args& args) {
  return str_search(self, args, "rfind");
}
value str_index(renderer&, const value& self, call_args& args) {
  return str_search(self, args, "index");
}
value str_rindex(renderer&, const value& self, call_args& args) {
  return str_search(self, args, "rindex");
}
value str_count(renderer&, const value& self, call_args& args) {
  return str_search(self, args, "count");
}

value str_join(renderer& r, const value& self, call_args& args) {
  auto a = bind_args(args, {"iterable"}, "join");
  if (a[0] == nullptr)
    fail("join() takes exactly one argument (0 given)");
  std::string out;
  size_t i = 0;
  for (const auto& item : iterate(*a[0])) {
    if (!item.is(kind::string) && !self.is_markup()) // Markup.join escapes any item
      fail("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(item) +
           " found");
    if (i++ > 0)
      out += self.str();
    out += self.is_markup() ? text::escape(item).str() : item.str();
    r.check_size(out.size());
  }
  return str_val(std::move(out));
}

value str_format(renderer&, const value& self, call_args& args) {
  return str_val(text::brace_format(self.str(), args, self.is_markup()));
}

value str_splitlines(renderer&, const value& self, call_args& args) {
  auto a = bind_args(args, {"keepends"}, "splitlines");
  return value::list(text::splitlines(self.str(), a[0] != nullptr && truthy(*a[0])));
}

template <bool (*Pred)(char32_t)>
value str_is(renderer&, const value& self, call_args& args) {
  no_args(args, "is");
  const std::string& s = self.str();
  if (s.empty())
    return value::boolean(false);
  for (size_t pos = 0; pos < s.size();)
    if (!Pred(text::next_cp(s, pos)))
      return value::boolean(false);
  return value::boolean(true);
}

bool cp_digit(char32_t cp);
bool cp_alpha(char32_t cp);
bool cp_alnum(char32_t cp);
bool cp_numeric(char32_t cp);

value str_islower(renderer&, const value& self, call_args& args) {
  no_args(args, "islower");
  return value::boolean(text::is_lower(self.str()));
}
value str_isupper(renderer&, const value& self, call_args& args) {
  no_args(args, "isupper");
  return value::boolean(text::is_upper(self.str()));
}

value str_pad(const value& self, call_args& args, std::string_view name) {
  auto a = bind_args(args, {"width", "fillchar"}, name);
  if (a[0] == nullptr)
    fail(std::string(name) + "() takes at least 1 argument (0 given)");
  int64_t width = int_arg(*a[0], "width");
  std::string fill = a[1] == nullptr ? " " : str_arg(*a[1], "fill character");
  if (text::cp_length(fill) != 1)
    fail("The fill character must be exactly one character long");
  auto len = static_cast<int64_t>(text::cp_length(self.str()));
  if (width <= len)
    return self;
  int64_t marg = width - len, left = 0;
  if (name == "center")
    left = marg / 2 + (marg & width & 1);
  else if (name == "rjust")
    left = marg;
  std::string out;
  for (int64_t i = 0; i < left; ++i)
    out += fill;
  out += self.str();
  for (int64_t i = left; i < marg; ++i)
    out += fill;
  return str_val(std::move(out));
}

value str_center(renderer&, const value& self, call_args& args) {
  return str_pad(self, args, "center");
}
value str_ljust(renderer&, const value& self, call_args& args) {
  return str_pad(self, args, "ljust");
}
value str_rjust(renderer&, const value& self, call_args& args) {
  return str_pad(self, args, "rjust");
}

value str_zfill(renderer&, const value& self, call_args& args) {
  auto a = bind_args(args, {"width"}, "zfill");
  int64_t width = a[0] == nullptr ? 0 : int_arg(*a[0], "width");
  const std::string& s = self.str();
  auto len = static_cast<int64_t>(text::cp_length(s));
  if (width <= len)
    return self;
  size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
  return str_val(s.substr(0, sign) + std::string(static_cast<size_t>(width - len), '0') +
                 s.substr(sign));
}

value str_partition_impl(const value& self, call_args& args, bool right) {
  auto a = bind_args(args, {"sep"}, right ? "rpartition" : "partition");
  if (a[0] == nullptr)
    fail("partition() takes exactly one argument (0 given)");
  const std::string& sep = str_arg(*a[0], "sep");
  if (sep.empty())
    fail("empty separator");
  const std::string& s = self.str();
  size_t at = right ? s.rfind(sep) : s.find(sep);
  value_list parts;
  if (at == std::string::npos)
    parts = right ? value_list{str_val(""), str_val(""), self}
                  : value_list{self, str_val(""), str_val("")};
  else
    parts = {str_val(s.substr(0, at)), str_val(sep), str_val(s.substr(at + sep.size()))};
  return value::list(std::move(parts), seq_kind::tuple);
}

value str_partition(renderer&, const value& self, call_args& args) {
  return str_partition_impl(self, args, false);
}
value str_rpartition(renderer&, const value& self, call_args& args) {
  return str_partition_impl(self, args, true);
}

value str_remove_affix(const value& self, call_args& args, bool prefix) {
  auto a = bind_args(args, {"affix"}, prefix ? "removeprefix" : "removesuffix");
  if (a[0] == nullptr)
    fail("removeprefix() takes exactly one argument (0 given)");
  const std::string& x = str_arg(*a[0], "argument");
  const std::string& s = self.str();
  if (prefix && s.compare(0, x.size(), x) == 0)
    return str_val(s.substr(x.size()));
  if (!prefix && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
    return str_val(s.substr(0, s.size() - x.size()));
  return self;
}

value str_removeprefix(renderer&, const value& self, call_args& args) {
  return str_remove_affix(self, args, true);
}
value str_removesuffix(renderer&, const value& self, call_args& args) {
  return str_remove_affix(self, args, false);
}

struct method_entry {
  std::string_view name;
  method_fn fn;
  bool keywords = false; // accepts keyword arguments
};

const method_entry str_methods[] = {
    {"startswith", str_startswith},
    {"endswith", str_endswith},
    {"split", str_split, true},
    {"rsplit", str_rsplit, true},
    {"strip", str_strip},
    {"lstrip", str_lstrip},
    {"rstrip", str_rstrip},
    {"replace", str_replace},
    {"lower", str_lower},
    {"upper", str_upper},
    {"title", str_title},
    {"capitalize", str_capitalize},
    {"casefold", str_casefold},
    {"find", str_find},
    {"rfind", str_rfind},
    {"index", str_index},
    {"rindex", str_rindex},
    {"count", str_count},
    {"join", str_join},
    {"format", str_format, true},
    {"splitlines", str_splitlines, true},
    {"isdigit", str_is<cp_digit>},
    {"isdecimal", str_is<cp_digit>},
    {"isnumeric", str_is<cp_numeric>},
    {"isalpha", str_is<cp_alpha>},
    {"isalnum", str_is<cp_alnum>},
    {"isspace", str_is<text::is_space>},
    {"islower", str_islower},
    {"isupper", str_isupper},
    {"center", str_center},
    {"ljust", str_ljust},
    {"rjust", str_rjust},
    {"zfill", str_zfill},
    {"partition", str_partition},
    {"rpartition", str_rpartition},
    {"removeprefix", str_removeprefix},
    {"removesuffix", str_removesuffix},
};

/// Python str methods outside the subset: calling one is errc::unsupported.
constexpr std::string_view other_str_methods[] = {
    "encode",      "expandtabs", "format_map", "isascii",  "isidentifier",
    "isprintable", "istitle",    "maketrans",  "swapcase", "translate"};

bool cp_digit(char32_t cp) {
  return cp < 0x80 ? (cp >= '0' && cp <= '9')
                   : unicode::general_category(cp) == unicode::category::Nd;
}
bool cp_numeric(char32_t cp) {
  return cp < 0x80 ? (cp >= '0' && cp <= '9') : unicode::is_number(cp);
}
bool cp_alpha(char32_t cp) {
  return cp < 0x80 ? ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') : unicode::is_letter(cp);
}
bool cp_alnum(char32_t cp) {
  return cp_alpha(cp) || cp_numeric(cp);
}

} // namespace

// ---------------------------------------------------------------- dict and list methods

namespace {

value dict_view(const value& self, call_args& args, seq_kind k) {
  no_args(args, "items");
  value_list out;
  out.reserve(self.map().entries.size());
  for (const auto& [key, v] : self.map().entries) {
    if (k == seq_kind::dict_items)
      out.push_back(value::list({key, v}, seq_kind::tuple));
    else
      out.push_back(k == seq_kind::dict_keys ? key : v);
  }
  return value::list(std::move(out), k);
}

value dict_items(renderer&, const value& self, call_args& args) {
  return dict_view(self, args, seq_kind::dict_items);
}
value dict_keys(renderer&, const value& self, call_args& args) {
  return dict_view(self, args, seq_kind::dict_keys);
}
value dict_values(renderer&, const value& self, call_args& args) {
  return dict_view(self, args, seq_kind::dict_values);
}

value dict_get(renderer&, const value& self, call_args& args) {
  if (!args.keywords.empty() || args.positional.empty() || args.positional.size() > 2)
    fail("get() takes 1 or 2 positional arguments");
  const value& key = args.positional[0];
  if (!hashable(key))
    fail("unhashable type: '" + type_name(key) + "'");
  const value* v = self.map().find(key);
  if (v != nullptr)
    return *v;
  return args.positional.size() > 1 ? args.positional[1] : value::none();
}

value dict_copy(renderer&, const value& self, call_args& args) {
  no_args(args, "copy");
  return value::dict(std::make_shared<mapping>(self.map()));
}

value list_index(renderer&, const value& self, call_args& args) {
  auto a = bind_args(args, {"value", "start", "stop"}, "index");
  if (a[0] == nullptr)
    fail("index expected at least 1 argument, got 0");
  const auto& items = self.seq().items;
  auto n = static_cast<int64_t>(items.size());
  auto bound = [&](const value* v, int64_t fallback) {
    if (v == nullptr)
      return fallback;
    int64_t i = int_arg(*v, "index");
    return i < 0 ? std::max<int64_t>(i + n, 0) : std::min(i, n);
  };
  for (int64_t i = bound(a[1], 0), end = bound(a[2], n); i < end; ++i)
    if (equals(items[static_cast<size_t>(i)], *a[0]))
      return value::integer(i);
  fail(repr(*a[0]) + " is not in " + type_name(self));
}

value list_count(renderer&, const value& self, call_args& args) {
  auto a = bind_args(args, {"value"}, "count");
  if (a[0] == nullptr)
    fail("count() takes exactly one argument (0 given)");
  return value::integer(std::count_if(self.seq().items.begin(), self.seq().items.end(),
                                      [&](const value& v) { return equals(v, *a[0]); }));
}

value list_copy(renderer&, const value& self, call_args& args) {
  no_args(args, "copy");
  return value::list(self.seq().items);
}

value list_pop(renderer&, const value& self, call_args& args) {
  auto a = bind_args(args, {"index"}, "pop");
  auto& items = self.seq().items;
  if (items.empty())
    fail("pop from empty list");
  int64_t i = a[0] == nullptr ? -1 : int_arg(*a[0], "index");
  auto n = static_cast<int64_t>(items.size());
  if (i < 0)
    i += n;
  if (i < 0 || i >= n)
    fail("pop index out of range");
  value out = std::move(items[static_cast<size_t>(i)]);
  items.erase(items.begin() + i);
  return out;
}

value list_clear(renderer&, const value& self, call_args& args) {
  no_args(args, "clear");
  self.seq().items.clear();
  return value::none();
}

const method_entry dict_methods[] = {
    {"items", dict_items}, {"keys", dict_keys}, {"values", dict_values},
    {"get", dict_get},     {"copy", dict_copy},
};
const method_entry list_methods[] = {
    {"index", list_index}, {"count", list_count}, {"copy", list_copy},
    {"pop", list_pop},     {"clear", list_clear},
};
const method_entry tuple_methods[] = {{"index", list_index}, {"count", list_count}};

/// Methods the immutable sandbox refuses (they mutate the object).
constexpr std::string_view unsafe_dict_methods[] = {"clear", "pop", "popitem", "setdefault",
                                                    "update"};
constexpr std::string_view unsafe_list_methods[] = {"append", "reverse", "insert",
                                                    "sort",   "extend",  "remove"};

template <class Table>
const method_entry* find_entry(const Table& table, std::string_view name) {
  for (const auto& e : table)
    if (e.name == name)
      return &e;
  return nullptr;
}

template <class Table>
bool listed(const Table& table, std::string_view name) {
  return std::find(std::begin(table), std::end(table), name) != std::end(table);
}

value unsafe_attribute(const value& obj, const std::string& name) {
  undefined_info info;
  info.text = std::make_shared<const std::string>("access to attribute '" + name + "' of '" +
                                                  type_name(obj) + "' object is unsafe.");
  return value::undefined(std::move(info));
}

value bind(const value& obj, const method_entry& e) {
  return value::object(std::make_shared<bound_method>(obj, e.name, e.fn, e.keywords));
}

} // namespace

value find_method(const value& obj, const std::string& name, bool& found) {
  found = true;
  if (name.size() > 4 && name.compare(0, 2, "__") == 0 &&
      name.compare(name.size() - 2, 2, "__") == 0)
    return unsafe_attribute(obj, name);
  const method_entry* e = nullptr;
  if (obj.is(kind::string)) {
    e = find_entry(str_methods, name);
    if (e == nullptr && listed(other_str_methods, name))
      return value::object(std::make_shared<bound_method>(obj, name, nullptr));
  } else if (obj.is(kind::mapping)) {
    e = find_entry(dict_methods, name);
    if (e == nullptr && listed(unsafe_dict_methods, name))
      return unsafe_attribute(obj, name);
  } else if (obj.is(kind::sequence) && obj.seq().kind == seq_kind::list) {
    e = find_entry(list_methods, name);
    if (e == nullptr && listed(unsafe_list_methods, name))
      return unsafe_attribute(obj, name);
  } else if (obj.is(kind::sequence) && obj.seq().kind == seq_kind::tuple) {
    e = find_entry(tuple_methods, name);
  }
  found = e != nullptr;
  return found ? bind(obj, *e) : value{};
}

// ---------------------------------------------------------------- globals

namespace {

value global_range(renderer&, call_args& args) {
  if (!args.keywords.empty())
    fail("range() takes no keyword arguments");
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3)
    fail("range expected at most 3 arguments, got " + std::to_string(p.size()));
  int64_t start = 0, stop = 0, step = 1;
  if (p.size() == 1) {
    stop = int_arg(p[0], "range");
  } else {
    start = int_arg(p[0], "range");
    stop = int_arg(p[1], "range");
    step = p.size() == 3 ? int_arg(p[2], "range") : 1;
  }
  if (step == 0)
    fail("range() arg 3 must not be zero");
  __int128 span = step > 0 ? __int128{stop} - start : __int128{start} - stop;
  __int128 count = span <= 0 ? 0 : (span - 1) / (step > 0 ? step : -__int128{step}) + 1;
  if (count > 100000)
    fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  return value::range(start, stop, step);
}

/// dict(*args, **kwargs): a mapping or (key, value) pairs, then keywords.
std::shared_ptr<mapping> dict_of(const call_args& args, std::string_view name) {
  auto m = std::make_shared<mapping>();
  if (args.positional.size() > 1)
    fail(std::string(name) + " expected at most 1 argument, got " +
         std::to_string(args.positional.size()));
  if (args.positional.size() == 1) {
    const value& src = args.positional[0];
    if (src.is(kind::mapping)) {
      *m = src.map();
    } else {
      for (const auto& pair : iterate(src)) {
        value_list kv = iterate(pair);
        if (kv.size() != 2)
          fail("dictionary update sequence element has length " + std::to_string(kv.size()) +
               "; 2 is required");
        if (!hashable(kv[0]))
          fail("unhashable type: '" + type_name(kv[0]) + "'");
        m->set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : args.keywords)
    m->set(value::string(std::string(k)), v);
  return m;
}

value global_dict(renderer&, call_args& args) {
  return value::dict(dict_of(args, "dict"));
}

value global_namespace(renderer& r, call_args& args) {
  auto ns = std::make_shared<namespace_object>();
  ns->attrs_ = *dict_of(args, "namespace");
  ns->attrs_.depth = nested_depth(ns->attrs_);
  r.track(ns);
  return value::object(std::move(ns));
}

value global_raise_exception(renderer&, call_args& args) {
  auto a = bind_args(args, {"message"}, "raise_exception");
  if (a[0] == nullptr)
    fail("raise_exception() missing 1 required positional argument: 'message'");
  fail(to_str(*a[0]));
}

/// `fmt` with Python's %f (microseconds, six digits) replaced.
std::string with_microseconds(const std::string& fmt, std::chrono::system_clock::time_point now) {
  auto since_epoch = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch());
  char micros[8];
  std::snprintf(micros, sizeof micros, "%06lld",
                static_cast<long long>(since_epoch.count() % 1000000));
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] == '%' && i + 1 < fmt.size()) {
      if (fmt[i + 1] == 'f')
        out += micros;
      else
        out += fmt.substr(i, 2);
      ++i;
      continue;
    }
    out += fmt[i];
  }
  return out;
}

/// datetime.now().strftime(format): C's strftime plus Python's %f.
value global_strftime_now(renderer& r, call_args& args) {
  auto a = bind_args(args, {"format"}, "strftime_now");
  if (a[0] == nullptr)
    fail("strftime_now() missing 1 required positional argument: 'format'");
  auto now = std::chrono::system_clock::now();
  std::string fmt = with_microseconds(str_arg(*a[0], "strftime() argument 1"), now);
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm local{};
  localtime_r(&t, &local);
  std::string out(fmt.size() * 4 + 64, '\0');
  size_t n = fmt.empty() ? 0 : std::strftime(out.data(), out.size(), fmt.c_str(), &local);
  out.resize(n);
  r.check_size(out.size());
  return value::string(std::move(out));
}

struct global_entry {
  std::string_view name;
  function_fn fn;
};

constexpr global_entry globals[] = {
    {"range", global_range},
    {"dict", global_dict},
    {"namespace", global_namespace},
    {"raise_exception", global_raise_exception},
    {"strftime_now", global_strftime_now},
};

} // namespace

value find_global(std::string_view name) {
  for (const auto& g : globals)
    if (g.name == name)
      return value::object(std::make_shared<builtin_function>(std::string(name), g.fn));
  return {};
}

bool is_unsupported_global(std::string_view name) {
  return name == "lipsum" || name == "cycler" || name == "joiner";
}

} // namespace troupe::models::jinja
