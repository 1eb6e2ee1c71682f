#pragma once
// Private to the chat template engine (models/chat_template*.cpp): values,
// the syntax tree, the lexer, the parser and the renderer (NOTE [chat
// template engine] in chat_template.hpp).
//
// NOTE [chat template subset]: what the engine accepts.
//   Statements: if/elif/else; for (tuple targets, an `if` filter, else,
//   loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem/
//   depth/depth0/cycle()/changed()); break/continue; set (names, tuples,
//   ns.attr, block set with filters); macro (defaults, keyword arguments,
//   varargs/kwargs, caller); call blocks; filter blocks; print; raw;
//   transformers' generation block; comments.
//   Expressions: literals, + - * / // % ** ~, chained comparisons, in /
//   not in, and/or/not, is [not] test, conditional expressions, attribute,
//   subscript and slice access, calls with keyword, *args and **kwargs
//   arguments, filters.
//   Filters: abs attr batch capitalize center count d default dictsort e
//   escape first float forceescape format indent int items join last length
//   list lower map max min reject rejectattr replace reverse round safe
//   select selectattr sort string sum title tojson trim unique upper
//   wordcount. Tests: all of jinja2's (test_table in
//   chat_template_filters.cpp). Globals: range namespace dict
//   raise_exception strftime_now. Methods: Python's str methods in
//   str_methods (chat_template_methods.cpp), dict items/keys/values/get/copy,
//   list index/count/copy/pop/clear (the sandbox refuses the other mutators).
//   Refused at parse time (errc::unsupported, naming the line): the
//   statements block/extends/include/import/from/with/autoescape, recursive
//   loops, jinja2's other filters (wordwrap, truncate, groupby, ...), the
//   globals lipsum/cycler/joiner, \N{...} escapes. A filter or test name
//   jinja2 does not know either is a parse_error, except inside an if or a
//   conditional expression, where jinja2 (and this engine) fails only when it
//   runs. Refused at run time (errc::unsupported): Python methods and format
//   specifications outside the subset.
//   Markup (what safe and escape return) is a flag on str values: `+`, `%`,
//   str.format and str.join escape the other side, escape leaves it as is,
//   repr() shows Markup('...'), and the str methods markupsafe overrides keep
//   it.
//   Known divergences from jinja2: a generator or method prints without its
//   address; integers are 64-bit (overflow is an error); identifiers are
//   ASCII; map/select/reject/selectattr/rejectattr/unique/batch/items build
//   their generator eagerly, which differs only when a generator that would
//   fail is never consumed.

#include "models/chat_template.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace troupe::models::jinja {

// ---------------------------------------------------------------- errors

/// Thrown inside the engine, converted to an error at chat_template's API.
struct failure {
  errc code;
  std::string message;
  int line = 0; // 0 = not yet known; the innermost node fills it in
};

/// Throws a failure (errc::invalid_argument unless given).
[[noreturn]] void fail(std::string message, errc code = errc::invalid_argument);

// ---------------------------------------------------------------- values

class value;
class object;
class renderer;
using value_list = std::vector<value>;
using string_ptr = std::shared_ptr<const std::string>;

/// What Python type a sequence value stands for (they differ in repr, in
/// subscripting and in `==`).
enum class seq_kind : uint8_t { list, tuple, dict_keys, dict_values, dict_items, range };

struct sequence {
  seq_kind kind = seq_kind::list;
  value_list items;
  int64_t start = 0, stop = 0, step = 1; // the arguments of a range
  uint32_t depth = 1;                    // containers nested in it, itself included
};

/// A Python dict: insertion-ordered (key, value) pairs.
struct mapping {
  std::vector<std::pair<value, value>> entries;
  uint32_t depth = 1; // containers nested in it, itself included
  const value* find(const value& key) const;
  const value* find(std::string_view key) const;
  void set(value key, value v);
};

/// Why a value is undefined, for the message when it is used.
struct undefined_info {
  enum class reason : uint8_t { name, attribute, element, hint };
  reason why = reason::hint;
  string_ptr text;   // the variable or attribute name, or the hint
  std::string owner; // "dict object", for attribute and element
  errc code = errc::invalid_argument;
};

