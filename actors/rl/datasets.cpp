#include "actors/rl/datasets.hpp"

#include "runtime/jsonl.hpp"

#include "runtime/file_io.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <type_traits>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

namespace troupe::actors::rl {

namespace {

// Rows keep their keys in file order (a chat template may print a
// message's keys, or a tool call's arguments, as they came).
using json = nlohmann::ordered_json;

/// `key` in double quotes. (Appending avoids `"literal" + std::string&&`,
/// which GCC 12 flags with a false -Wstringop-overflow.)
std::string in_quotes(std::string_view key) {
  std::string out;
  out.reserve(key.size() + 2);
  out += '"';
  out += key;
  out += '"';
  return out;
}

std::string type_of(const json& j) {
  return j.type_name();
}

caf::error field_error(std::string_view key, const std::string& what) {
  return make_error(errc::parse_error, "field " + in_quotes(key) + ": " + what);
}

// ---- reading a row's fields -------------------------------------------------------

/// The field `key` of `row`: the literal key, else a dotted path; null when
/// absent.
const json* find_field(const json& row, const std::string& key) {
  if (auto it = row.find(key); it != row.end())
    return &*it;
  const json* at = &row;
  size_t start = 0;
  for (;;) {
    auto dot = key.find('.', start);
    if (dot == std::string::npos && start == 0)
      return nullptr; // no dots: the literal key only
    auto part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    auto it = at->is_object() ? at->find(part) : at->end();
    if (!at->is_object() || it == at->end())
      return nullptr;
    at = &*it;
    if (dot == std::string::npos)
      return at;
    start = dot + 1;
  }
}

/// A required non-empty string field (numbers accepted where `numbers`).
expected<std::string> text_field(const json& row, const std::string& key, bool numbers = false) {
  const json* f = find_field(row, key);
  if (f == nullptr)
    return field_error(key, "missing, expected a string");
  std::string out;
  if (f->is_string())
    out = f->get<std::string>();
  else if (numbers && f->is_number())
    out = f->is_number_float() ? f->dump() : std::to_string(f->get<int64_t>());
  else
    return field_error(key, std::string{"expected a string"} + (numbers ? " or a number" : "") +
                                ", got " + type_of(*f));
  if (out.empty())
    return field_error(key, "expected a non-empty string");
  return out;
}

/// JSON text without escaping non-ASCII; invalid UTF-8 is an error at `key`.
expected<std::string> dump_field(const json& j, std::string_view key) {
  try {
    return j.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception&) {
    return field_error(key, "expected valid UTF-8");
  }
}

/// A conversation's messages checked: a non-empty list of objects with a
/// string role and string (or null) content.
expected<void> check_messages(const json& m, std::string_view key) {
  if (!m.is_array() || m.empty())
    return field_error(key, std::string{"expected a non-empty list of messages, got "} +
                                (m.is_array() ? "an empty list" : type_of(m)));
  for (size_t i = 0; i < m.size(); ++i) {
    auto at = std::string{key} + "[" + std::to_string(i) + "]";
    const auto& msg = m[i];
    if (!msg.is_object())
      return field_error(at, std::string{"expected a message object, got "} + type_of(msg));
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string() || role->get<std::string>().empty())
      return field_error(at + ".role", "expected a non-empty string");
    auto content = msg.find("content");
    if (content != msg.end() && !content->is_string() && !content->is_null())
      return field_error(at + ".content",
                         std::string{"expected a string or null, got "} + type_of(*content));
  }
  return {};
}

bool is_assistant(const json& msg) {
  return msg["role"] == "assistant";
}

std::string content_of(const json& msg) {
  auto c = msg.find("content");
  return c != msg.end() && c->is_string() ? c->get<std::string>() : std::string{};
}

/// A row's prompt: plain text, or a conversation (its messages, and the last
/// user message as the display prompt).
struct prompt_part {
  std::string text;
  json messages; // null for a plain prompt
  std::string messages_key;
};

expected<prompt_part> read_prompt(const json& row, const dataset_fields& f) {
  const json* p = find_field(row, f.prompt);
  const json* m = find_field(row, f.messages);
  if (p != nullptr && m != nullptr && !p->is_array())
    return field_error(f.prompt, "the row has both a prompt and messages (" +
                                     in_quotes(f.messages) + "): expected one of them");
  prompt_part out;
  if (p != nullptr && p->is_array()) {
    m = p;
    out.messages_key = f.prompt;
  } else if (m != nullptr) {
    out.messages_key = f.messages;
  }
  if (m == nullptr) {
    auto text = text_field(row, f.prompt);
    if (!text)
      return text.error();
    out.text = std::move(*text);
    return out;
  }
  if (auto ok = check_messages(*m, out.messages_key); !ok)
    return ok.error();
  out.messages = *m;
  for (const auto& msg : *m)
    if (msg["role"] == "user")
      out.text = content_of(msg);
  return out;
}

/// Sets `messages` (the conversation's JSON) and `prompt`.
expected<void> store_prompt(prompt_part& p, std::string& prompt, std::string& messages) {
  prompt = std::move(p.text);
  if (p.messages.is_null())
    return {};
  auto text = dump_field(p.messages, p.messages_key);
  if (!text)
    return text.error();
  messages = std::move(*text);
  return {};
}

template <class Row>
expected<Row> row_from_json(const json& row, const dataset_fields& f);

template <>
expected<example> row_from_json<example>(const json& row, const dataset_fields& f) {
  auto p = read_prompt(row, f);
  if (!p)
    return p.error();
  example e;
  bool answer_in_chat = !p->messages.is_null() && is_assistant(p->messages.back()) &&
                        find_field(row, f.answer) == nullptr;
  if (answer_in_chat) {
    e.answer = content_of(p->messages.back());
    p->messages.erase(p->messages.end() - 1);
    if (e.answer.empty() || p->messages.empty())
      return field_error(p->messages_key, "a conversation's final assistant message gives the "
                                          "answer: expected its content and a prompt before it");
  } else {
    auto a = text_field(row, f.answer, true);
    if (!a)
      return a.error();
    e.answer = std::move(*a);
  }
  if (auto ok = store_prompt(*p, e.prompt, e.messages); !ok)
    return ok.error();
  if (const json* meta = find_field(row, f.metadata); meta != nullptr && !meta->is_null()) {
    auto text = dump_field(*meta, f.metadata);
    if (!text)
      return text.error();
    e.metadata = std::move(*text);
  }
  return e;
}

/// Where a conversation's tool-using turns begin: after its last user (or
/// system) message, when a tool message follows it; 0 = it has none.
size_t tool_turns_begin(const json& messages) {
  size_t begin = 0;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i]["role"] == "user" || messages[i]["role"] == "system")
      begin = i + 1;
  for (size_t i = begin; i < messages.size(); ++i)
    if (messages[i]["role"] == "tool")
      return begin;
  return 0;
}

