#pragma once
// Atomic, verified checkpoints: a folder of named blobs plus a manifest.
//
// NOTE [checkpoint commit]: a checkpoint is written into "<name>.tmp" (every
// file fsynced, then manifest.json with each file's size and FNV-1a 64
// checksum, then the folder fsynced), renamed to "<name>", and only then is
// the pointer file "latest" in the parent replaced atomically. A process
// killed at any point leaves either the previous checkpoint as latest or the
// new one complete; read_checkpoint verifies sizes and checksums, so a
// damaged folder is reported (corrupted), never half-loaded.

#include "runtime/error.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace troupe::runtime {

using checkpoint_files = std::map<std::string, std::string>;

/// FNV-1a 64 of `bytes` as 16 hex digits.
std::string fnv1a64_hex(std::string_view bytes);

/// Writes `files` (name → bytes; plain names, no '/') as checkpoint `name`
/// under `parent` and points parent/latest at it. Older checkpoints beyond
/// the newest `keep` are deleted afterwards (0 = keep all).
expected<void> write_checkpoint(const std::string& parent, const std::string& name,
                                const checkpoint_files& files, int keep = 2);

/// Reads and verifies the checkpoint folder `dir`.
expected<checkpoint_files> read_checkpoint(const std::string& dir);

/// The folder parent/latest points at; not_found when there is none.
expected<std::string> latest_checkpoint(const std::string& parent);

} // namespace troupe::runtime
