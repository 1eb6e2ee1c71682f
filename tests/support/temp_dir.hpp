#pragma once
// A fresh temporary directory per test, removed with its contents at scope end.

#include <filesystem>
#include <string>

namespace troupe::test {

class temp_dir {
public:
  temp_dir();
  ~temp_dir();
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// Path of `name` inside the directory.
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  /// Writes `content` to `name` inside the directory and returns its path.
  std::string write(const std::string& name, const std::string& content) const;

private:
  std::filesystem::path path_;
};

} // namespace troupe::test
