#include "actors/rl/datasets.hpp"

#include "runtime/file_io.hpp"
#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <type_traits>
#include <utility>

namespace troupe::actors::rl {

namespace {

using json = nlohmann::json;

// The fields of each row type, in file order, as (key, member pointer)
// pairs; `Row` may be const-qualified.

template <class Row>
requires std::is_same_v<std::remove_const_t<Row>, example>
auto fields(Row& r) {
  return std::array{std::pair{std::string_view{"prompt"}, &r.prompt},
                    std::pair{std::string_view{"answer"}, &r.answer}};
}

template <class Row>
requires std::is_same_v<std::remove_const_t<Row>, demonstration>
auto fields(Row& r) {
  return std::array{std::pair{std::string_view{"prompt"}, &r.prompt},
                    std::pair{std::string_view{"response"}, &r.response}};
}

template <class Row>
requires std::is_same_v<std::remove_const_t<Row>, preference_pair>
auto fields(Row& r) {
  return std::array{std::pair{std::string_view{"prompt"}, &r.prompt},
                    std::pair{std::string_view{"chosen"}, &r.chosen},
                    std::pair{std::string_view{"rejected"}, &r.rejected}};
}

/// `key` in double quotes. (Appending avoids `"literal" + std::string&&`,
/// which GCC 12 flags with a false -Wstringop-overflow.)
std::string quoted(std::string_view key) {
  std::string out;
  out.reserve(key.size() + 2);
  out += '"';
  out += key;
  out += '"';
  return out;
}

/// What is wrong with a row whose fields are all strings ("" if nothing).
/// Loading and saving share these rules, so every saved file loads back.
template <class Row>
std::string row_problem(const Row& r) {
  for (auto [key, value] : fields(r))
    if (value->empty())
      return "field " + quoted(key) + ": expected a non-empty string";
  if constexpr (std::is_same_v<Row, preference_pair>)
    if (r.chosen == r.rejected)
      return "fields \"chosen\" and \"rejected\": expected different strings, got equal ones";
  return {};
}

template <class Row>
expected<std::vector<Row>> load_rows(const std::string& path) {
  std::vector<Row> rows;
  auto records = runtime::read_jsonl(path, [&rows](const json& j) -> expected<void> {
    Row r;
    for (auto [key, member] : fields(r)) {
      auto it = j.find(key);
      if (it == j.end())
        return make_error(errc::parse_error,
                          "field " + quoted(key) + ": missing, expected a string");
      if (!it->is_string())
        return make_error(errc::parse_error, "field " + quoted(key) + ": expected a string, got " +
                                                 std::string{it->type_name()});
      *member = it->template get<std::string>();
    }
    if (auto problem = row_problem(r); !problem.empty())
      return make_error(errc::parse_error, std::move(problem));
    rows.push_back(std::move(r));
    return caf::unit;
  });
  if (!records)
    return records.error();
  if (*records == 0)
    return make_error(errc::parse_error, path + ": no records");
  return rows;
}

/// Writes one compact JSON object per line. Refuses (invalid_argument, naming
/// the 1-based row, which is also its line) what load_rows would reject, and
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
    // Keys in file order (json objects sort theirs); values escaped by the
    // JSON library, with non-ASCII text kept as UTF-8.
    text += '{';
    bool first = true;
    for (auto [key, value] : fields(rows[i])) {
      std::string encoded;
      try {
        encoded = json(*value).dump(-1, ' ', false, json::error_handler_t::strict);
      } catch (const json::exception&) {
        return make_error(errc::invalid_argument,
                          where + ": field " + quoted(key) + ": expected valid UTF-8");
      }
      if (!first)
        text += ',';
      text += quoted(key);
      text += ':';
      text += encoded;
      first = false;
    }
    text += "}\n";
  }
  return runtime::write_file_atomic(path, text);
}

} // namespace

expected<std::vector<example>> load_examples(const std::string& path) {
  return load_rows<example>(path);
}

expected<std::vector<demonstration>> load_demonstrations(const std::string& path) {
  return load_rows<demonstration>(path);
}

expected<std::vector<preference_pair>> load_preferences(const std::string& path) {
  return load_rows<preference_pair>(path);
}

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
