#pragma once
// JSONL datasets: one JSON object per line, string fields only.
//   prompts:     {"prompt": "...", "answer": "..."}            (RL, evaluation)
//   demos:       {"prompt": "...", "response": "..."}          (SFT)
//   preferences: {"prompt": "...", "chosen": "...", "rejected": "..."} (RM)
// Extra keys are ignored. A malformed line (not JSON, not an object, a
// missing or non-string field, an empty prompt) fails the load with
// "<file>:<line>: <reason>" naming the field; nothing is returned partially.
// An empty file (no records) is an error too.

#include "actors/rl/tasks.hpp"
#include "runtime/error.hpp"

#include <string>
#include <vector>

namespace troupe::actors::rl {

expected<std::vector<example>> load_examples(const std::string& path);
expected<std::vector<demonstration>> load_demonstrations(const std::string& path);
expected<std::vector<preference_pair>> load_preferences(const std::string& path);

/// Writers of the same formats (atomic: runtime::write_file_atomic), so the
/// built-in tasks can be exported and edited.
expected<void> save_examples(const std::string& path, const std::vector<example>& rows);
expected<void> save_demonstrations(const std::string& path, const std::vector<demonstration>& rows);
expected<void> save_preferences(const std::string& path, const std::vector<preference_pair>& rows);

} // namespace troupe::actors::rl