enum class kind : uint8_t {
  undefined,
  none,
  boolean,
  integer,
  floating,
  string,
  sequence,
  mapping,
  object
};

/// A template value: Python's None, bool, int (64-bit), float, str (UTF-8),
/// list / tuple / dict views / range, dict, an object (namespace, loop,
/// callable, generator), or jinja2's Undefined. Containers are shared, as in
/// Python (list.pop and namespaces mutate in place).
class value {
public:
  value() = default; // undefined
  static value none();
  static value boolean(bool b);
  static value integer(int64_t i);
  static value floating(double f);
  static value string(std::string s);
  static value string(string_ptr s);
  /// markupsafe's Markup: a str that `+`, `%`, escape and repr treat as safe.
  static value markup(std::string s);
  /// `s` as a str, Markup when `like` is one (Markup's methods keep it).
  static value string_like(std::string s, const value& like);
  static value list(value_list items, seq_kind k = seq_kind::list);
  static value range(int64_t start, int64_t stop, int64_t step);
  static value dict(std::shared_ptr<mapping> m);
  static value dict();
  static value object(std::shared_ptr<jinja::object> o);
  static value undefined(undefined_info info);
  static value undefined_hint(std::string hint);

  jinja::kind kind() const { return kind_; }
  bool is(jinja::kind k) const { return kind_ == k; }
  bool is_undefined() const { return kind_ == kind::undefined; }
  bool is_number() const { return kind_ >= kind::boolean && kind_ <= kind::floating; }
  bool is_int_like() const { return kind_ == kind::boolean || kind_ == kind::integer; }
  bool is_markup() const { return markup_; }

  bool as_bool() const { return scalar_.b; }
  int64_t as_int() const { return kind_ == kind::boolean ? int64_t{scalar_.b} : scalar_.i; }
  double as_double() const;
  const std::string& str() const { return *static_cast<const std::string*>(ptr_.get()); }
  sequence& seq() const { return *static_cast<sequence*>(ptr_.get()); }
  mapping& map() const { return *static_cast<mapping*>(ptr_.get()); }
  jinja::object& obj() const { return *static_cast<jinja::object*>(ptr_.get()); }
  const undefined_info* undef() const { return static_cast<const undefined_info*>(ptr_.get()); }
  const void* identity() const { return ptr_.get(); }

private:
  jinja::kind kind_ = kind::undefined;
  bool markup_ = false;
  union {
    bool b;
    int64_t i;
    double f;
  } scalar_{};
  std::shared_ptr<void> ptr_;
};

/// Keyword arguments borrow their names from the syntax tree, or from the
/// dict of a `**kwargs` argument, which `holder` keeps alive.
struct call_args {
  value_list positional;
  std::vector<std::pair<std::string_view, value>> keywords;
  std::vector<value> holders;
};

/// Namespaces, loop objects, callables and generators.
class object : public std::enable_shared_from_this<object> {
public:
  virtual ~object() = default;
  /// Python's type name ("Namespace", "function", "generator").
  virtual std::string type_name() const = 0;
  virtual std::string repr() const = 0;
  /// `obj.name`; undefined when absent.
  virtual value attribute(const std::string& name);
  virtual bool callable() const { return false; }
  virtual value call(renderer& r, call_args& args);
  /// Generators: the items not consumed yet, consuming them.
  virtual bool is_iterator() const { return false; }
  virtual value_list drain() { return {}; }
  /// Namespaces: `{% set ns.name = v %}`.
  virtual bool set_attribute(const std::string& name, value v);
  /// Python's len(), or -1 without one.
  virtual int64_t length() const { return -1; }
  /// Drops what it refers to (the end of a render breaks reference cycles).
  virtual void release() {}
  /// The containers nested in it, itself included (NOTE [value nesting]).
  virtual uint32_t depth() const { return 1; }
};

