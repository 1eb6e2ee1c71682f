#include "runtime/config.hpp"

#include "runtime/utf8.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <sstream>

namespace troupe::runtime {

// ---- document -----------------------------------------------------------------

struct yaml_document::impl {
  std::string name;
  YAML::Node root;
  /// Override text by dotted path ("ppo.lr" → "--set ppo.lr=1e-5").
  std::map<std::string, std::string> overrides;
  /// The file of each path inherited through `base:` (NOTE [base files]).
  std::map<std::string, std::string> origins;
};

namespace {

std::string where(const std::string& file, const YAML::Mark& m) {
  if (m.is_null() || m.line < 0)
    return file;
  return file + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

std::string join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string{key} : path + "." + std::string{key};
}

// Where the node at `path` came from: the `--set` that wrote it or one of
// its ancestors (marks inside an override's value point into the override
// text, not the file), else file:line:col.
std::string locate(const yaml_document& doc, const std::string& path, const YAML::Mark& m) {
  for (const auto& [key, text] : doc.impl_->overrides)
    if (path == key || (path.size() > key.size() && path.compare(0, key.size(), key) == 0 &&
                        (path[key.size()] == '.' || path[key.size()] == '[')))
      return text;
  // The deepest inherited ancestor names the file the node came from.
  const std::string* file = &doc.name();
  size_t best = 0;
  for (const auto& [key, origin] : doc.impl_->origins)
    if ((path == key || (path.size() > key.size() && path.compare(0, key.size(), key) == 0 &&
                         (path[key.size()] == '.' || path[key.size()] == '['))) &&
        key.size() >= best) {
      best = key.size();
      file = &origin;
    }
  return where(*file, m);
}

std::string kind_of(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Scalar: return "'" + n.Scalar() + "'";
    default: return "nothing";
  }
}

expected<yaml_document> parse(const std::string& text, const std::string& name) {
  yaml_document doc;
  doc.impl_ = std::make_shared<yaml_document::impl>();
  doc.impl_->name = name;
  try {
    doc.impl_->root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return make_error(errc::parse_error, where(name, e.mark) + ": " + e.msg);
  }
  if (doc.impl_->root.IsNull())
    doc.impl_->root = YAML::Node(YAML::NodeType::Map);
  if (!doc.impl_->root.IsMap())
    return make_error(errc::parse_error,
                      name + ": the top level must be a mapping of keys, found " +
                        kind_of(doc.impl_->root));
  return doc;
}

} // namespace

namespace {

// NOTE [base files]: a job file may start from another with `base: FILE`
// (relative to the file that names it): its mappings are merged key by key
// over the base's, anything else replaces the base's value. Errors in
// inherited keys name the base file's line (impl::origins).
void merge_over(YAML::Node base, const YAML::Node& over, const std::string& path,
                const std::string& file, std::map<std::string, std::string>& origins) {
  for (const auto& kv : over) {
    auto key = kv.first.Scalar();
    auto sub = join(path, key);
    YAML::Node existing = base[key];
    if (existing.IsDefined() && existing.IsMap() && kv.second.IsMap()) {
      merge_over(existing, kv.second, sub, file, origins);
      continue;
    }
    base[key] = kv.second;
    // Now this file's, below `sub` too.
    for (auto it = origins.lower_bound(sub); it != origins.end() && it->first.compare(0, sub.size(), sub) == 0;) {
      const auto& k = it->first;
      if (k.size() == sub.size() || k[sub.size()] == '.' || k[sub.size()] == '[')
        it = origins.erase(it);
      else
        ++it;
    }
    origins[sub] = file;
  }
}

// Repeated keys in the mappings of `n`: merging over a base would keep only
// one of them silently, so a file with a base is checked before the merge.
void find_duplicates(const YAML::Node& n, const std::string& path, const std::string& file,
                     std::vector<std::string>& out) {
  if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i)
      find_duplicates(n[i], path + "[" + std::to_string(i) + "]", file, out);
    return;
  }
  if (!n.IsMap())
    return;
  std::map<std::string, int> seen;
  for (const auto& kv : n) {
    auto key = kv.first.Scalar();
    auto sub = path.empty() ? key : path + "." + key;
    auto [first, inserted] = seen.emplace(key, kv.first.Mark().line);
    if (!inserted) {
      out.push_back(where(file, kv.first.Mark()) + ": " + sub + ": duplicate key '" + key +
                    "' (first given at line " + std::to_string(first->second + 1) + ")");
      continue;
    }
    find_duplicates(kv.second, sub, file, out);
  }
}

