#pragma once
// JSON Lines reading with errors that say file:line and why.

#include "runtime/error.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <string>

namespace troupe::runtime {

/// Calls `on_record(line_number, object)` for every non-blank line of `path`
/// (1-based line numbers). A line that is not a JSON object, or a callback
/// error, stops reading with an error prefixed "<path>:<line>: ".
expected<int64_t> read_jsonl(const std::string& path,
                             const std::function<expected<void>(const nlohmann::json&)>& on_record);

} // namespace troupe::runtime
