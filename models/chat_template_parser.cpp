// The chat template parser: jinja2's grammar (parser.py) over the lexer's
// tokens, building the tree of chat_template_detail.hpp. Filters and tests
// are resolved here, so a name outside the subset fails at parse time.
#include "models/chat_template_detail.hpp"

#include <algorithm>
#include <unordered_map>

namespace troupe::models::jinja {

namespace {

/// jinja2's statements that this engine does not run.
constexpr std::string_view unsupported_statements[] = {"block", "extends", "include",   "import",
                                                       "from",  "with",    "autoescape"};

/// Deepest nesting of expressions or of statements (jinja2 itself fails
/// near 100 of either: Python's recursion and indentation limits).
constexpr int max_nesting = 64;

using names = std::initializer_list<std::string_view>;

class parser {
public:
  parser(std::vector<token> tokens, std::string name) : toks_(std::move(tokens)) {
    prog_ = std::make_shared<program>();
    prog_->name = std::move(name);
  }

  std::shared_ptr<program> run() {
    prog_->root = subparse({});
    check_unresolved();
    prog_->symbol_ids = std::move(symbols_);
    return prog_;
  }

private:
  // ------------------------------------------------------------ tokens

  const token& cur() const { return toks_[pos_]; }
  const token& look() const { return toks_[std::min(pos_ + 1, toks_.size() - 1)]; }
  token next() {
    token t = cur();
    if (pos_ + 1 < toks_.size())
      ++pos_;
    return t;
  }
  bool is_op(std::string_view op) const { return cur().type == tok::op && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == tok::name && cur().text == n; }
  bool is_any_name(names ns) const {
    return cur().type == tok::name && std::find(ns.begin(), ns.end(), cur().text) != ns.end();
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op))
      return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n))
      return false;
    next();
    return true;
  }

  [[noreturn]] void error(std::string message, errc code = errc::parse_error) {
    throw failure{code, std::move(message), cur().line};
  }

  std::string describe(const token& t) const {
    switch (t.type) {
    case tok::eof:
      return "end of template";
    case tok::block_end:
      return "end of statement block";
    case tok::var_end:
      return "end of print statement";
    case tok::block_begin:
      return "begin of statement block";
    case tok::var_begin:
      return "begin of print statement";
    case tok::string:
      return "string";
    case tok::integer:
      return "integer";
    case tok::floating:
      return "float";
    default:
      return t.text;
    }
  }

  [[noreturn]] void unexpected(std::string_view expected) {
    if (cur().type == tok::eof)
      error("unexpected end of template, expected '" + std::string(expected) + "'.");
    error("expected token '" + std::string(expected) + "', got '" + describe(cur()) + "'");
  }

  void expect_op(std::string_view op) {
    if (!skip_op(op))
      unexpected(op);
  }
  void expect_type(tok type, std::string_view what) {
    if (cur().type != type)
      unexpected(what);
    next();
  }
  std::string expect_name() {
    if (cur().type != tok::name)
      unexpected("name");
    return next().text;
  }
  void expect_keyword(std::string_view n) {
    if (!skip_name(n))
      unexpected(n);
  }

  int symbol(const std::string& name) {
    auto [it, inserted] = symbols_.emplace(name, static_cast<int>(prog_->symbols.size()));
    if (inserted)
      prog_->symbols.push_back(name);
    return it->second;
  }

  struct depth_guard {
    explicit depth_guard(parser& p) : p_(p) {
      if (++p_.depth_ > max_nesting)
        p_.error("template nesting is too deep (more than " + std::to_string(max_nesting) + ")");
    }
    ~depth_guard() { --p_.depth_; }
    parser& p_;
  };

  /// jinja2 checks filter and test names when it compiles the template,
  /// except in a "soft" frame (the tests and bodies of an if, a conditional
  /// expression), where an unknown name fails only if it runs. Loop, macro
  /// and block bodies start hard again.
  struct soft_scope {
    soft_scope(parser& p, bool soft) : p_(p), saved_(std::exchange(p.soft_, soft)) {}
    ~soft_scope() { p_.soft_ = saved_; }
    parser& p_;
    bool saved_;
  };

  struct unresolved_name {
    std::string what; // "filter" or "test"
    std::string name;
    int line;
    bool soft;
  };

  /// A filter / test name neither this engine nor jinja2 knows: refused
  /// now unless it stands in a soft frame (then it fails when evaluated).
  void note_unknown(std::string what, const std::string& name, int line) {
    unresolved_.push_back(unresolved_name{std::move(what), name, line, soft_});
  }

  void check_unresolved() const {
    for (const auto& u : unresolved_)
      if (!u.soft)
        throw failure{errc::parse_error, "no " + u.what + " named '" + u.name + "'", u.line};
  }

  expr_ptr node(expr_kind k, int line) {
    auto e = std::make_unique<expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ------------------------------------------------------------ statements

  body subparse(names ends) {
    body out;
    while (cur().type != tok::eof) {
      const token& t = cur();
      if (t.type == tok::data) {
        append_text(out, next());
      } else if (t.type == tok::var_begin) {
        next();
        auto s = std::make_unique<stmt>();
        s->kind = stmt_kind::print;
        s->line = cur().line;
        s->exprs.push_back(parse_tuple(false, true, {}, false));
        expect_type(tok::var_end, "end of print statement");
        out.push_back(std::move(s));
      } else {
        next();
        if (ends.size() > 0 && is_any_name(ends))
          return out;
        out.push_back(parse_statement());
        expect_type(tok::block_end, "end of statement block");
      }
    }
    return out;
  }

  void append_text(body& out, const token& t) {
    if (!out.empty() && out.back()->kind == stmt_kind::text) {
      out.back()->text += t.text;
      return;
    }
    auto s = std::make_unique<stmt>();
    s->line = t.line;
    s->text = t.text;
    out.push_back(std::move(s));
  }

  /// jinja2's parse_statements: the body up to one of `ends`.
  body parse_statements(names ends, bool drop_needle) {
    skip_op(":");
    expect_type(tok::block_end, "end of statement block");
    body b = subparse(ends);
    if (cur().type == tok::eof) {
      std::string expected;
      for (auto e : ends)
        expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
      error("unexpected end of template, expected " + expected + ".");
    }
    if (drop_needle)
      next();
    return b;
  }

  stmt_ptr parse_statement() {
    depth_guard guard(*this);
    if (cur().type != tok::name)
      error("tag name expected");
    const std::string word = cur().text;
    if (word == "if")
      return parse_if();
    if (word == "for")
      return parse_for();
    if (word == "set")
      return parse_set();
    if (word == "macro")
      return parse_macro();
    if (word == "print")
      return parse_print();
    if (word == "generation")
      return parse_generation();
    if (word == "filter")
      return parse_filter_block();
    if (word == "call")
      return parse_call_block();
    if (word == "break" || word == "continue")
      return parse_loop_control();
    for (auto u : unsupported_statements)
      if (word == u)
        error("unsupported statement '" + word + "'", errc::unsupported);
    error("unknown tag '" + word + "'");
  }

  stmt_ptr make_stmt(stmt_kind k) {
    auto s = std::make_unique<stmt>();
    s->kind = k;
    s->line = cur().line;
    return s;
  }

  stmt_ptr parse_if() {
    auto s = make_stmt(stmt_kind::if_);
    next();
    soft_scope soft(*this, true);
    while (true) {
      if_branch branch;
      branch.condition = parse_tuple(false, false, {}, false);
      branch.statements = parse_statements({"elif", "else", "endif"}, false);
      s->branches.push_back(std::move(branch));
      std::string word = next().text;
      if (word == "elif")
        continue;
      if (word == "else")
        s->else_statements = parse_statements({"endif"}, true);
      return s;
    }
  }

  stmt_ptr parse_for() {
    auto s = make_stmt(stmt_kind::for_);
    next();
    s->target = parse_target({"in"});
    expect_keyword("in");
    s->exprs.push_back(parse_tuple(false, false, {"recursive"}, false));
    if (skip_name("if")) {
      soft_scope hard(*this, false);
      s->exprs.push_back(parse_expression(true));
    } else {
      s->exprs.push_back(nullptr);
    }
    if (is_name("recursive"))
      error("unsupported statement 'for ... recursive'", errc::unsupported);
    soft_scope hard(*this, false);
    ++loop_depth_;
    s->statements = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (next().text == "else")
      s->else_statements = parse_statements({"endfor"}, true);
    return s;
  }

  stmt_ptr parse_loop_control() {
    auto s = make_stmt(next().text == "break" ? stmt_kind::break_ : stmt_kind::continue_);
    if (loop_depth_ == 0)
      error(std::string("'") + (s->kind == stmt_kind::break_ ? "break" : "continue") +
            "' outside loop");
    return s;
  }

  stmt_ptr parse_set() {
    auto s = make_stmt(stmt_kind::set);
    next();
    if (cur().type == tok::name && look().type == tok::op && look().text == ".") {
      s->target.symbol = symbol(next().text);
      next();
      s->attribute = expect_name();
    } else {
      s->target = parse_target({});
    }
    if (skip_op("=")) {
      s->exprs.push_back(parse_tuple(false, true, {}, false));
    } else {
      soft_scope hard(*this, false);
      s->kind = stmt_kind::set_block;
      s->filters = parse_filter(nullptr);
      s->statements = parse_statements({"endset"}, true);
    }
    if (!s->attribute.empty() && s->kind == stmt_kind::set)
      s->kind = stmt_kind::set_attribute;
    return s;
  }

  /// An assignment target: a name or a (nested) tuple of names.
  target parse_target(names extra_ends) {
    auto e = parse_tuple(true, true, extra_ends, false);
    return to_target(*e);
  }

  target to_target(const expr& e) {
    target t;
    if (e.kind == expr_kind::name) {
      t.symbol = e.symbol;
      return t;
    }
    if (e.kind != expr_kind::tuple)
      error(e.kind == expr_kind::constant ? "can't assign to 'const'"
                                          : "can't assign to this expression");
    t.unpack = true;
    for (const auto& item : e.operands)
      t.items.push_back(to_target(*item));
    return t;
  }

  stmt_ptr parse_macro() {
    auto s = make_stmt(stmt_kind::macro);
    next();
    auto m = std::make_unique<macro_def>();
    m->name = expect_name();
    m->symbol = symbol(m->name);
    soft_scope hard(*this, false);
    parse_signature(*m);
    macros_.push_back(m.get());
    int outer_loops = std::exchange(loop_depth_, 0);
    m->statements = parse_statements({"endmacro"}, true);
    loop_depth_ = outer_loops;
    macros_.pop_back();
    finish_macro(*m);
    s->macro = std::move(m);
    return s;
  }

  void parse_signature(macro_def& m) {
    expect_op("(");
    while (!is_op(")")) {
      if (!m.params.empty())
        expect_op(",");
      std::string name = expect_name();
      m.param_names.push_back(name);
      m.params.push_back(symbol(name));
      if (skip_op("="))
        m.defaults.push_back(parse_expression(true));
      else if (!m.defaults.empty())
        error("non-default argument follows default argument");
    }
    expect_op(")");
  }

  stmt_ptr parse_print() {
    auto s = make_stmt(stmt_kind::print);
    next();
    while (cur().type != tok::block_end) {
      if (!s->exprs.empty())
        expect_op(",");
      s->exprs.push_back(parse_expression(true));
    }
    return s;
  }

  stmt_ptr parse_call_block() {
    auto s = make_stmt(stmt_kind::call_block);
    next();
    auto caller = std::make_unique<macro_def>();
    caller->name = "caller";
    soft_scope hard(*this, false);
    if (is_op("("))
      parse_signature(*caller);
    s->exprs.push_back(parse_expression(true));
    if (s->exprs[0]->kind != expr_kind::call)
      error("expected call");
    macros_.push_back(caller.get());
    int outer_loops = std::exchange(loop_depth_, 0);
    caller->statements = parse_statements({"endcall"}, true);
    loop_depth_ = outer_loops;
    macros_.pop_back();
    finish_macro(*caller);
    s->macro = std::move(caller);
    return s;
  }

  /// The symbols of the special names a macro body uses.
  void finish_macro(macro_def& m) {
    if (m.catch_varargs)
      m.varargs_symbol = symbol("varargs");
    if (m.catch_kwargs)
      m.kwargs_symbol = symbol("kwargs");
    if (m.catch_caller)
      m.caller_symbol = symbol("caller");
  }

  stmt_ptr parse_filter_block() {
    auto s = make_stmt(stmt_kind::filter_block);
    next();
    soft_scope hard(*this, false);
    s->filters = parse_filter(nullptr, true);
    s->statements = parse_statements({"endfilter"}, true);
    return s;
  }

  stmt_ptr parse_generation() {
    auto s = make_stmt(stmt_kind::block);
    next();
    soft_scope hard(*this, false);
    int outer_loops = std::exchange(loop_depth_, 0);
    s->statements = parse_statements({"endgeneration"}, true);
    loop_depth_ = outer_loops;
    return s;
  }

  // ------------------------------------------------------------ expressions

  bool is_tuple_end(names extra_ends) const {
    if (cur().type == tok::var_end || cur().type == tok::block_end ||
        (cur().type == tok::op && cur().text == ")"))
      return true;
    return extra_ends.size() > 0 && is_any_name(extra_ends);
  }

  expr_ptr parse_tuple(bool simplified, bool with_condexpr, names extra_ends,
                       bool explicit_parentheses) {
    int line = cur().line;
    std::vector<expr_ptr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty())
        expect_op(",");
      if (is_tuple_end(extra_ends))
        break;
      items.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (!is_op(","))
        break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty())
        return std::move(items.front());
      if (!explicit_parentheses)
        error("Expected an expression, got '" + describe(cur()) + "'");
    }
    auto e = node(expr_kind::tuple, line);
    e->operands = std::move(items);
    return e;
  }

  expr_ptr parse_expression(bool with_condexpr) {
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  expr_ptr parse_condexpr() {
    int line = cur().line;
    size_t first_unresolved = unresolved_.size();
    auto e = parse_or();
    while (skip_name("if")) {
      soft_scope soft(*this, true); // jinja2 compiles a conditional expression in a soft frame
      for (size_t i = first_unresolved; i < unresolved_.size(); ++i)
        unresolved_[i].soft = true;
      auto c = node(expr_kind::condition, line);
      auto test = parse_or();
      auto otherwise = skip_name("else") ? parse_condexpr() : nullptr;
      c->operands.push_back(std::move(test));
      c->operands.push_back(std::move(e));
      c->operands.push_back(std::move(otherwise));
      e = std::move(c);
      line = cur().line;
    }
    return e;
  }

  expr_ptr binary_node(expr_kind k, int line, expr_ptr left, expr_ptr right) {
    auto e = node(k, line);
    e->operands.push_back(std::move(left));
    e->operands.push_back(std::move(right));
    return e;
  }

  expr_ptr parse_or() {
    int line = cur().line;
    auto e = parse_and();
    while (skip_name("or"))
      e = binary_node(expr_kind::or_, line, std::move(e), parse_and());
    return e;
  }

  expr_ptr parse_and() {
    int line = cur().line;
    auto e = parse_not();
    while (skip_name("and"))
      e = binary_node(expr_kind::and_, line, std::move(e), parse_not());
    return e;
  }

  expr_ptr parse_not() {
    if (is_name("not")) {
      int line = next().line;
      depth_guard guard(*this);
      auto e = node(expr_kind::not_, line);
      e->operands.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  bool compare_op(cmpop& op) {
    static const std::pair<std::string_view, cmpop> ops[] = {{"==", cmpop::eq}, {"!=", cmpop::ne},
                                                             {"<", cmpop::lt},  {"<=", cmpop::le},
                                                             {">", cmpop::gt},  {">=", cmpop::ge}};
    if (cur().type == tok::op)
      for (auto [text, o] : ops)
        if (cur().text == text) {
          next();
          op = o;
          return true;
        }
    if (skip_name("in")) {
      op = cmpop::in;
      return true;
    }
    if (is_name("not") && look().type == tok::name && look().text == "in") {
      next();
      next();
      op = cmpop::not_in;
      return true;
    }
    return false;
  }

  expr_ptr parse_compare() {
    int line = cur().line;
    auto first = parse_math1();
    cmpop op;
    if (!compare_op(op))
      return first;
    auto e = node(expr_kind::compare, line);
    e->operands.push_back(std::move(first));
    do {
      e->compare_ops.push_back(op);
      e->operands.push_back(parse_math1());
    } while (compare_op(op));
    return e;
  }

  expr_ptr arith(binop op, int line, expr_ptr left, expr_ptr right) {
    auto e = binary_node(expr_kind::binary, line, std::move(left), std::move(right));
    e->op = op;
    return e;
  }

  expr_ptr parse_math1() {
    int line = cur().line;
    auto e = parse_concat();
    while (is_op("+") || is_op("-")) {
      binop op = next().text == "+" ? binop::add : binop::sub;
      e = arith(op, line, std::move(e), parse_concat());
    }
    return e;
  }

  expr_ptr parse_concat() {
    int line = cur().line;
    auto first = parse_math2();
    if (!is_op("~"))
      return first;
    auto e = node(expr_kind::concat, line);
    e->operands.push_back(std::move(first));
    while (skip_op("~"))
      e->operands.push_back(parse_math2());
    return e;
  }

  expr_ptr parse_math2() {
    static const std::pair<std::string_view, binop> ops[] = {
        {"*", binop::mul}, {"/", binop::div}, {"//", binop::floordiv}, {"%", binop::mod}};
    int line = cur().line;
    auto e = parse_pow();
    while (cur().type == tok::op) {
      auto it = std::find_if(std::begin(ops), std::end(ops),
                             [&](const auto& o) { return o.first == cur().text; });
      if (it == std::end(ops))
        break;
      next();
      e = arith(it->second, line, std::move(e), parse_pow());
    }
    return e;
  }

  expr_ptr parse_pow() {
    int line = cur().line;
    auto e = parse_unary(true);
    while (skip_op("**"))
      e = arith(binop::pow, line, std::move(e), parse_unary(true));
    return e;
  }

  expr_ptr parse_unary(bool with_filter) {
    depth_guard guard(*this);
    int line = cur().line;
    expr_ptr e;
    if (is_op("-") || is_op("+")) {
      e = node(next().text == "-" ? expr_kind::neg : expr_kind::pos, line);
      e->operands.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  expr_ptr constant(value v, int line) {
    auto e = node(expr_kind::constant, line);
    e->constant = std::move(v);
    return e;
  }

  expr_ptr parse_name() {
    const token t = next();
    if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False")
      return constant(value::boolean(t.text[0] == 't' || t.text[0] == 'T'), t.line);
    if (t.text == "none" || t.text == "None")
      return constant(value::none(), t.line);
    if (is_unsupported_global(t.text))
      throw failure{errc::unsupported, "unsupported global '" + t.text + "'", t.line};
    if (!macros_.empty() && t.text == "varargs")
      macros_.back()->catch_varargs = true;
    if (!macros_.empty() && t.text == "kwargs")
      macros_.back()->catch_kwargs = true;
    if (!macros_.empty() && t.text == "caller")
      macros_.back()->catch_caller = true;
    auto e = node(expr_kind::name, t.line);
    e->symbol = symbol(t.text);
    return e;
  }

  expr_ptr parse_primary() {
    depth_guard guard(*this);
    const token& t = cur();
    switch (t.type) {
    case tok::name:
      return parse_name();
    case tok::string: {
      int line = t.line;
      std::string s;
      while (cur().type == tok::string)
        s += next().text;
      return constant(value::string(std::move(s)), line);
    }
    case tok::integer:
      return constant(value::integer(t.integer), next().line);
    case tok::floating:
      return constant(value::floating(t.floating), next().line);
    default:
      break;
    }
    if (skip_op("(")) {
      auto e = parse_tuple(false, true, {}, true);
      expect_op(")");
      return e;
    }
    if (is_op("["))
      return parse_list();
    if (is_op("{"))
      return parse_dict();
    error("unexpected '" + describe(t) + "'");
  }

  expr_ptr parse_list() {
    auto e = node(expr_kind::list, next().line);
    while (!is_op("]")) {
      if (!e->operands.empty())
        expect_op(",");
      if (is_op("]"))
        break;
      e->operands.push_back(parse_expression(true));
    }
    expect_op("]");
    return e;
  }

  expr_ptr parse_dict() {
    auto e = node(expr_kind::dict, next().line);
    while (!is_op("}")) {
      if (!e->operands.empty())
        expect_op(",");
      if (is_op("}"))
        break;
      e->operands.push_back(parse_expression(true));
      expect_op(":");
      e->operands.push_back(parse_expression(true));
    }
    expect_op("}");
    return e;
  }

  expr_ptr parse_postfix(expr_ptr e) {
    while (true) {
      if (is_op(".") || is_op("["))
        e = parse_subscript(std::move(e));
      else if (is_op("("))
        e = parse_call(std::move(e));
      else
        return e;
    }
  }

  expr_ptr parse_filter_expr(expr_ptr e) {
    while (true) {
      if (is_op("|"))
        e = parse_filter(std::move(e));
      else if (is_name("is"))
        e = parse_test(std::move(e));
      else if (is_op("("))
        e = parse_call(std::move(e));
      else
        return e;
    }
  }

  expr_ptr parse_subscript(expr_ptr subject) {
    const token t = next();
    if (t.text == ".") {
      const token attr = next();
      if (attr.type == tok::name) {
        auto e = node(expr_kind::attribute, t.line);
        e->constant = value::string(attr.text);
        e->operands.push_back(std::move(subject));
        return e;
      }
      if (attr.type != tok::integer)
        error("expected name or number");
      auto e = node(expr_kind::item, t.line);
      e->operands.push_back(std::move(subject));
      e->operands.push_back(constant(value::integer(attr.integer), attr.line));
      return e;
    }
    std::vector<expr_ptr> args;
    while (!is_op("]")) {
      if (!args.empty())
        expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = node(expr_kind::item, t.line);
    e->operands.push_back(std::move(subject));
    if (args.size() == 1) {
      e->operands.push_back(std::move(args.front()));
    } else {
      auto tuple = node(expr_kind::tuple, t.line);
      tuple->operands = std::move(args);
      e->operands.push_back(std::move(tuple));
    }
    return e;
  }

  expr_ptr slice_bound() {
    return is_op("]") || is_op(",") || is_op(":") ? nullptr : parse_expression(true);
  }

  expr_ptr parse_subscribed() {
    int line = cur().line;
    expr_ptr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":"))
        return start;
    }
    next(); // the first ':'
    auto e = node(expr_kind::slice, line);
    e->operands.push_back(std::move(start));
    e->operands.push_back(slice_bound());
    e->operands.push_back(skip_op(":") ? slice_bound() : nullptr);
    return e;
  }

  void parse_call_args(expr& e) {
    int line = cur().line;
    expect_op("(");
    bool require_comma = false;
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")"))
          break;
      }
      auto ensure = [&](bool ok) {
        if (!ok)
          throw failure{errc::parse_error, "invalid syntax for function call expression", line};
      };
      if (skip_op("*")) {
        ensure(e.star_args == nullptr && e.star_kwargs == nullptr);
        e.star_args = parse_expression(true);
      } else if (skip_op("**")) {
        ensure(e.star_kwargs == nullptr);
        e.star_kwargs = parse_expression(true);
      } else if (cur().type == tok::name && look().type == tok::op && look().text == "=") {
        ensure(e.star_kwargs == nullptr);
        std::string key = next().text;
        next();
        e.keywords.push_back(keyword_arg{std::move(key), parse_expression(true)});
      } else {
        ensure(e.star_args == nullptr && e.star_kwargs == nullptr && e.keywords.empty());
        e.positional.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  expr_ptr parse_call(expr_ptr callee) {
    auto e = node(expr_kind::call, cur().line);
    e->operands.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (skip_op("."))
      name += "." + expect_name();
    return name;
  }

  /// Filters after `subject` ("|name(args)"...); a null subject for block
  /// set and filter blocks, whose first filter has no '|' (`start_inline`).
  expr_ptr parse_filter(expr_ptr subject, bool start_inline = false) {
    while (is_op("|") || start_inline) {
      if (!std::exchange(start_inline, false))
        next();
      int line = cur().line;
      auto e = node(expr_kind::filter, line);
      e->name = dotted_name();
      e->filter = find_filter(e->name);
      if (e->filter == nullptr && jinja_has_filter(e->name))
        throw failure{errc::unsupported, "unsupported filter '" + e->name + "'", line};
      if (e->filter == nullptr)
        note_unknown("filter", e->name, line);
      e->operands.push_back(std::move(subject));
      if (is_op("("))
        parse_call_args(*e);
      subject = std::move(e);
    }
    return subject;
  }

  bool starts_test_argument() const {
    switch (cur().type) {
    case tok::name:
      return !is_any_name({"else", "or", "and"});
    case tok::string:
    case tok::integer:
    case tok::floating:
      return true;
    case tok::op:
      return cur().text == "[" || cur().text == "{";
    default:
      return false;
    }
  }

  expr_ptr parse_test(expr_ptr subject) {
    int line = next().line;
    bool negated = skip_name("not");
    auto e = node(expr_kind::test, line);
    e->name = dotted_name();
    e->test = find_test(e->name);
    if (e->test == nullptr)
      note_unknown("test", e->name, line);
    e->operands.push_back(std::move(subject));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if (starts_test_argument()) {
      if (is_name("is"))
        error("You cannot chain multiple tests with is");
      e->positional.push_back(parse_postfix(parse_primary()));
    }
    if (!negated)
      return e;
    auto n = node(expr_kind::not_, line);
    n->operands.push_back(std::move(e));
    return n;
  }

  std::vector<token> toks_;
  size_t pos_ = 0;
  std::shared_ptr<program> prog_;
  std::unordered_map<std::string, int> symbols_;
  std::vector<macro_def*> macros_;
  std::vector<unresolved_name> unresolved_;
  bool soft_ = false;
  int depth_ = 0;
  int loop_depth_ = 0;
};

// ---------------------------------------------------------------- constant folding

struct fold_info {
  bool constant = true; // jinja2's as_const may succeed
  bool has_slice = false;
};

/// Nodes jinja2's as_const never evaluates: names, calls, unknown filters
/// and tests, and filters that take the template context.
bool opaque(const expr& e) {
  switch (e.kind) {
  case expr_kind::name:
  case expr_kind::call:
    return true;
  case expr_kind::filter:
    return e.filter == nullptr || e.operands[0] == nullptr || filter_takes_context(e.name);
  case expr_kind::test:
    return e.test == nullptr;
  default:
    return false;
  }
}

/// Whether jinja2's as_const may succeed on `e` (a conditional expression
/// needs only its test and the branch taken, `and` / `or` their left side);
/// marks expr::fold (NOTE [constant folding]).
fold_info mark(expr& e) {
  fold_info info;
  info.has_slice = e.kind == expr_kind::slice;
  std::vector<bool> constant;
  auto visit = [&](expr* child) {
    fold_info c = child == nullptr ? fold_info{} : mark(*child);
    constant.push_back(c.constant);
    info.has_slice = info.has_slice || c.has_slice;
  };
  for (auto& o : e.operands)
    visit(o.get());
  for (auto& p : e.positional)
    visit(p.get());
  for (auto& k : e.keywords)
    visit(k.value.get());
  visit(e.star_args.get());
  visit(e.star_kwargs.get());
  bool all = std::all_of(constant.begin(), constant.end(), [](bool c) { return c; });
  if (e.kind == expr_kind::condition)
    info.constant = constant[0] && (constant[1] || constant[2]);
  else if (e.kind == expr_kind::and_ || e.kind == expr_kind::or_)
    info.constant = constant[0];
  else
    info.constant = all && !opaque(e);
  e.fold = info.constant && info.has_slice;
  return info;
}

void mark_body(body& b);

void mark_stmt(stmt& s) {
  for (auto& e : s.exprs)
    if (e != nullptr)
      mark(*e);
  if (s.filters != nullptr)
    mark(*s.filters);
  for (auto& branch : s.branches) {
    mark(*branch.condition);
    mark_body(branch.statements);
  }
  if (s.macro != nullptr) {
    for (auto& d : s.macro->defaults)
      mark(*d);
    mark_body(s.macro->statements);
  }
  mark_body(s.statements);
  mark_body(s.else_statements);
}

void mark_body(body& b) {
  for (auto& s : b)
    mark_stmt(*s);
}

} // namespace

bool filter_takes_context(std::string_view filter) {
  return filter == "map" || filter == "select" || filter == "reject" || filter == "selectattr" ||
         filter == "rejectattr";
}

void mark_constant_folds(program& p) {
  mark_body(p.root);
}

std::shared_ptr<program> parse_tokens(std::vector<token> tokens, std::string name) {
  auto p = parser(std::move(tokens), std::move(name)).run();
  mark_constant_folds(*p);
  return p;
}

} // namespace troupe::models::jinja
