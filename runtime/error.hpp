#pragma once
// troupe's one error vocabulary. Every fallible function returns
// `caf::expected<T>` or `caf::error`; errors of category "troupe" carry an
// `errc` code and a human-readable context string that says what was
// expected, what was found and where (file, line, YAML path, field).

#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/make_message.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

template <class T>
using expected = caf::expected<T>;
using error = caf::error;

/// Error codes of category "troupe". Never renumber: codes cross processes.
enum class errc : uint8_t {
  /// Not an error.
  none = 0,
  /// A caller passed a value outside the function's contract.
  invalid_argument = 1,
  /// A configuration (YAML job, config.json) is well-formed but invalid.
  invalid_config = 2,
  /// A file or message is malformed (JSON, YAML, safetensors header, ...).
  parse_error = 3,
  /// An operating-system call on a file, pipe or socket failed.
  io_error = 4,
  /// A file, key, tensor, role or actor does not exist.
  not_found = 5,
  /// An index, offset or size lies outside its bounds.
  out_of_range = 6,
  /// A valid request that this build does not support (dtype, arch, device).
  unsupported = 7,
  /// Tensor shapes or dtypes disagree with each other or the contract.
  shape_mismatch = 8,
  /// A bounded wait expired.
  timeout = 9,
  /// A required resource (GPU, peer, process) is unavailable.
  unavailable = 10,
  /// The operation was cancelled by a user or a shutdown.
  cancelled = 11,
  /// A versioned object (weights, checkpoint) has the wrong version.
  version_mismatch = 12,
  /// Data failed an integrity check (checksum, size, truncation).
  corrupted = 13,
  /// A child process or remote peer failed.
  process_failed = 14,
  /// A broken invariant or an unexpected foreign-library failure.
  internal = 15,
  /// A command that the object's current state does not allow (resume a
  /// running job, pause a finished one).
  illegal_state = 16,
  /// A role's actor or process went away while the job needed it: it
  /// died, was killed, or missed its heartbeats (NOTE [supervision] in
  /// actors/rl/supervision.hpp). Only the side that saw it go (a role
  /// proxy, a request to a dead actor) says so; an error a role returns
  /// never has this code.
  lost = 17,
};

/// Number of errc values (for exhaustive tests and mappings).
inline constexpr uint8_t errc_count = 18;

/// The stable lowercase name of an errc value ("invalid_argument").
std::string_view to_string(errc x) noexcept;

/// The CAF error category atom of troupe errors.
caf::atom_value error_category() noexcept;

/// Builds a troupe error with a context message.
caf::error make_error(errc code, std::string context);
/// Builds a troupe error without context.
caf::error make_error(errc code);

/// Returns the errc of `err`, `errc::none` for no error, or `errc::internal`
/// for an error of another category.
errc code_of(const caf::error& err) noexcept;

/// The context message of a troupe error ("" when it has none).
std::string context_of(const caf::error& err);

/// The violations of an error made by make_error_list (each one on its
/// own), else its context as the only one ({} for none).
std::vector<std::string> violations_of(const caf::error& err);
/// Renders an error for users: "invalid_argument: <context>".
std::string describe(const caf::error& err);

/// Collected validation violations as one error of `code`, joined by "; "
/// (no error when `violations` is empty).
caf::error make_error_list(errc code, const std::vector<std::string>& violations);

/// Prepends `prefix + ": "` to the context of a troupe error, keeping the
/// code (used to add file names or YAML paths as an error travels up).
caf::error with_prefix(const caf::error& err, std::string_view prefix);

} // namespace troupe
