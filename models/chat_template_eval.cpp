// The chat template renderer: walks the tree with jinja2's scoping. The
// template, each for-loop iteration, each macro call and each block body
// ({% set x %}, {% generation %}) is a scope; `if` is not. Lookups walk
// the scopes outwards to the render variables, then the globals.
#include "models/chat_template_detail.hpp"

#include <algorithm>

namespace troupe::models::jinja {

value* scope::find(int symbol) {
  for (auto& [s, v] : vars)
    if (s == symbol)
      return &v;
  return nullptr;
}

void scope::set(int symbol, value v) {
  if (value* old = find(symbol)) {
    *old = std::move(v);
    return;
  }
  vars.emplace_back(symbol, std::move(v));
}

namespace {

/// Statements and expressions evaluated inside each other, macro calls
/// included: bounds the C++ stack a render uses.
constexpr uint32_t max_render_nesting = 2000;

class nesting_scope {
public:
  explicit nesting_scope(uint32_t& n) : n_(n) {
    if (++n_ > max_render_nesting) {
      --n_;
      fail("the template nests deeper than " + std::to_string(max_render_nesting) +
               " statements and expressions while rendering",
           errc::out_of_range);
    }
  }
  ~nesting_scope() { --n_; }
  nesting_scope(const nesting_scope&) = delete;
  nesting_scope& operator=(const nesting_scope&) = delete;

private:
  uint32_t& n_;
};

/// Makes `child` the current scope until the guard ends.
class scope_guard {
public:
  scope_guard(std::shared_ptr<scope>& current, std::shared_ptr<scope> child)
      : current_(current), saved_(std::exchange(current, std::move(child))) {}
  ~scope_guard() { current_ = std::move(saved_); }
  scope_guard(const scope_guard&) = delete;
  scope_guard& operator=(const scope_guard&) = delete;

private:
  std::shared_ptr<scope>& current_;
  std::shared_ptr<scope> saved_;
};

std::shared_ptr<scope> child_of(const std::shared_ptr<scope>& parent) {
  auto s = std::make_shared<scope>();
  s->parent = parent;
  return s;
}

} // namespace

renderer::renderer(const program& p, const chat_template_limits& limits)
    : program_(p), limits_(limits) {}

renderer::~renderer() {
  // A macro lives in the scope it captured, a namespace may hold itself:
  // break those cycles so that the render's values are freed.
  for (auto& s : closures_) {
    s->vars.clear();
    s->parent.reset();
  }
  for (auto& o : tracked_)
    o->release();
}

std::string renderer::run(const nlohmann::ordered_json& variables) {
  scope_ = std::make_shared<scope>();
  for (const auto& [name, v] : variables.items()) {
    auto it = program_.symbol_ids.find(name);
    if (it != program_.symbol_ids.end())
      scope_->set(it->second, from_json(v));
  }
  std::string out;
  out_ = &out;
  exec(program_.root);
  return out;
}

void renderer::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    fail("the rendered text exceeds " + std::to_string(limits_.max_output_bytes) +
             " bytes (chat_template_limits::max_output_bytes)",
         errc::out_of_range);
}

void renderer::count_iterations(size_t n) {
  iterations_ += n;
  if (iterations_ > limits_.max_loop_iterations)
    fail("the template ran more than " + std::to_string(limits_.max_loop_iterations) +
             " loop iterations (chat_template_limits::max_loop_iterations)",
         errc::out_of_range);
}

// ---------------------------------------------------------------- statements

flow renderer::exec(const body& b) {
  for (const auto& s : b) {
    flow f = exec(*s);
    if (f != flow::normal)
      return f;
  }
  return flow::normal;
}

flow renderer::exec(const stmt& s) {
  try {
    nesting_scope nesting(nesting_);
    switch (s.kind) {
    case stmt_kind::if_:
      return exec_if(s);
    case stmt_kind::for_:
      return exec_for(s);
    case stmt_kind::break_:
      return flow::break_;
    case stmt_kind::continue_:
      return flow::continue_;
    default:
      exec_simple(s);
      return flow::normal;
    }
  } catch (failure& f) {
    if (f.line == 0)
      f.line = s.line;
    throw;
  }
}