// Reads a config file's text (from disk, or from the files a client sent).
using source_reader = std::function<expected<std::string>(const std::string& path)>;

expected<std::string> read_from_disk(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return make_error(errc::io_error, path + ": cannot open the config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

expected<yaml_document> load_file(const std::string& path, int depth, const source_reader& read) {
  auto text = read(path);
  if (!text)
    return text.error();
  auto doc = parse(*text, path);
  if (!doc)
    return doc;
  auto root = doc->impl_->root;
  auto base_node = root["base"];
  if (!base_node.IsDefined())
    return doc;
  if (!base_node.IsScalar() || base_node.Scalar().empty())
    return make_error(errc::invalid_config,
                      where(path, base_node.Mark()) + ": base: expected a file name, found " +
                          kind_of(base_node));
  if (depth >= 8)
    return make_error(errc::invalid_config, where(path, base_node.Mark()) +
                                                ": base: more than 8 levels of base files (a cycle?)");
  auto base_path = (std::filesystem::path{path}.parent_path() / base_node.Scalar()).lexically_normal();
  auto base = load_file(base_path.string(), depth + 1, read);
  if (!base)
    return with_prefix(base.error(), where(path, base_node.Mark()) + ": base");
  std::vector<std::string> dups;
  find_duplicates(root, "", path, dups);
  find_duplicates(base->impl_->root, "", base->name(), dups);
  if (!dups.empty())
    return make_error_list(errc::invalid_config, dups);
  root.remove("base");
  auto merged = base->impl_->root; // the base document is ours alone: merge into it
  auto& origins = base->impl_->origins;
  for (const auto& kv : merged) {
    auto key = kv.first.Scalar();
    if (!origins.count(key))
      origins[key] = base->name();
  }
  merge_over(merged, root, "", path, origins);
  doc->impl_->root = merged;
  doc->impl_->origins = std::move(origins);
  return doc;
}

} // namespace

expected<yaml_document> yaml_document::from_file(const std::string& path,
                                                 std::vector<source_file>* sources) {
  return load_file(path, 0, [sources](const std::string& p) -> expected<std::string> {
    auto text = read_from_disk(p);
    if (text && sources)
      sources->push_back({p, *text});
    return text;
  });
}

expected<yaml_document> yaml_document::from_sources(const source_file& main,
                                                    const std::vector<source_file>& bases) {
  std::map<std::string, const std::string*> by_name;
  auto normal = [](const std::string& p) {
    return std::filesystem::path{p}.lexically_normal().string();
  };
  by_name[normal(main.name)] = &main.text;
  for (const auto& b : bases)
    by_name.emplace(normal(b.name), &b.text);
  return load_file(normal(main.name), 0, [&](const std::string& p) -> expected<std::string> {
    auto it = by_name.find(normal(p));
    if (it == by_name.end())
      return make_error(errc::not_found, p + ": this base file was not sent with the spec");
    return *it->second;
  });
}

expected<yaml_document> yaml_document::from_text(const std::string& text, const std::string& name) {
  return parse(text, name);
}

const std::string& yaml_document::name() const {
  return impl_->name;
}

bool yaml_document::empty() const {
  const auto& root = impl_->root;
  return !root || root.IsNull() || (root.IsMap() && root.size() == 0);
}

expected<void> yaml_document::set(std::string_view assignment) {
  const std::string what = "--set " + std::string{assignment};
  auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0)
    return make_error(errc::invalid_argument, what + ": expected KEY.PATH=VALUE");
  std::string path{assignment.substr(0, eq)};
  std::string text{assignment.substr(eq + 1)};
  std::vector<std::string> keys;
  for (size_t start = 0;;) {
    auto dot = path.find('.', start);
    auto key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (key.empty())
      return make_error(errc::invalid_argument, what + ": empty key in '" + path + "'");
    keys.push_back(key);
    if (dot == std::string::npos)
      break;
    start = dot + 1;
  }
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return make_error(errc::parse_error, what + ": value is not valid YAML: " + e.msg);
  }
  // Walk with node handles (YAML::Node assignment rebinds, so keep copies).
  YAML::Node cur = impl_->root;
  std::string walked;
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    walked = join(walked, keys[i]);
    YAML::Node next = cur[keys[i]];
    if (!next.IsDefined() || next.IsNull()) {
      next = YAML::Node(YAML::NodeType::Map);
      cur[keys[i]] = next;
    } else if (!next.IsMap()) {
      return make_error(errc::invalid_argument,
                        what + ": '" + walked + "' is " + kind_of(next) + ", not a mapping");
    }
    cur.reset(next);
  }
  cur[keys.back()] = value;
  impl_->overrides[path] = what;
  return caf::unit;
}

