#pragma once
// Typed configuration from YAML (ARCHITECTURE.md, rule 3).
//
// NOTE [config visitors]: each config struct describes its fields once, in a
// free function found by ADL,
//
//   template <class V> void visit(V& v, my_config& c) {
//     v.field("lr", c.lr, "Learning rate");
//     v.choice("algo", c.algo, {"ppo", "grpo"}, "RL algorithm");
//     v.section("optim", c.optim, "Optimizer");
//     v.list("stages", c.stages, "Stages, run in order");
//   }
//
// and the same description drives loading (config_reader: YAML → struct,
// every missing key keeps its default, every violation — bad type, value not
// allowed, unknown key — is collected with file:line:col and the YAML path),
// printing (config_writer: struct → commented YAML, for `troupe config show`
// and the reference file in configs/), and cross-field checks
// (config_checks::require(condition, path, message), located at the path's
// line). Nothing is spawned until every check has passed. yaml-cpp stays in
// config.cpp.

#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::runtime {

/// A parsed YAML document plus the `--set` overrides applied to it.
class yaml_document {
public:
  /// A config file's name and text.
  struct source_file {
    std::string name;
    std::string text;
  };
  /// Parses a file and the base files it names (NOTE [base files] in
  /// config.cpp); syntax errors name file:line:col. `sources`, when given,
  /// receives every file read, the job file first.
  static expected<yaml_document> from_file(const std::string& path,
                                           std::vector<source_file>* sources = nullptr);
  /// Parses `main` with base files taken from `bases` only (a file that is
  /// not among them is an error: nothing is read from disk). Names resolve
  /// like paths: a base's name is relative to the folder of its includer's.
  static expected<yaml_document> from_sources(const source_file& main,
                                              const std::vector<source_file>& bases);
  /// Parses text; `name` stands for the file in messages.
  static expected<yaml_document> from_text(const std::string& text, const std::string& name);

  /// Applies `a.b.c=value` (value parsed as YAML: `3`, `true`, `[1, 2]`,
  /// `text`); creates missing mappings. Errors name the override.
  expected<void> set(std::string_view assignment);

  const std::string& name() const;
  /// Whether the document sets nothing (empty, comments only, or null),
  /// with its base files.
  bool empty() const;

  struct impl;
  std::shared_ptr<impl> impl_; // shared: cheap copies, readers keep it alive
};

/// "file:line:col" of a YAML path that was read, "--set a.b=v" for an
/// override, or just the file for a path that was not in it.
using location_map = std::map<std::string, std::string>;

/// Collects every violation; `error()` joins them (invalid_config).
class config_errors {
public:
  void add(std::string where, std::string path, std::string message);
  bool empty() const { return lines_.empty(); }
  const std::vector<std::string>& lines() const { return lines_; }
  caf::error error() const;

private:
  std::vector<std::string> lines_;
};

/// Scalars a config field may hold.
enum class scalar_kind { boolean, integer, number, text };

/// YAML → struct visitor (NOTE [config visitors]).
class config_reader {
public:
  config_reader(const yaml_document& doc, config_errors& errors, location_map& locations);

  template <class T>
  void field(std::string_view key, T& value, std::string_view doc = {}) {
    (void)doc;
    read_value(key, value);
  }

  void choice(std::string_view key, std::string& value, std::initializer_list<std::string_view> allowed,
              std::string_view doc = {});
  /// An enum field: one of its names or aliases (NOTE [enum names]).
  template <named_enum E>
  void choice(std::string_view key, E& value, std::string_view doc = {}) {
    (void)doc;
    std::string text{enum_name(value)};
    if (read_choice(key, text, enum_choices<E>()))
      value = *enum_from_name<E>(text);
  }
  /// An enum field limited to some of its values.
  template <named_enum E>
  void choice(std::string_view key, E& value, std::initializer_list<E> allowed, std::string_view doc = {}) {
    (void)doc;
    std::string text{enum_name(value)};
    std::vector<std::string_view> names;
    for (auto a : allowed)
      names.push_back(enum_name(a));
    if (read_choice(key, text, names))
      value = *enum_from_name<E>(text);
  }
  /// An enum field that may also be `none_name` ("auto": nullopt).
  template <named_enum E>
  void choice(std::string_view key, std::optional<E>& value, std::string_view none_name,
              std::string_view doc = {}) {
    (void)doc;
    std::string text{value ? enum_name(*value) : none_name};
    auto allowed = enum_choices<E>();
    allowed.insert(allowed.begin(), none_name);
    if (read_choice(key, text, allowed))
      value = text == none_name ? std::nullopt : enum_from_name<E>(text);
  }

  template <class S>
  void section(std::string_view key, S& sub, std::string_view doc = {}) {
    (void)doc;
    if (auto child = enter(key)) {
      visit(*child, sub);
      child->finish();
    }
  }

  template <class S>
  void list(std::string_view key, std::vector<S>& items, std::string_view doc = {}) {
    (void)doc;
    auto n = sequence_size(key);
    if (!n)
      return;
    items.assign(*n, S{});
    for (size_t i = 0; i < *n; ++i) {
      auto child = element(key, i);
      visit(child, items[i]);
      child.finish();
    }
  }

  /// Reports keys of this mapping that no field read (with the known keys).
  void finish();

  struct node; // implementation detail (config.cpp)

private:
  config_reader(std::shared_ptr<node> n, const yaml_document& doc, config_errors& errors,
                location_map& locations);
  std::optional<config_reader> enter(std::string_view key);
  std::optional<size_t> sequence_size(std::string_view key);
  config_reader element(std::string_view key, size_t i);