/// NOTE [value nesting]: a container nested more than 500 levels deep
/// cannot be built (a template could otherwise chain values until their
/// recursive destruction overflows the stack); every container records its
/// depth when it is made. `nesting_guard` bounds recursion over values too,
/// for cycles through namespaces (Python fails there with RecursionError).
constexpr uint32_t max_value_nesting = 500;
uint32_t depth_of(const value& v);
/// 1 + the deepest of `items`; fails beyond max_value_nesting.
uint32_t nested_depth(const value_list& items);
uint32_t nested_depth(const mapping& m);
class nesting_guard {
public:
  nesting_guard();
  ~nesting_guard();
  nesting_guard(const nesting_guard&) = delete;
  nesting_guard& operator=(const nesting_guard&) = delete;
};

// Value helpers (chat_template_value.cpp).
bool truthy(const value& v);
/// Python's str(v); Undefined gives "".
std::string to_str(const value& v);
void append_str(std::string& out, const value& v);
/// Python's repr(v).
std::string repr(const value& v);
void append_repr(std::string& out, const value& v);
/// Python's repr of a str.
void append_string_repr(std::string& out, std::string_view s);
/// Python's repr of a float.
std::string float_repr(double d);
/// "dict object", "str object", "None": jinja2's object_type_repr.
std::string type_repr(const value& v);
/// Python's type(v).__name__ ("dict", "NoneType", "Undefined").
std::string type_name(const value& v);
/// Python's ==.
bool equals(const value& a, const value& b);
/// Python's a < b; TypeError for types without an order. `op` names the
/// operator in the message.
bool less(const value& a, const value& b, std::string_view op = "<");
/// Python's hash() precondition: dicts, lists, namespaces are unhashable.
bool hashable(const value& v);
/// The JSON document as template values (objects keep their order).
value from_json(const nlohmann::ordered_json& j);
/// Raises the error an undefined value raises when used.
[[noreturn]] void fail_undefined(const value& v);
/// The items of `v` as Python's iter() gives them; TypeError when it is not
/// iterable (Undefined iterates as empty).
value_list iterate(const value& v);
/// Python's len(); TypeError without one.
int64_t length_of(const value& v);

// Text helpers (chat_template_text.cpp).
namespace text {
/// Python's str.isspace() for one code point.
bool is_space(char32_t cp);
/// Decodes the code point at `pos` (invalid bytes stand for themselves) and
/// advances `pos`.
char32_t next_cp(std::string_view s, size_t& pos);
void append_cp(std::string& out, char32_t cp);
/// Byte offset after skipping Python whitespace from `pos`.
size_t skip_space(std::string_view s, size_t pos);
/// Length of `s` without its trailing Python whitespace.
size_t rstrip_end(std::string_view s);
/// Number of code points.
size_t cp_length(std::string_view s);
std::vector<std::string_view> code_points(std::string_view s);
std::string lower(std::string_view s);
std::string upper(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
std::string jinja_title(std::string_view s); // the title filter
bool is_lower(std::string_view s);
bool is_upper(std::string_view s);
/// str.strip / lstrip / rstrip; `chars` null = whitespace.
std::string_view strip(std::string_view s, const std::string* chars, bool left, bool right);
/// str.split / rsplit; `sep` null = runs of whitespace.
value_list split(std::string_view s, const std::string* sep, int64_t maxsplit, bool from_right);
value_list splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view now, int64_t count);
/// Python's str % args (printf-style formatting); `args` is one value or a
/// tuple, or a dict for %(name)s.
/// `escape_args`: the format is Markup, so str() and repr() of the
/// arguments are escaped.
std::string percent_format(std::string_view fmt, const value& args, bool escape_args = false);
/// Python's str.format over the sandbox (positional, numbered and named
/// fields, attribute/index lookups, no format specification).
/// `escape_fields`: the format is Markup, so each field is escaped.
std::string brace_format(std::string_view fmt, const call_args& args, bool escape_fields = false);
/// markupsafe's escape.
std::string html_escape(std::string_view s);
/// markupsafe's escape(v): Markup of the escaped str(v); Markup as it is.
value escape(const value& v);
/// Words as the regex \w+ finds them.
int64_t word_count(std::string_view s);
} // namespace text

/// json.dumps with the arguments transformers' tojson passes on.
struct json_options {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;
  std::string item_separator = ", ", key_separator = ": ";
  bool sort_keys = false;
};
std::string dump_json(const value& v, const json_options& opts);

