#pragma once
// Dataset files: JSONL (one JSON object per line) or JSON (an array of
// objects), with configurable field names.
//
// NOTE [dataset files]
// A row's fields are found by key (data.fields); a dotted key reads a nested
// field ("reward_model.ground_truth") when the row has no key of that literal
// name. A row holds a plain prompt (a string) or a conversation: a list of
// messages {"role": string, "content": string or null, ...} under the
// messages key, or under the prompt key itself. The rows of each use:
//   prompts      prompt | messages, answer (a string or a number), metadata
//                (any JSON, optional: passed to the reward). A conversation
//                ending in an assistant message gives that message's content
//                as the answer when the row has no answer field.
//   demos        prompt + response, or messages ending in the assistant
//                message to learn (the response).
//   preferences  prompt | messages, chosen, rejected.
// Extra keys are ignored. A malformed row fails the load with
// "<file>:<line>: <reason>" naming the field ("<file>: row <n>: ..." in a
// JSON array); nothing is returned partially. An empty file is an error too.
//
// JSONL files are indexed, not held: opening one reads it once, checking
// every row, and keeps each kept row's byte offset; rows are read back on
// demand (pread), so a file larger than memory's share streams, and a
// shuffle by seed over the index is exact. JSON files are parsed whole (use
// JSONL for large data).

#include "actors/rl/tasks.hpp"
#include "runtime/error.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace troupe::actors::rl {

/// The keys of a dataset's fields (data.fields).
struct dataset_fields {
  std::string prompt = "prompt";
  std::string messages = "messages";
  std::string answer = "answer";
  std::string response = "response";
  std::string chosen = "chosen";
  std::string rejected = "rejected";
  std::string metadata = "metadata";
};
template <class V>
void visit(V& v, dataset_fields& c) {
  v.field("prompt", c.prompt, "A plain prompt (a string), or a list of messages");
  v.field("messages", c.messages, "A conversation: [{role, content}, ...]");
  v.field("answer", c.answer, "The reference answer the reward checks");
  v.field("response", c.response, "SFT: the demonstration");
  v.field("chosen", c.chosen, "RM: the preferred response");
  v.field("rejected", c.rejected, "RM: the dispreferred response");
  v.field("metadata", c.metadata, "Optional per-row JSON passed to the reward");
}

/// What a row is read as.
enum class row_use : uint8_t { prompts, demos, preferences };

/// An indexed dataset file (datasets.cpp).
class dataset_source;

/// A dataset's rows: held in memory, or a file's kept rows read on demand.
/// Copies share the file; safe to read from several threads.
template <class Row>
class row_table {
public:
  row_table() = default;
  /// Rows held in memory (the built-in tasks).
  explicit row_table(std::vector<Row> rows);
  /// The rows a source kept.
  explicit row_table(std::shared_ptr<const dataset_source> src);

  int64_t size() const;
  bool empty() const { return size() == 0; }
  /// Row `i` (0 <= i < size()), read back from the file when indexed; an
  /// error names the file and line (the file changed under the job).
  expected<Row> at(int64_t i) const;
  /// Rows `indices`, in that order.
  expected<std::vector<Row>> rows(const std::vector<int64_t>& indices) const;
  /// Every row, in order.
  expected<std::vector<Row>> all() const;
  /// A table of rows `indices` of this one, in that order (an eval split).
  row_table subset(std::vector<int64_t> indices) const;

private:
  int64_t base_size() const;
  std::shared_ptr<const dataset_source> source_;
  std::vector<Row> memory_;
  /// This table's rows of the source or memory; all of them when unset.
  std::shared_ptr<const std::vector<int64_t>> picked_;
};

extern template class row_table<example>;
extern template class row_table<demonstration>;
extern template class row_table<preference_pair>;

/// Whether to keep a row (an error fails the load at the row's line).
template <class Row>
using keep_row = std::function<expected<bool>(const Row&)>;

/// Opens a dataset file, checks every row, and keeps those for which `keep`
/// is true (all when it is empty); `dropped` (when given) counts the others.
template <class Row>
expected<row_table<Row>> open_rows(const std::string& path, const dataset_fields& fields,
                                   const keep_row<Row>& keep = {}, int64_t* dropped = nullptr);

/// Reads a dataset file whole (small files, tests).
expected<std::vector<example>> load_examples(const std::string& path,
                                             const dataset_fields& fields = {});
expected<std::vector<demonstration>> load_demonstrations(const std::string& path,
                                                         const dataset_fields& fields = {});
expected<std::vector<preference_pair>> load_preferences(const std::string& path,
                                                        const dataset_fields& fields = {});

/// Checks a dataset file's rows without keeping them; the row count.
expected<int64_t> check_rows(const std::string& path, const dataset_fields& fields, row_use use);

/// Writers of the default-field JSONL formats (atomic:
/// runtime::write_file_atomic), so the built-in tasks can be exported and
/// edited; plain-prompt rows only.
expected<void> save_examples(const std::string& path, const std::vector<example>& rows);
expected<void> save_demonstrations(const std::string& path, const std::vector<demonstration>& rows);
expected<void> save_preferences(const std::string& path, const std::vector<preference_pair>& rows);

} // namespace troupe::actors::rl