  void read_value(std::string_view key, bool& v);
  void read_value(std::string_view key, int64_t& v);
  void read_value(std::string_view key, int32_t& v);
  void read_value(std::string_view key, double& v);
  void read_value(std::string_view key, std::string& v);
  void read_value(std::string_view key, std::vector<int64_t>& v);
  void read_value(std::string_view key, std::vector<double>& v);
  void read_value(std::string_view key, std::vector<std::string>& v);
  /// An optional field: absent keeps the default, `null` clears it.
  template <class T>
  void read_value(std::string_view key, std::optional<T>& v) {
    if (is_null(key)) {
      v.reset();
      return;
    }
    if (!present(key))
      return;
    T x{};
    read_value(key, x);
    v = x;
  }
  bool present(std::string_view key); // marks `key` known
  bool is_null(std::string_view key); // written and null; marks `key` known
  /// Reads `key` into `value` when present and one of `allowed`; answers
  /// whether it did (a value outside `allowed` is reported).
  bool read_choice(std::string_view key, std::string& value, const std::vector<std::string_view>& allowed);

  std::shared_ptr<node> node_;
  yaml_document doc_;
  config_errors* errors_;
  location_map* locations_;
};

/// struct → commented YAML visitor (NOTE [config visitors]).
class config_writer {
public:
  template <class T>
  void field(std::string_view key, const T& value, std::string_view doc = {}) {
    emit(key, render(value), doc);
  }
  void choice(std::string_view key, const std::string& value,
              std::initializer_list<std::string_view> allowed, std::string_view doc = {}) {
    emit_choice(key, value, std::vector<std::string_view>(allowed), doc);
  }
  template <named_enum E>
  void choice(std::string_view key, const E& value, std::string_view doc = {}) {
    emit_choice(key, std::string{enum_name(value)}, enum_choices<E>(), doc);
  }
  template <named_enum E>
  void choice(std::string_view key, const E& value, std::initializer_list<E> allowed,
              std::string_view doc = {}) {
    std::vector<std::string_view> names;
    for (auto a : allowed)
      names.push_back(enum_name(a));
    emit_choice(key, std::string{enum_name(value)}, names, doc);
  }
  template <named_enum E>
  void choice(std::string_view key, const std::optional<E>& value, std::string_view none_name,
              std::string_view doc = {}) {
    auto allowed = enum_choices<E>();
    allowed.insert(allowed.begin(), none_name);
    emit_choice(key, std::string{value ? enum_name(*value) : none_name}, allowed, doc);
  }
  template <class S>
  void section(std::string_view key, S& sub, std::string_view doc = {}) {
    open(key, doc);
    visit(*this, sub);
    close();
  }
  template <class S>
  void list(std::string_view key, std::vector<S>& items, std::string_view doc = {}) {
    open_list(key, doc, items.size());
    for (auto& item : items) {
      next_item();
      visit(*this, item);
    }
    close();
  }

  /// Include the doc strings as comments.
  bool comments = true;
  std::string str() const { return out_; }

private:
  static std::string render(bool v);
  static std::string render(int64_t v);
  static std::string render(int32_t v);
  static std::string render(double v);
  static std::string render(const std::string& v);
  static std::string render(const std::vector<int64_t>& v);
  static std::string render(const std::vector<double>& v);
  static std::string render(const std::vector<std::string>& v);
  template <class T>
  static std::string render(const std::optional<T>& v) {
    return v ? render(*v) : std::string{"null"};
  }
  void emit(std::string_view key, const std::string& value, std::string_view doc);
  void emit_choice(std::string_view key, const std::string& value,
                   const std::vector<std::string_view>& allowed, std::string_view doc);
  void open(std::string_view key, std::string_view doc);
  void open_list(std::string_view key, std::string_view doc, size_t n);
  void next_item();
  void close();
  std::string indent() const;
  void comment(std::string_view doc);

  std::string out_;
  int depth_ = 0;
  std::vector<bool> item_open_; // per open section/list: inside a list item
};

/// Cross-field checks, located at the YAML line of the path they name.
class config_checks {
public:
  config_checks(config_errors& errors, const location_map& locations, std::string file)
    : errors_(&errors), locations_(&locations), file_(std::move(file)) {}
  /// Records `message` at `path` unless `ok`.
  void require(bool ok, const std::string& path, const std::string& message);

private:
  config_errors* errors_;
  const location_map* locations_;
  std::string file_;
};

/// Loads `T` from a document: visit(config_reader&, T&), then, when reading
/// found no error, `check(const T&, config_checks&)` (found by ADL) for
/// cross-field rules, then `more` when given (checks that look at this
/// machine: the files and folders a run will use). Every violation is
/// reported at once.
template <class T>
expected<T> load_config(const yaml_document& doc,
                        void (*more)(const T&, config_checks&) = nullptr) {
  T value{};
  config_errors errors;
  location_map locations;
  config_reader root{doc, errors, locations};
  visit(root, value);
  root.finish();
  if (errors.empty()) {
    config_checks checks{errors, locations, doc.name()};
    check(static_cast<const T&>(value), checks);
    if (more != nullptr)
      more(value, checks);
  }
  if (!errors.empty())
    return errors.error();
  return value;
}

/// Parses `path`, applies `overrides` ("a.b=value", in order), loads `T`.
template <class T>
expected<T> load_config_file(const std::string& path, const std::vector<std::string>& overrides = {}) {
  auto doc = yaml_document::from_file(path);
  if (!doc)
    return doc.error();
  for (const auto& o : overrides)
    if (auto ok = doc->set(o); !ok)
      return ok.error();
  return load_config<T>(*doc);
}

/// `value` as commented YAML (the resolved config).
template <class T>
std::string to_yaml(T value, bool comments = true) {
  config_writer w;
  w.comments = comments;
  visit(w, value);
  return w.str();
}

} // namespace troupe::runtime