// ---------------------------------------------------------------- syntax tree

enum class expr_kind : uint8_t {
  constant,
  name,
  list,
  tuple,
  dict,
  attribute,
  item,
  slice,
  call,
  filter,
  test,
  not_,
  neg,
  pos,
  binary,
  compare,
  and_,
  or_,
  condition,
  concat
};

enum class binop : uint8_t { add, sub, mul, div, floordiv, mod, pow };
enum class cmpop : uint8_t { eq, ne, lt, le, gt, ge, in, not_in };

struct expr;
using expr_ptr = std::unique_ptr<expr>;

/// A filter / test: the subject and its arguments.
using filter_fn = value (*)(renderer& r, const value& subject, call_args& args);
using test_fn = bool (*)(renderer& r, const value& subject, call_args& args);

struct keyword_arg {
  std::string name;
  expr_ptr value;
};

struct expr {
  expr_kind kind = expr_kind::constant;
  int line = 0;
  jinja::value constant; // constants; the name of an attribute (a str)
  int symbol = -1;       // names
  binop op = binop::add;
  std::vector<cmpop> compare_ops;
  /// Children: items; dict keys and values alternating; the subject first
  /// for attribute / item / call / filter / test; slice bounds (null when
  /// absent); condition: test, then, else (may be null).
  std::vector<expr_ptr> operands;
  std::vector<expr_ptr> positional; // call / filter / test arguments
  std::vector<keyword_arg> keywords;
  expr_ptr star_args, star_kwargs; // f(*a, **k)
  std::string name;                // filter or test name
  filter_fn filter = nullptr;
  test_fn test = nullptr;
  /// A constant expression with a slice in it (NOTE [constant folding]).
  bool fold = false;
};

enum class stmt_kind : uint8_t {
  text,
  print,
  if_,
  for_,
  set,
  set_attribute,
  set_block,
  macro,
  break_,
  continue_,
  block,        // a body of its own: {% generation %}
  filter_block, // {% filter f %}...{% endfilter %}
  call_block    // {% call(params) m(args) %}...{% endcall %}: macro = the caller
};

struct stmt;
using stmt_ptr = std::unique_ptr<stmt>;
using body = std::vector<stmt_ptr>;

struct if_branch {
  expr_ptr condition; // null for else
  body statements;
};

struct macro_def {
  std::string name;
  int symbol = -1;
  std::vector<int> params;
  std::vector<std::string> param_names;
  std::vector<expr_ptr> defaults; // for the last defaults.size() params
  body statements;
  bool catch_varargs = false, catch_kwargs = false, catch_caller = false;
  int varargs_symbol = -1, kwargs_symbol = -1, caller_symbol = -1;
};

/// An assignment target: a name (symbol >= 0), or a tuple to unpack.
struct target {
  int symbol = -1;
  bool unpack = false;
  std::vector<jinja::target> items;
};

struct stmt {
  stmt_kind kind = stmt_kind::text;
  int line = 0;
  std::string text;
  std::vector<expr_ptr> exprs; // print: values; set: value; for: iterable, filter (may be null)
  jinja::target target;        // set, for; the namespace of set_attribute
  std::string attribute;       // set ns.attribute (set_attribute, set_block)
  expr_ptr filters;            // block set, filter block: a filter chain over a null subject
  std::vector<if_branch> branches;
  body statements, else_statements;
  std::unique_ptr<macro_def> macro;
};

/// A parsed template.
struct program {
  std::string name;
  std::vector<std::string> symbols;                // id -> name
  std::unordered_map<std::string, int> symbol_ids; // name -> id
  std::vector<value> globals;                      // id -> the global of that name, if any
  int loop_symbol = -1;                            // "loop", when the template names it
  body root;
};

// ---------------------------------------------------------------- lexer / parser

enum class tok : uint8_t {
  data,
  var_begin,
  var_end,
  block_begin,
  block_end,
  name,
  string,
  integer,
  floating,
  op,
  eof
};

struct token {
  tok type = tok::eof;
  int line = 1;
  std::string text; // data, name, operator spelling, decoded string
  int64_t integer = 0;
  double floating = 0;
};