/// A multi-turn demonstration's turns (NOTE [demonstration turns]): the
/// messages from `begin` on, assistant and tool messages only, the last an
/// assistant answer with content.
expected<void> take_tool_turns(prompt_part& p, size_t begin, demonstration& d) {
  auto& m = p.messages;
  for (size_t i = begin; i < m.size(); ++i) {
    const auto role = m[i]["role"].get<std::string>();
    if (role != "assistant" && role != "tool")
      return field_error(p.messages_key + "[" + std::to_string(i) + "].role",
                         "a tool-using demonstration's turns are assistant and tool messages, "
                         "got '" +
                             role + "'");
  }
  if (!is_assistant(m.back()) || content_of(m.back()).empty())
    return field_error(p.messages_key, "a tool-using demonstration must end in an assistant "
                                       "message with content (the answer)");
  auto turns = dump_field(json(m.begin() + static_cast<long>(begin), m.end()), p.messages_key);
  if (!turns)
    return turns.error();
  d.turns = std::move(*turns);
  d.response = content_of(m.back());
  m.erase(m.begin() + static_cast<long>(begin), m.end());
  return {};
}

template <>
expected<demonstration> row_from_json<demonstration>(const json& row, const dataset_fields& f) {
  auto p = read_prompt(row, f);
  if (!p)
    return p.error();
  demonstration d;
  if (const json* tools = find_field(row, "tools"); tools != nullptr && !tools->is_null()) {
    if (!tools->is_array())
      return field_error("tools", std::string{"expected a list of tools, got "} + type_of(*tools));
    auto text = dump_field(*tools, "tools");
    if (!text)
      return text.error();
    d.tools = std::move(*text);
  }
  const size_t turns_at = p->messages.is_null() ? 0 : tool_turns_begin(p->messages);
  if (turns_at > 0 && find_field(row, f.response) == nullptr) {
    if (auto ok = take_tool_turns(*p, turns_at, d); !ok)
      return ok.error();
  } else if (!p->messages.is_null() && find_field(row, f.response) == nullptr) {
    if (!is_assistant(p->messages.back()) || content_of(p->messages.back()).empty() ||
        p->messages.size() < 2)
      return field_error(p->messages_key, "a demonstration conversation must end in an assistant "
                                          "message with content, after the prompt");
    d.response = content_of(p->messages.back());
    p->messages.erase(p->messages.end() - 1);
  } else {
    auto r = text_field(row, f.response);
    if (!r)
      return r.error();
    d.response = std::move(*r);
  }
  if (auto ok = store_prompt(*p, d.prompt, d.messages); !ok)
    return ok.error();
  return d;
}

