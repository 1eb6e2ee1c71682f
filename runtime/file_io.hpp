#pragma once
// Bounded, error-checked file I/O shared by every loader and writer.

#include "runtime/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::runtime {

/// Reads a whole file. Fails with io_error (naming the path and errno text)
/// or with out_of_range when it is larger than `max_bytes`.
expected<std::string> read_file(const std::string& path,
                                uint64_t max_bytes = uint64_t{1} << 32);

/// Size of a regular file in bytes, or not_found / io_error.
expected<uint64_t> file_size(const std::string& path);

/// Writes `bytes` to `path` atomically: a temporary file in the same folder,
/// fsync, rename, fsync of the folder. Readers see the old file or the whole
/// new one, never a part.
expected<void> write_file_atomic(const std::string& path, std::string_view bytes);

/// Why a run could not create and write the folder `path` ("" = it can): a
/// path under /proc, /sys or /dev (/dev/shm aside; links followed), a part
/// of the path that exists and is
/// not a folder, or a nearest existing folder this process cannot write.
/// Nothing is created. A relative path is taken from the working folder.
std::string folder_unwritable_why(const std::string& path);

/// Why `path` cannot be read ("" = it can): missing, not a regular file
/// (`folder` false) or not a folder (`folder` true), or not readable by this
/// process.
std::string unreadable_why(const std::string& path, bool folder);

/// RAII read-only memory map of a whole file (empty files map to size 0).
class mapped_file {
public:
  mapped_file() = default;
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  mapped_file(mapped_file&& other) noexcept;
  mapped_file& operator=(mapped_file&& other) noexcept;
  ~mapped_file();

  /// Maps `path` read-only.
  static expected<mapped_file> open(const std::string& path);

  const uint8_t* data() const noexcept { return data_; }
  uint64_t size() const noexcept { return size_; }

private:
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

} // namespace troupe::runtime