// ---- errors -------------------------------------------------------------------

void config_errors::add(std::string where_, std::string path, std::string message) {
  lines_.push_back(where_ + ": " + (path.empty() ? "" : path + ": ") + message);
}

caf::error config_errors::error() const {
  return make_error_list(errc::invalid_config, lines_);
}

// ---- reader -------------------------------------------------------------------

struct config_reader::node {
  YAML::Node yaml;      // a mapping (or undefined for an absent section)
  std::string path;     // dotted YAML path of this mapping ("" at the root)
  std::set<std::string> read; // keys a field consumed
};

config_reader::config_reader(const yaml_document& doc, config_errors& errors,
                             location_map& locations)
  : node_(std::make_shared<node>(node{doc.impl_->root, "", {}})), doc_(doc), errors_(&errors),
    locations_(&locations) {}

config_reader::config_reader(std::shared_ptr<node> n, const yaml_document& doc,
                             config_errors& errors, location_map& locations)
  : node_(std::move(n)), doc_(doc), errors_(&errors), locations_(&locations) {}

namespace {

struct located {
  YAML::Node value;
  std::string path;
  std::string where;
};

} // namespace

bool config_reader::is_null(std::string_view key) {
  node_->read.insert(std::string{key});
  if (!node_->yaml.IsMap())
    return false;
  auto v = node_->yaml[std::string{key}];
  return v.IsDefined() && v.IsNull();
}

bool config_reader::present(std::string_view key) {
  node_->read.insert(std::string{key});
  if (!node_->yaml.IsMap())
    return false;
  auto v = node_->yaml[std::string{key}];
  return v.IsDefined() && !v.IsNull();
}

namespace {

// The node at `key` of `n`, marked read; nullopt when absent or null.
std::optional<located> lookup(config_reader::node& n, std::string_view key,
                              const yaml_document& doc, location_map& locations) {
  std::string k{key};
  n.read.insert(k);
  auto path = join(n.path, key);
  if (!n.yaml.IsMap())
    return std::nullopt;
  YAML::Node v = n.yaml[k];
  if (!v.IsDefined() || v.IsNull())
    return std::nullopt;
  auto w = locate(doc, path, v.Mark());
  locations[path] = w;
  return located{v, path, w};
}

template <class T>
bool convert_scalar(const YAML::Node& v, T& out) {
  if (!v.IsScalar())
    return false;
  try {
    out = v.as<T>();
    return true;
  } catch (const YAML::Exception&) {
    return false;
  }
}

} // namespace