template <>
expected<preference_pair> row_from_json<preference_pair>(const json& row, const dataset_fields& f) {
  auto p = read_prompt(row, f);
  if (!p)
    return p.error();
  preference_pair pp;
  auto c = text_field(row, f.chosen);
  if (!c)
    return c.error();
  auto r = text_field(row, f.rejected);
  if (!r)
    return r.error();
  if (*c == *r)
    return make_error(errc::parse_error, "fields " + in_quotes(f.chosen) + " and " +
                                             in_quotes(f.rejected) +
                                             ": expected different strings, got equal ones");
  pp.chosen = std::move(*c);
  pp.rejected = std::move(*r);
  if (auto ok = store_prompt(*p, pp.prompt, pp.messages); !ok)
    return ok.error();
  return pp;
}

} // namespace

// ---- indexed files --------------------------------------------------------------------

/// A dataset file's kept rows: their byte ranges and lines (JSONL), or the
/// parsed rows (JSON).
class dataset_source {
public:
  struct line_ref {
    int64_t offset = 0;
    uint32_t length = 0;
    uint32_t line = 0;
  };

  std::string path;
  dataset_fields fields;
  bool jsonl = true;
  int fd = -1;
  std::vector<line_ref> lines;  // JSONL
  std::vector<json> parsed;     // JSON
  std::vector<int64_t> numbers; // JSON: each kept row's place in the array (1-based)

  ~dataset_source() {
    if (fd >= 0)
      ::close(fd);
  }

  bool is_jsonl() const { return jsonl; }
  int64_t size() const {
    return is_jsonl() ? static_cast<int64_t>(lines.size()) : static_cast<int64_t>(parsed.size());
  }

  std::string where(int64_t i) const {
    auto k = static_cast<size_t>(i);
    return is_jsonl() ? path + ":" + std::to_string(lines[k].line)
                      : path + ": row " + std::to_string(numbers[k]);
  }

  expected<json> read(int64_t i) const {
    if (!is_jsonl())
      return parsed[static_cast<size_t>(i)];
    const auto& ref = lines[static_cast<size_t>(i)];
    std::string text(ref.length, '\0');
    auto n = ::pread(fd, text.data(), ref.length, ref.offset);
    if (n != static_cast<ssize_t>(ref.length))
      return make_error(errc::io_error, where(i) + ": cannot read the row back (" +
                                            (n < 0 ? std::strerror(errno) : "the file shrank") +
                                            ")");
    auto j = runtime::json_too_deep_at(text) == std::string_view::npos
                 ? json::parse(text, nullptr, false)
                 : json(json::value_t::discarded);
    if (j.is_discarded() || !j.is_object())
      return make_error(errc::corrupted, where(i) + ": the row changed since the file was opened");
    return j;
  }
};