/// NOTE [constant folding]: jinja2 evaluates constant expressions when it
/// compiles a template, through the sandbox's getitem, which turns the
/// TypeError of slicing a non-sequence into undefined; at run time a slice
/// is a plain subscript that raises. A constant expression containing a
/// slice (expr::fold) is therefore evaluated leniently first; the result
/// stands if jinja2 would have kept it: always for the expression a `{{ }}`
/// prints, elsewhere when Python can write it as a literal (no undefined).
/// While lenient, what as_const cannot evaluate (names, calls, filters that
/// take the context) fails, and the expression is evaluated as usual.
/// Only templates that slice literals see the difference.
bool safe_repr(const value& v);
/// Marks expr::fold in a parsed program.
void mark_constant_folds(program& p);
/// Filters jinja2 cannot evaluate at compile time (they take the context).
bool filter_takes_context(std::string_view filter);

/// jinja2's lexer with trim_blocks and lstrip_blocks (throws failure).
std::vector<token> tokenize(std::string_view source);
/// The tree of `tokens` (throws failure).
std::shared_ptr<program> parse_tokens(std::vector<token> tokens, std::string name);

// Registries (chat_template_filters.cpp). Null when unknown.
filter_fn find_filter(std::string_view name);
test_fn find_test(std::string_view name);
/// Whether jinja2 has a filter / test of that name (to tell "unsupported"
/// from "unknown").
bool jinja_has_filter(std::string_view name);
bool jinja_has_test(std::string_view name);

// ---------------------------------------------------------------- renderer

/// The items of a for loop as jinja2's LoopContext sees them: with an `if`
/// filter they are produced on demand, the filter running just before an
/// item is needed (after the previous iteration's body), or earlier when
/// loop.last / nextitem / length / revindex look ahead.
class loop_feed {
public:
  using keep_fn = std::function<bool(const value&)>;
  loop_feed(value_list source, keep_fn keep);
  /// Whether item `i` exists, producing the items up to it.
  bool has(size_t i);
  /// Item `i`, after has(i).
  const value& at(size_t i) const { return kept_[i]; }
  /// The number of items, producing them all.
  size_t count();
  /// The containers nested in the items (NOTE [value nesting]).
  uint32_t depth() const { return depth_; }

private:
  value_list source_;
  size_t next_ = 0;
  keep_fn keep_; // null: every item
  value_list kept_;
  uint32_t depth_;
};

/// Variables of a for-loop iteration, a macro call or the template.
struct scope {
  std::shared_ptr<scope> parent;
  std::vector<std::pair<int, value>> vars;
  value* find(int symbol);
  void set(int symbol, value v);
};

enum class flow : uint8_t { normal, break_, continue_ };

/// One render of a program (chat_template_eval.cpp).
class renderer {
public:
  renderer(const program& p, const chat_template_limits& limits);
  ~renderer();
  renderer(const renderer&) = delete;
  renderer& operator=(const renderer&) = delete;
  std::string run(const nlohmann::ordered_json& variables);
  /// Objects that may take part in a reference cycle (a namespace holding
  /// itself): released when the render ends.
  void track(std::shared_ptr<object> o) { tracked_.push_back(std::move(o)); }

  value eval(const expr& e);
  /// Calls a callable value (macros, builtins, methods).
  value call_value(const value& callee, call_args& args);
  /// Applies the filter / test called `name` at run time (map, select).
  value apply_filter(std::string_view name, const value& subject, call_args& args);
  bool apply_test(std::string_view name, const value& subject, call_args& args);
  /// Runs a macro body in a new scope under `closure`; its output.
  std::string call_macro(const macro_def& m, const std::shared_ptr<scope>& closure,
                         call_args& args);
  /// Fails with out_of_range when a string of `bytes` would pass the cap.
  void check_size(size_t bytes) const;
  void count_iterations(size_t n);

private:
  flow exec(const body& b);
  flow exec(const stmt& s);
  void exec_simple(const stmt& s);
  void exec_print(const stmt& s);
  flow exec_if(const stmt& s);
  flow exec_for(const stmt& s);
  std::shared_ptr<loop_feed> loop_items(const stmt& s);
  void run_iterations(const stmt& s, const std::shared_ptr<loop_feed>& items);
  void assign(const target& t, const value& v);
  value* lookup(int symbol);
  void set_namespace_attribute(const stmt& s, value v);
  void exec_set_attribute(const stmt& s);
  void exec_set_block(const stmt& s);
  void exec_macro(const stmt& s);
  void exec_filter_block(const stmt& s);
  void exec_call_block(const stmt& s);
  std::string capture(const body& b);
  value eval_inner(const expr& e);
  value eval_name(const expr& e);
  value eval_collection(const expr& e);
  value eval_condition(const expr& e);
  value eval_call(const expr& e);
  value eval_filter(const expr& e, const value* seed);
  value eval_test(const expr& e);
  value eval_compare(const expr& e);
  value eval_slice(const expr& e, const value& subject);
  void eval_args(const expr& e, call_args& out);
  void add_star_kwargs(value kwargs, call_args& out);