#define TROUPE_LOOKUP(key)                                                                 \
  auto hit = lookup(*node_, key, doc_, *locations_);                \
  if (!hit)                                                                                \
    return;                                                                                \
  auto fail = [&](const std::string& expected_what) {                                      \
    errors_->add(hit->where, hit->path,                                                    \
                 "expected " + expected_what + ", got " + kind_of(hit->value));            \
  }

void config_reader::read_value(std::string_view key, bool& v) {
  TROUPE_LOOKUP(key);
  // YAML 1.2 booleans only: yaml-cpp also takes yes/no/on/off, which surprise.
  if (hit->value.IsScalar() && (hit->value.Scalar() == "true" || hit->value.Scalar() == "false")) {
    v = hit->value.Scalar() == "true";
    return;
  }
  fail("true or false");
}

void config_reader::read_value(std::string_view key, int64_t& v) {
  TROUPE_LOOKUP(key);
  int64_t x = 0;
  if (convert_scalar(hit->value, x)) {
    v = x;
    return;
  }
  fail("an integer");
}

void config_reader::read_value(std::string_view key, int32_t& v) {
  TROUPE_LOOKUP(key);
  int64_t x = 0;
  if (convert_scalar(hit->value, x) && x >= std::numeric_limits<int32_t>::min() &&
      x <= std::numeric_limits<int32_t>::max()) {
    v = static_cast<int32_t>(x);
    return;
  }
  fail("a 32-bit integer");
}

void config_reader::read_value(std::string_view key, double& v) {
  TROUPE_LOOKUP(key);
  double x = 0;
  if (convert_scalar(hit->value, x) && std::isfinite(x)) {
    v = x;
    return;
  }
  fail("a finite number");
}

void config_reader::read_value(std::string_view key, std::string& v) {
  TROUPE_LOOKUP(key);
  if (!hit->value.IsScalar()) {
    fail("a string");
    return;
  }
  const auto& text = hit->value.Scalar();
  if (auto at = invalid_utf8_at(text); at != std::string_view::npos) {
    errors_->add(hit->where, hit->path,
                 "expected UTF-8 text, got an invalid byte sequence at byte " + std::to_string(at));
    return;
  }
  v = text;
}

namespace {

template <class T>
void read_list(const yaml_document& doc, const located& hit, std::vector<T>& v,
               config_errors& errors, const std::string& what) {
  if (!hit.value.IsSequence()) {
    errors.add(hit.where, hit.path, "expected a list of " + what + ", got " + kind_of(hit.value));
    return;
  }
  std::vector<T> out;
  for (size_t i = 0; i < hit.value.size(); ++i) {
    T x{};
    bool ok = convert_scalar(hit.value[i], x);
    auto why = "expected " + what + ", got " + kind_of(hit.value[i]);
    if constexpr (std::is_same_v<T, std::string>)
      if (auto at = invalid_utf8_at(x); ok && at != std::string_view::npos) {
        ok = false;
        why = "expected UTF-8 text, got an invalid byte sequence at byte " + std::to_string(at);
      }
    if (!ok) {
      auto path = hit.path + "[" + std::to_string(i) + "]";
      errors.add(locate(doc, path, hit.value[i].Mark()), path, why);
      return;
    }
    out.push_back(x);
  }
  v = std::move(out);
}

} // namespace

void config_reader::read_value(std::string_view key, std::vector<int64_t>& v) {
  TROUPE_LOOKUP(key);
  (void)fail;
  read_list(doc_, *hit, v, *errors_, "integers");
}

void config_reader::read_value(std::string_view key, std::vector<double>& v) {
  TROUPE_LOOKUP(key);
  (void)fail;
  read_list(doc_, *hit, v, *errors_, "numbers");
}

void config_reader::read_value(std::string_view key, std::vector<std::string>& v) {
  TROUPE_LOOKUP(key);
  (void)fail;
  read_list(doc_, *hit, v, *errors_, "strings");
}

void config_reader::choice(std::string_view key, std::string& value,
                           std::initializer_list<std::string_view> allowed, std::string_view) {
  read_choice(key, value, std::vector<std::string_view>(allowed));
}