void renderer::exec_simple(const stmt& s) {
  switch (s.kind) {
  case stmt_kind::text:
    out_->append(s.text);
    break;
  case stmt_kind::print:
    exec_print(s);
    break;
  case stmt_kind::set:
    assign(s.target, eval(*s.exprs[0]));
    break;
  case stmt_kind::set_attribute:
    exec_set_attribute(s);
    break;
  case stmt_kind::set_block:
    exec_set_block(s);
    break;
  case stmt_kind::macro:
    exec_macro(s);
    break;
  case stmt_kind::block:
    out_->append(capture(s.statements));
    break;
  case stmt_kind::filter_block:
    exec_filter_block(s);
    break;
  case stmt_kind::call_block:
    exec_call_block(s);
    break;
  default:
    fail("statement without a handler", errc::internal);
  }
  check_size(out_->size());
}

void renderer::exec_print(const stmt& s) {
  for (const auto& e : s.exprs) {
    print_root_ = e.get();
    value v = eval(*e);
    append_str(*out_, v);
    check_size(out_->size());
  }
}

flow renderer::exec_if(const stmt& s) {
  for (const auto& branch : s.branches)
    if (truthy(eval(*branch.condition)))
      return exec(branch.statements);
  return exec(s.else_statements);
}

loop_feed::loop_feed(value_list source, keep_fn keep)
    : source_(std::move(source)), keep_(std::move(keep)), depth_(nested_depth(source_)) {}

bool loop_feed::has(size_t i) {
  while (kept_.size() <= i && next_ < source_.size()) {
    const value& item = source_[next_++];
    if (!keep_ || keep_(item))
      kept_.push_back(item);
  }
  return kept_.size() > i;
}

size_t loop_feed::count() {
  has(source_.size());
  return kept_.size();
}

std::shared_ptr<loop_feed> renderer::loop_items(const stmt& s) {
  value_list items = iterate(eval(*s.exprs[0]));
  if (s.exprs[1] == nullptr)
    return std::make_shared<loop_feed>(std::move(items), nullptr);
  // The filter sees the loop's enclosing scope (and the namespaces the body
  // changes), with the target bound, in a scope of its own.
  auto filter_scope = child_of(scope_);
  closures_.push_back(filter_scope); // a stored loop object may reach it again
  auto keep = [this, &s, filter_scope](const value& item) {
    count_iterations(1);
    scope_guard guard(scope_, filter_scope);
    scope_->vars.clear();
    assign(s.target, item);
    return truthy(eval(*s.exprs[1]));
  };
  return std::make_shared<loop_feed>(std::move(items), keep);
}

flow renderer::exec_for(const stmt& s) {
  auto items = loop_items(s);
  if (!items->has(0)) {
    scope_guard guard(scope_, child_of(scope_));
    exec(s.else_statements);
    return flow::normal;
  }
  run_iterations(s, items);
  return flow::normal;
}

void renderer::run_iterations(const stmt& s, const std::shared_ptr<loop_feed>& items) {
  auto loop = make_loop(items);
  value loop_value = value::object(loop);
  std::shared_ptr<scope> outer = scope_;
  for (size_t i = 0; items->has(i); ++i) {
    count_iterations(1);
    advance_loop(*loop, i);
    scope_guard guard(scope_, child_of(outer)); // a fresh scope per iteration
    if (program_.loop_symbol >= 0)
      scope_->set(program_.loop_symbol, loop_value);
    assign(s.target, items->at(i));
    if (exec(s.statements) == flow::break_)
      break;
  }
}

void renderer::assign(const target& t, const value& v) {
  if (!t.unpack) {
    scope_->set(t.symbol, v);
    return;
  }
  value_list items = iterate(v);
  if (items.size() != t.items.size())
    fail(items.size() > t.items.size()
             ? "too many values to unpack (expected " + std::to_string(t.items.size()) + ")"
             : "not enough values to unpack (expected " + std::to_string(t.items.size()) +
                   ", got " + std::to_string(items.size()) + ")");
  for (size_t i = 0; i < items.size(); ++i)
    assign(t.items[i], items[i]);
}

value* renderer::lookup(int symbol) {
  for (scope* s = scope_.get(); s != nullptr; s = s->parent.get())
    if (value* v = s->find(symbol))
      return v;
  return nullptr;
}

void renderer::set_namespace_attribute(const stmt& s, value v) {
  value* ns = lookup(s.target.symbol);
  if (ns == nullptr || !ns->is(kind::object) || !ns->obj().set_attribute(s.attribute, std::move(v)))
    fail("cannot assign attribute on non-namespace object");
}

void renderer::exec_set_attribute(const stmt& s) {
  set_namespace_attribute(s, eval(*s.exprs[0]));
}