// ---- row tables ---------------------------------------------------------------------

template <class Row>
row_table<Row>::row_table(std::vector<Row> rows) : memory_(std::move(rows)) {}

template <class Row>
row_table<Row>::row_table(std::shared_ptr<const dataset_source> src) : source_(std::move(src)) {}

template <class Row>
int64_t row_table<Row>::base_size() const {
  return source_ ? source_->size() : static_cast<int64_t>(memory_.size());
}

template <class Row>
int64_t row_table<Row>::size() const {
  return picked_ ? static_cast<int64_t>(picked_->size()) : base_size();
}

template <class Row>
expected<Row> row_table<Row>::at(int64_t i) const {
  if (i < 0 || i >= size())
    return make_error(errc::out_of_range,
                      "row " + std::to_string(i) + " of " + std::to_string(size()));
  auto k = picked_ ? (*picked_)[static_cast<size_t>(i)] : i;
  if (!source_)
    return memory_[static_cast<size_t>(k)];
  auto j = source_->read(k);
  if (!j)
    return j.error();
  auto row = row_from_json<Row>(*j, source_->fields);
  if (!row)
    return with_prefix(row.error(), source_->where(k));
  return row;
}

template <class Row>
expected<std::vector<Row>> row_table<Row>::rows(const std::vector<int64_t>& indices) const {
  std::vector<Row> out;
  out.reserve(indices.size());
  for (auto i : indices) {
    auto r = at(i);
    if (!r)
      return r.error();
    out.push_back(std::move(*r));
  }
  return out;
}

template <class Row>
expected<std::vector<Row>> row_table<Row>::all() const {
  std::vector<int64_t> every(static_cast<size_t>(size()));
  for (size_t i = 0; i < every.size(); ++i)
    every[i] = static_cast<int64_t>(i);
  return rows(every);
}

template <class Row>
row_table<Row> row_table<Row>::subset(std::vector<int64_t> indices) const {
  row_table out = *this;
  if (picked_)
    for (auto& i : indices)
      i = (*picked_)[static_cast<size_t>(i)];
  out.picked_ = std::make_shared<const std::vector<int64_t>>(std::move(indices));
  return out;
}

template class row_table<example>;
template class row_table<demonstration>;
template class row_table<preference_pair>;

// ---- opening --------------------------------------------------------------------------