bool config_reader::read_choice(std::string_view key, std::string& value,
                                const std::vector<std::string_view>& allowed) {
  auto hit = lookup(*node_, key, doc_, *locations_);
  if (!hit)
    return false;
  std::string names;
  for (auto a : allowed)
    names += (names.empty() ? "" : ", ") + std::string{a};
  if (hit->value.IsScalar() &&
      std::find(allowed.begin(), allowed.end(), hit->value.Scalar()) != allowed.end()) {
    value = hit->value.Scalar();
    return true;
  }
  errors_->add(hit->where, hit->path, "expected one of " + names + ", got " + kind_of(hit->value));
  return false;
}

#undef TROUPE_LOOKUP

std::optional<config_reader> config_reader::enter(std::string_view key) {
  auto hit = lookup(*node_, key, doc_, *locations_);
  if (!hit)
    return std::nullopt;
  if (!hit->value.IsMap()) {
    errors_->add(hit->where, hit->path, "expected a mapping of keys, got " + kind_of(hit->value));
    return std::nullopt;
  }
  return config_reader{std::make_shared<node>(node{hit->value, hit->path, {}}), doc_, *errors_,
                       *locations_};
}

std::optional<size_t> config_reader::sequence_size(std::string_view key) {
  auto hit = lookup(*node_, key, doc_, *locations_);
  if (!hit)
    return std::nullopt;
  if (!hit->value.IsSequence()) {
    errors_->add(hit->where, hit->path, "expected a list, got " + kind_of(hit->value));
    return std::nullopt;
  }
  for (size_t i = 0; i < hit->value.size(); ++i)
    if (!hit->value[i].IsMap()) {
      auto path = hit->path + "[" + std::to_string(i) + "]";
      errors_->add(locate(doc_, path, hit->value[i].Mark()), path,
                   "expected a mapping of keys, got " + kind_of(hit->value[i]));
      return std::nullopt;
    }
  return hit->value.size();
}

config_reader config_reader::element(std::string_view key, size_t i) {
  auto path = join(node_->path, key) + "[" + std::to_string(i) + "]";
  YAML::Node item = node_->yaml[std::string{key}][i];
  (*locations_)[path] = locate(doc_, path, item.Mark());
  return config_reader{std::make_shared<node>(node{item, path, {}}), doc_, *errors_, *locations_};
}

void config_reader::finish() {
  if (!node_->yaml.IsMap())
    return;
  // yaml-cpp keeps every entry of a map with a repeated key but looks up
  // only the first, so a later value would be silently ignored.
  std::map<std::string, YAML::Mark> seen;
  for (const auto& kv : node_->yaml) {
    auto key = kv.first.Scalar();
    auto [first, inserted] = seen.emplace(key, kv.first.Mark());
    if (!inserted) {
      auto path = join(node_->path, key);
      errors_->add(locate(doc_, path, kv.first.Mark()), path,
                   "duplicate key '" + key + "' (first given at line " +
                       std::to_string(first->second.line + 1) + ")");
      continue;
    }
    if (node_->read.count(key) != 0)
      continue;
    std::string known;
    for (const auto& k : node_->read)
      known += (known.empty() ? "" : ", ") + k;
    auto path = join(node_->path, key);
    errors_->add(locate(doc_, path, kv.first.Mark()), path, "unknown key '" + key + "'" +
                            (known.empty() ? "" : " (known here: " + known + ")"));
  }
}

// ---- writer -------------------------------------------------------------------