  value eval_folded(const expr& e);
  /// Fails while evaluating leniently (NOTE [constant folding]).
  void not_constant() const;

  const program& program_;
  const chat_template_limits& limits_;
  bool lenient_ = false;             // evaluating a constant expression (NOTE [constant folding])
  const expr* print_root_ = nullptr; // the expression a {{ }} prints
  std::shared_ptr<scope> scope_;
  std::vector<std::shared_ptr<scope>> closures_; // scopes macros captured (they hold the macros)
  std::vector<std::shared_ptr<object>> tracked_;
  std::string* out_ = nullptr;
  uint64_t iterations_ = 0;
  uint32_t depth_ = 0;   // macro calls
  uint32_t nesting_ = 0; // statements and expressions being evaluated
};

// Operators and access (chat_template_ops.cpp).
value binary(binop op, const value& a, const value& b, const renderer& r);
value concat(const value_list& parts, const renderer& r);
value negate(const value& v);
/// Unary plus: numbers only (bool becomes int).
value positive(const value& v);
bool contains(const value& container, const value& item);
/// jinja2's sandboxed getattr(obj, name) (attribute first, then item).
value get_attribute(const value& obj, const std::string& name);
/// jinja2's sandboxed getitem(obj, key) (item first, then attribute).
value get_item(const value& obj, const value& key);
/// obj[start:stop:step]; null bounds are absent. `lenient` gives undefined
/// where Python raises a TypeError (NOTE [constant folding]).
value get_slice(const value& obj, const value* start, const value* stop, const value* step,
                bool lenient = false);

// Methods and globals (chat_template_methods.cpp).
/// The bound method `obj.name` of a str / dict / list, or undefined.
value find_method(const value& obj, const std::string& name, bool& found);
/// The global called `name` (range, namespace, dict, raise_exception,
/// strftime_now), or undefined.
value find_global(std::string_view name);
/// Whether `name` is a jinja2 global outside the subset (lipsum, cycler,
/// joiner).
bool is_unsupported_global(std::string_view name);
/// A generator over `items` (what map, select, ... return); `type` is
/// Python's type name ("generator", "list_reverseiterator").
value make_generator(value_list items, std::string function_name, std::string type = "generator");
/// A generator's next item; false when it is exhausted.
bool next_item(const value& generator, value& out);
/// The `loop` object of one for loop, and its step to iteration `index0`.
std::shared_ptr<object> make_loop(std::shared_ptr<loop_feed> feed);
void advance_loop(object& loop, size_t index0);
/// A macro as a value.
value make_macro(const macro_def& m, std::shared_ptr<scope> closure);

/// Binds `args` to the parameters `names` (Python's rules for a function
/// without *args): positional first, then keywords; nullptr where absent.
/// `function` names the callee in errors.
std::vector<const value*> bind_args(const call_args& args,
                                    std::initializer_list<std::string_view> names,
                                    std::string_view function);
/// A key written in text (attribute paths, format fields): digits are an
/// int, as jinja2 and str.format read them; anything else a str.
value text_key(std::string_view text);
/// An integer argument (bool counts); TypeError naming `what` otherwise.
int64_t int_arg(const value& v, std::string_view what);
const std::string& str_arg(const value& v, std::string_view what);

} // namespace troupe::models::jinja