void renderer::exec_set_block(const stmt& s) {
  value v = value::string(capture(s.statements));
  if (s.filters != nullptr)
    v = eval_filter(*s.filters, &v);
  if (s.attribute.empty())
    assign(s.target, v);
  else
    set_namespace_attribute(s, std::move(v));
}

void renderer::exec_filter_block(const stmt& s) {
  value body = value::string(capture(s.statements));
  append_str(*out_, eval_filter(*s.filters, &body));
}

void renderer::exec_call_block(const stmt& s) {
  const expr& call = *s.exprs[0];
  value callee = eval(*call.operands[0]);
  call_args args;
  eval_args(call, args);
  closures_.push_back(scope_);
  args.keywords.emplace_back("caller", make_macro(*s.macro, scope_));
  append_str(*out_, call_value(callee, args));
}

void renderer::exec_macro(const stmt& s) {
  closures_.push_back(scope_);
  scope_->set(s.macro->symbol, make_macro(*s.macro, scope_));
}

std::string renderer::capture(const body& b) {
  std::string buf;
  std::string* saved = std::exchange(out_, &buf);
  try {
    scope_guard guard(scope_, child_of(scope_));
    exec(b);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

// ---------------------------------------------------------------- macros

namespace {

/// Binds a macro call's arguments into `frame` as jinja2's Macro.__call__
/// does; returns the parameters left for their defaults.
std::vector<size_t> bind_macro_args(const macro_def& m, call_args& args, scope& frame) {
  size_t given = std::min(args.positional.size(), m.params.size());
  for (size_t i = 0; i < given; ++i)
    frame.set(m.params[i], args.positional[i]);
  std::vector<size_t> missing;
  for (size_t i = given; i < m.params.size(); ++i) {
    auto it = std::find_if(args.keywords.begin(), args.keywords.end(),
                           [&](const auto& kw) { return kw.first == m.param_names[i]; });
    if (it == args.keywords.end()) {
      missing.push_back(i);
      continue;
    }
    frame.set(m.params[i], it->second);
    args.keywords.erase(it);
  }
  if (m.catch_caller) {
    auto it = std::find_if(args.keywords.begin(), args.keywords.end(),
                           [](const auto& kw) { return kw.first == "caller"; });
    frame.set(m.caller_symbol,
              it == args.keywords.end() ? value::undefined_hint("No caller defined") : it->second);
    if (it != args.keywords.end())
      args.keywords.erase(it);
  }
  auto extra = std::make_shared<mapping>();
  for (const auto& [k, v] : args.keywords) {
    if (!m.catch_kwargs)
      fail("macro '" + m.name + "' takes no keyword argument '" + std::string(k) + "'");
    extra->set(value::string(std::string(k)), v);
  }
  if (m.catch_kwargs)
    frame.set(m.kwargs_symbol, value::dict(std::move(extra)));
  if (args.positional.size() > m.params.size() && !m.catch_varargs)
    fail("macro '" + m.name + "' takes not more than " + std::to_string(m.params.size()) +
         " argument(s)");
  if (m.catch_varargs)
    frame.set(m.varargs_symbol,
              value::list(value_list(args.positional.begin() + static_cast<std::ptrdiff_t>(given),
                                     args.positional.end()),
                          seq_kind::tuple));
  return missing;
}

} // namespace

std::string renderer::call_macro(const macro_def& m, const std::shared_ptr<scope>& closure,
                                 call_args& args) {
  if (depth_ >= limits_.max_call_depth)
    fail("macro calls nest deeper than " + std::to_string(limits_.max_call_depth) +
             " (chat_template_limits::max_call_depth)",
         errc::out_of_range);
  ++depth_;
  struct depth_guard {
    uint32_t& d;
    ~depth_guard() { --d; }
  } guard{depth_};
  auto frame = child_of(closure);
  std::vector<size_t> missing = bind_macro_args(m, args, *frame);
  scope_guard in_macro(scope_, frame);
  // A default reads the parameters before it; one not bound yet is
  // undefined there, as in jinja2 (not the variable of the enclosing scope).
  for (size_t i : missing) {
    undefined_info info;
    info.why = undefined_info::reason::name;
    info.text = std::make_shared<const std::string>(m.param_names[i]);
    frame->set(m.params[i], value::undefined(std::move(info)));
  }
  size_t first_default = m.params.size() - m.defaults.size();
  for (size_t i : missing)
    frame->set(m.params[i], i >= first_default
                                ? eval(*m.defaults[i - first_default])
                                : value::undefined_hint("parameter '" + m.param_names[i] +
                                                        "' was not provided"));
  std::string buf;
  std::string* saved = std::exchange(out_, &buf);
  try {
    exec(m.statements);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

// ---------------------------------------------------------------- expressions

value renderer::eval(const expr& e) {
  try {
    nesting_scope nesting(nesting_);
    if (e.fold && !lenient_)
      return eval_folded(e);
    return eval_inner(e);
  } catch (failure& f) {
    if (f.line == 0)
      f.line = e.line;
    throw;
  }
}

value renderer::eval_folded(const expr& e) {
  value folded;
  bool ok = true;
  lenient_ = true;
  try {
    folded = eval_inner(e);
  } catch (const failure&) {
    ok = false; // jinja2 leaves it to run time
  }
  lenient_ = false;
  if (ok && (&e == print_root_ || safe_repr(folded)))
    return folded;
  return eval_inner(e);
}

value renderer::eval_inner(const expr& e) {
  switch (e.kind) {
  case expr_kind::constant:
    return e.constant;
  case expr_kind::name:
    return eval_name(e);
  case expr_kind::list:
  case expr_kind::tuple:
  case expr_kind::dict:
    return eval_collection(e);
  case expr_kind::attribute:
    return get_attribute(eval(*e.operands[0]), e.constant.str());
  case expr_kind::item: {
    value subject = eval(*e.operands[0]);
    const expr& key = *e.operands[1];
    return key.kind == expr_kind::slice ? eval_slice(key, subject) : get_item(subject, eval(key));
  }
  case expr_kind::slice:
    fail("a slice outside a subscript", errc::internal);
  case expr_kind::call:
    return eval_call(e);
  case expr_kind::filter:
    return eval_filter(e, nullptr);
  case expr_kind::test:
    return eval_test(e);
  case expr_kind::not_:
    return value::boolean(!truthy(eval(*e.operands[0])));
  case expr_kind::neg:
    return negate(eval(*e.operands[0]));
  case expr_kind::pos:
    return positive(eval(*e.operands[0]));
  case expr_kind::binary:
    return binary(e.op, eval(*e.operands[0]), eval(*e.operands[1]), *this);
  case expr_kind::compare:
    return eval_compare(e);
  case expr_kind::and_:
  case expr_kind::or_: {
    value left = eval(*e.operands[0]);
    bool short_circuit = truthy(left) == (e.kind == expr_kind::or_);
    return short_circuit ? left : eval(*e.operands[1]);
  }
  case expr_kind::condition:
    return eval_condition(e);
  case expr_kind::concat: {
    value_list parts;
    for (const auto& p : e.operands)
      parts.push_back(eval(*p));
    return concat(parts, *this);
  }
  }
  return {};
}

void renderer::not_constant() const {
  if (lenient_)
    throw failure{errc::internal, "not a constant expression", 0};
}

value renderer::eval_name(const expr& e) {
  not_constant();
  if (const value* v = lookup(e.symbol))
    return *v;
  const value& global = program_.globals[static_cast<size_t>(e.symbol)];
  if (!global.is_undefined())
    return global;
  undefined_info info;
  info.why = undefined_info::reason::name;
  info.text = std::make_shared<const std::string>(program_.symbols[static_cast<size_t>(e.symbol)]);
  return value::undefined(std::move(info));
}

value renderer::eval_collection(const expr& e) {
  if (e.kind != expr_kind::dict) {
    value_list items;
    items.reserve(e.operands.size());
    for (const auto& item : e.operands)
      items.push_back(eval(*item));
    return value::list(std::move(items),
                       e.kind == expr_kind::tuple ? seq_kind::tuple : seq_kind::list);
  }
  auto m = std::make_shared<mapping>();
  for (size_t i = 0; i + 1 < e.operands.size(); i += 2) {
    value key = eval(*e.operands[i]);
    if (!hashable(key))
      fail("unhashable type: '" + type_name(key) + "'");
    m->set(std::move(key), eval(*e.operands[i + 1]));
  }
  return value::dict(std::move(m));
}

value renderer::eval_condition(const expr& e) {
  if (truthy(eval(*e.operands[0])))
    return eval(*e.operands[1]);
  if (e.operands[2] != nullptr)
    return eval(*e.operands[2]);
  return value::undefined_hint("the inline if-expression on line " + std::to_string(e.line) +
                               " evaluated to false and no else section was defined.");
}

void renderer::eval_args(const expr& e, call_args& out) {
  out.positional.reserve(e.positional.size());
  for (const auto& p : e.positional)
    out.positional.push_back(eval(*p));
  if (e.star_args != nullptr)
    for (auto& v : iterate(eval(*e.star_args)))
      out.positional.push_back(std::move(v));
  for (const auto& k : e.keywords)
    out.keywords.emplace_back(k.name, eval(*k.value));
  if (e.star_kwargs != nullptr)
    add_star_kwargs(eval(*e.star_kwargs), out);
}

void renderer::add_star_kwargs(value kwargs, call_args& out) {
  if (!kwargs.is(kind::mapping))
    fail("argument after ** must be a mapping, not " + type_name(kwargs));
  for (const auto& [k, v] : kwargs.map().entries) {
    if (!k.is(kind::string))
      fail("keywords must be strings");
    for (const auto& existing : out.keywords)
      if (existing.first == k.str())
        fail("got multiple values for keyword argument '" + k.str() + "'");
    out.keywords.emplace_back(k.str(), v);
  }
  out.holders.push_back(std::move(kwargs));
}

value renderer::call_value(const value& callee, call_args& args) {
  if (callee.is(kind::object) && callee.obj().callable())
    return callee.obj().call(*this, args);
  if (callee.is_undefined())
    fail_undefined(callee);
  fail("'" + type_name(callee) + "' object is not callable");
}

value renderer::eval_call(const expr& e) {
  not_constant();
  value callee = eval(*e.operands[0]);
  call_args args;
  eval_args(e, args);
  return call_value(callee, args);
}

value renderer::eval_filter(const expr& e, const value* seed) {
  const expr* inner = e.operands[0].get();
  value subject = inner == nullptr  ? *seed
                  : seed != nullptr ? eval_filter(*inner, seed)
                                    : eval(*inner);
  if (e.filter == nullptr)
    fail("No filter named '" + e.name + "' found.");
  if (filter_takes_context(e.name))
    not_constant();
  call_args args;
  eval_args(e, args);
  return e.filter(*this, subject, args);
}

value renderer::eval_test(const expr& e) {
  value subject = eval(*e.operands[0]);
  if (e.test == nullptr)
    fail("No test named '" + e.name + "' found.");
  call_args args;
  eval_args(e, args);
  return value::boolean(e.test(*this, subject, args));
}

namespace {

bool compare(cmpop op, const value& a, const value& b) {
  switch (op) {
  case cmpop::eq:
    return equals(a, b);
  case cmpop::ne:
    return !equals(a, b);
  case cmpop::lt:
    return less(a, b, "<");
  case cmpop::gt:
    return less(b, a, ">");
  case cmpop::le:
    return !less(b, a, "<=");
  case cmpop::ge:
    return !less(a, b, ">=");
  case cmpop::in:
    return contains(b, a);
  case cmpop::not_in:
    return !contains(b, a);
  }
  return false;
}

} // namespace

value renderer::eval_compare(const expr& e) {
  value left = eval(*e.operands[0]);
  for (size_t i = 0; i < e.compare_ops.size(); ++i) {
    value right = eval(*e.operands[i + 1]);
    if (!compare(e.compare_ops[i], left, right))
      return value::boolean(false);
    left = std::move(right);
  }
  return value::boolean(true);
}

value renderer::eval_slice(const expr& e, const value& subject) {
  value bounds[3];
  const value* present[3] = {nullptr, nullptr, nullptr};
  for (size_t i = 0; i < 3; ++i) {
    if (e.operands[i] == nullptr)
      continue;
    bounds[i] = eval(*e.operands[i]);
    if (!bounds[i].is(kind::none))
      present[i] = &bounds[i];
  }
  return get_slice(subject, present[0], present[1], present[2], lenient_);
}

value renderer::apply_filter(std::string_view name, const value& subject, call_args& args) {
  filter_fn f = find_filter(name);
  if (f == nullptr)
    fail(jinja_has_filter(name) ? "unsupported filter '" + std::string(name) + "'"
                                : "No filter named '" + std::string(name) + "'.",
         jinja_has_filter(name) ? errc::unsupported : errc::invalid_argument);
  return f(*this, subject, args);
}

bool renderer::apply_test(std::string_view name, const value& subject, call_args& args) {
  test_fn t = find_test(name);
  if (t == nullptr)
    fail("No test named '" + std::string(name) + "'.");
  return t(*this, subject, args);
}

} // namespace troupe::models::jinja