namespace {

bool plain_safe(const std::string& s) {
  if (s.empty())
    return false;
  static const std::string specials = ":#{}[],&*!|>'\"%@`";
  if (s.find_first_of(specials) != std::string::npos || s.front() == ' ' || s.back() == ' ' ||
      s.front() == '-' || s.front() == '?')
    return false;
  // Would it read back as something other than a string?
  for (const char* word : {"true", "false", "null", "~", "yes", "no", "on", "off"})
    if (s == word)
      return false;
  try {
    (void)YAML::Node(s).as<double>();
    return false; // looks like a number
  } catch (const YAML::Exception&) {
    return true;
  }
}

std::string quote(const std::string& s) {
  if (plain_safe(s))
    return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

template <class T, class F>
std::string render_list(const std::vector<T>& v, F one) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? ", " : "") + one(v[i]);
  return out + "]";
}

} // namespace

std::string config_writer::render(bool v) {
  return v ? "true" : "false";
}
std::string config_writer::render(int64_t v) {
  return std::to_string(v);
}
std::string config_writer::render(int32_t v) {
  return std::to_string(v);
}
std::string config_writer::render(double v) {
  // Shortest form that reads back exactly (17 significant digits always do);
  // plain notation for magnitudes people write plainly (600, not 6e+02).
  std::string s;
  bool plain = std::fabs(v) >= 1e-4 && std::fabs(v) < 1e15;
  for (int p = 1; p <= 17; ++p) {
    std::ostringstream t;
    t << std::setprecision(p) << v;
    s = t.str();
    if (std::stod(s) == v && !(plain && s.find('e') != std::string::npos))
      break;
  }
  if (s.find_first_of(".eEn") == std::string::npos)
    s += ".0";
  return s;
}
std::string config_writer::render(const std::string& v) {
  return quote(v);
}
std::string config_writer::render(const std::vector<int64_t>& v) {
  return render_list(v, [](int64_t x) { return std::to_string(x); });
}
std::string config_writer::render(const std::vector<double>& v) {
  return render_list(v, [](double x) { return render(x); });
}
std::string config_writer::render(const std::vector<std::string>& v) {
  return render_list(v, [](const std::string& x) { return quote(x); });
}

std::string config_writer::indent() const {
  return std::string(static_cast<size_t>(depth_) * 2, ' ');
}

void config_writer::comment(std::string_view doc) {
  if (!comments || doc.empty())
    return;
  size_t start = 0;
  while (start <= doc.size()) {
    auto nl = doc.find('\n', start);
    auto line = doc.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    out_ += indent() + "# " + std::string{line} + "\n";
    if (nl == std::string_view::npos)
      break;
    start = nl + 1;
  }
}

void config_writer::emit(std::string_view key, const std::string& value, std::string_view doc) {
  comment(doc);
  out_ += indent() + std::string{key} + ": " + value + "\n";
}

void config_writer::emit_choice(std::string_view key, const std::string& value,
                                const std::vector<std::string_view>& allowed, std::string_view doc) {
  std::string d{doc};
  std::string names;
  for (auto a : allowed)
    names += (names.empty() ? "" : ", ") + std::string{a};
  d += (d.empty() ? "" : " ") + std::string{"("} + names + ")";
  emit(key, quote(value), d);
}

void config_writer::open(std::string_view key, std::string_view doc) {
  comment(doc);
  out_ += indent() + std::string{key} + ":\n";
  ++depth_;
  item_open_.push_back(false);
}

void config_writer::open_list(std::string_view key, std::string_view doc, size_t n) {
  comment(doc);
  out_ += indent() + std::string{key} + ":" + (n == 0 ? " []" : "") + "\n";
  ++depth_;
  item_open_.push_back(false);
}

void config_writer::next_item() {
  // "-" on its own line, the item's mapping indented under it.
  if (item_open_.back())
    --depth_;
  out_ += indent() + "-\n";
  ++depth_;
  item_open_.back() = true;
}

void config_writer::close() {
  if (item_open_.back())
    --depth_;
  item_open_.pop_back();
  --depth_;
}

// ---- checks -------------------------------------------------------------------

void config_checks::require(bool ok, const std::string& path, const std::string& message) {
  if (ok)
    return;
  auto it = locations_->find(path);
  errors_->add(it != locations_->end() ? it->second : file_ + " (default)", path, message);
}

} // namespace troupe::runtime
