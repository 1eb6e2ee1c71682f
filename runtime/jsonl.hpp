#pragma once
// JSON Lines reading with errors that say file:line and why, and small JSON
// helpers.

#include "runtime/error.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace troupe::runtime {

/// Calls `on_record(line_number, object)` for every non-blank line of `path`
/// (1-based line numbers). A line that is not a JSON object, or a callback
/// error, stops reading with an error prefixed "<path>:<line>: ".
expected<int64_t> read_jsonl(const std::string& path,
                             const std::function<expected<void>(const nlohmann::json&)>& on_record);

/// NOTE [json nesting]: copying, writing and destroying a JSON value
/// recurse once per level of arrays and objects inside each other, so
/// JSON from outside (datasets, journals, checkpoints' files, tokenizers,
/// tables, requests) is refused beyond this depth before it is parsed:
/// thousands of "[" would otherwise overflow the stack.
inline constexpr int max_json_depth = 256;

/// The byte offset in JSON text `text` where arrays and objects nest deeper
/// than `max_depth`, or npos when they do not (strings are skipped;
/// malformed text is the parser's to refuse).
size_t json_too_deep_at(std::string_view text, int max_depth = max_json_depth);

/// One past the bracket that closes the array or object opening at `start`
/// in JSON text (strings skipped), or npos when it does not close (or none
/// opens there). Finds where one value ends among text that follows it.
size_t json_container_end(std::string_view text, size_t start);

/// The error for text json_too_deep_at refused: parse_error naming `what`,
/// the byte and the limit.
caf::error json_too_deep(const std::string& what, size_t at);

/// A short name of a JSON value's type for messages: "integer", "number",
/// "string", "object", ...
const char* json_type_name(const nlohmann::json& j);

/// `bytes` in base64 (RFC 4648, with padding): arbitrary bytes, invalid
/// UTF-8 included, carried in a JSON string.
std::string base64(std::string_view bytes);

} // namespace troupe::runtime