namespace {

bool blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

bool is_json_array_file(const std::string& path) {
  return path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
}

/// Calls `on_line(offset, line_number, text)` for every non-blank line of a
/// JSONL file, reading it in blocks (a trailing '\r' is dropped).
template <class F>
expected<void> scan_lines(int fd, const std::string& path, F&& on_line) {
  constexpr size_t block = 1 << 20;
  std::string carry;
  std::vector<char> buf(block);
  int64_t offset = 0; // of carry's first byte
  uint32_t line_no = 0;
  for (;;) {
    auto n = ::read(fd, buf.data(), block);
    if (n < 0)
      return make_error(errc::io_error, "cannot read " + path + ": " + std::strerror(errno));
    if (n == 0)
      break;
    carry.append(buf.data(), static_cast<size_t>(n));
    size_t start = 0;
    for (auto nl = carry.find('\n'); nl != std::string::npos; nl = carry.find('\n', start)) {
      std::string_view line{carry.data() + start, nl - start};
      ++line_no;
      if (!blank(line))
        if (auto ok = on_line(offset + static_cast<int64_t>(start), line_no, line); !ok)
          return ok;
      start = nl + 1;
    }
    carry.erase(0, start);
    offset += static_cast<int64_t>(start);
  }
  if (!blank(carry))
    return on_line(offset, line_no + 1, std::string_view{carry});
  return {};
}

/// A JSONL line as a row: the parsed object, or the reason it is not one.
expected<json> parse_line(std::string_view line) {
  if (!line.empty() && line.back() == '\r')
    line.remove_suffix(1);
  if (auto at = runtime::json_too_deep_at(line); at != std::string_view::npos)
    return runtime::json_too_deep("the row", at);
  auto j = json::parse(line, nullptr, false);
  if (j.is_discarded())
    return make_error(errc::parse_error, "not valid JSON");
  if (!j.is_object())
    return make_error(errc::parse_error,
                      std::string{"expected a JSON object, got "} + j.type_name());
  return j;
}

template <class Row>
expected<void> index_jsonl(dataset_source& src, const keep_row<Row>& keep, int64_t& dropped) {
  src.fd = ::open(src.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (src.fd < 0)
    return make_error(errc::io_error, "cannot open " + src.path + ": " + std::strerror(errno));
  return scan_lines(src.fd, src.path,
                    [&](int64_t offset, uint32_t line_no, std::string_view text) -> expected<void> {
                      auto where = src.path + ":" + std::to_string(line_no);
                      auto j = parse_line(text);
                      auto row = j ? row_from_json<Row>(*j, src.fields) : expected<Row>{j.error()};
                      auto kept = row && keep ? keep(*row) : expected<bool>{true};
                      if (!row || !kept)
                        return with_prefix(row ? kept.error() : row.error(), where);
                      if (!*kept) {
                        ++dropped;
                        return {};
                      }
                      auto length = text.size() - (!text.empty() && text.back() == '\r' ? 1 : 0);
                      src.lines.push_back({offset, static_cast<uint32_t>(length), line_no});
                      return {};
                    });
}

template <class Row>
expected<void> index_json(dataset_source& src, const keep_row<Row>& keep, int64_t& dropped) {
  auto text = runtime::read_file(src.path);
  if (!text)
    return text.error();
  if (auto at = runtime::json_too_deep_at(*text); at != std::string_view::npos)
    return runtime::json_too_deep(src.path, at);
  auto j = json::parse(*text, nullptr, false);
  if (j.is_discarded())
    return make_error(errc::parse_error, src.path + ": not valid JSON");
  if (!j.is_array())
    return make_error(errc::parse_error, src.path + ": expected a JSON array of row objects, got " +
                                             std::string{j.type_name()});
  for (size_t i = 0; i < j.size(); ++i) {
    auto where = src.path + ": row " + std::to_string(i + 1);
    if (!j[i].is_object())
      return make_error(errc::parse_error,
                        where + ": expected a JSON object, got " + std::string{j[i].type_name()});
    auto row = row_from_json<Row>(j[i], src.fields);
    auto kept = row && keep ? keep(*row) : expected<bool>{true};
    if (!row || !kept)
      return with_prefix(row ? kept.error() : row.error(), where);
    if (!*kept) {
      ++dropped;
      continue;
    }
    src.parsed.push_back(std::move(j[i]));
    src.numbers.push_back(static_cast<int64_t>(i + 1));
  }
  return {};
}

} // namespace

template <class Row>
expected<row_table<Row>> open_rows(const std::string& path, const dataset_fields& fields,
                                   const keep_row<Row>& keep, int64_t* dropped) {
  auto src = std::make_shared<dataset_source>();
  src->path = path;
  src->fields = fields;
  src->jsonl = !is_json_array_file(path);
  int64_t gone = 0;
  auto ok = !src->jsonl ? index_json<Row>(*src, keep, gone) : index_jsonl<Row>(*src, keep, gone);
  if (!ok)
    return ok.error();
  if (src->size() + gone == 0)
    return make_error(errc::parse_error, path + ": no records");
  if (dropped != nullptr)
    *dropped = gone;
  return row_table<Row>{std::shared_ptr<const dataset_source>{std::move(src)}};
}

template expected<row_table<example>> open_rows(const std::string&, const dataset_fields&,
                                                const keep_row<example>&, int64_t*);
template expected<row_table<demonstration>> open_rows(const std::string&, const dataset_fields&,
                                                      const keep_row<demonstration>&, int64_t*);
template expected<row_table<preference_pair>> open_rows(const std::string&, const dataset_fields&,
                                                        const keep_row<preference_pair>&, int64_t*);

namespace {

template <class Row>
expected<std::vector<Row>> load_whole(const std::string& path, const dataset_fields& fields) {
  auto t = open_rows<Row>(path, fields);
  if (!t)
    return t.error();
  return t->all();
}

} // namespace

expected<std::vector<example>> load_examples(const std::string& path,
                                             const dataset_fields& fields) {
  return load_whole<example>(path, fields);
}

expected<std::vector<demonstration>> load_demonstrations(const std::string& path,
                                                         const dataset_fields& fields) {
  return load_whole<demonstration>(path, fields);
}

expected<std::vector<preference_pair>> load_preferences(const std::string& path,
                                                        const dataset_fields& fields) {
  return load_whole<preference_pair>(path, fields);
}

expected<int64_t> check_rows(const std::string& path, const dataset_fields& fields, row_use use) {
  auto count = [](const auto& t) -> expected<int64_t> {
    if (!t)
      return t.error();
    return t->size();
  };
  switch (use) {
  case row_use::prompts:
    return count(open_rows<example>(path, fields));
  case row_use::demos:
    return count(open_rows<demonstration>(path, fields));
  case row_use::preferences:
    return count(open_rows<preference_pair>(path, fields));
  }
  return make_error(errc::invalid_argument, "check_rows: unknown use");
}

// ---- writing --------------------------------------------------------------------------

namespace {

// The fields of each row type in file order, as (key, member pointer).
auto fields_of(const example& r) {
  return std::array{std::pair{std::string_view{"prompt"}, &r.prompt},
                    std::pair{std::string_view{"answer"}, &r.answer}};
}
auto fields_of(const demonstration& r) {
  return std::array{std::pair{std::string_view{"prompt"}, &r.prompt},
                    std::pair{std::string_view{"response"}, &r.response}};
}
auto fields_of(const preference_pair& r) {
  return std::array{std::pair{std::string_view{"prompt"}, &r.prompt},
                    std::pair{std::string_view{"chosen"}, &r.chosen},
                    std::pair{std::string_view{"rejected"}, &r.rejected}};
}

/// What the loader would reject in a plain row ("" if nothing).
template <class Row>
std::string row_problem(const Row& r) {
  if (!r.messages.empty())
    return "a conversation row: save_* writes plain prompts only";
  for (auto [key, value] : fields_of(r))
    if (value->empty())
      return "field " + in_quotes(key) + ": expected a non-empty string";
  if constexpr (std::is_same_v<Row, preference_pair>)
    if (r.chosen == r.rejected)
      return "fields \"chosen\" and \"rejected\": expected different strings, got equal ones";
  return {};
}

/// Writes one compact JSON object per line. Refuses (invalid_argument, naming
/// the 1-based row, which is also its line) what the loader would reject, and
/// strings that are not valid UTF-8, before touching the file.
template <class Row>
expected<void> save_rows(const std::string& path, const std::vector<Row>& rows) {
  if (rows.empty())
    return make_error(errc::invalid_argument, path + ": no records to write");
  std::string text;
  for (size_t i = 0; i < rows.size(); ++i) {
    auto where = path + ": row " + std::to_string(i + 1);
    if (auto problem = row_problem(rows[i]); !problem.empty())
      return make_error(errc::invalid_argument, where + ": " + problem);
    // Keys in file order (json objects sort theirs).
    text += '{';
    bool first = true;
    for (auto [key, value] : fields_of(rows[i])) {
      auto encoded = dump_field(json(*value), key);
      if (!encoded)
        return make_error(errc::invalid_argument, where + ": " + context_of(encoded.error()));
      if (!first)
        text += ',';
      text += in_quotes(key);
      text += ':';
      text += *encoded;
      first = false;
    }
    text += "}\n";
  }
  return runtime::write_file_atomic(path, text);
}

} // namespace

expected<void> save_examples(const std::string& path, const std::vector<example>& rows) {
  return save_rows(path, rows);
}

expected<void> save_demonstrations(const std::string& path,
                                   const std::vector<demonstration>& rows) {
  return save_rows(path, rows);
}

expected<void> save_preferences(const std::string& path, const std::vector<preference_pair>& rows) {
  return save_rows(path, rows);
}

} // namespace troupe::actors::rl
