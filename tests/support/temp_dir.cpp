#include "tests/support/temp_dir.hpp"

#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace troupe::test {

temp_dir::temp_dir() {
  auto pattern = (std::filesystem::temp_directory_path() / "troupe-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr)
    throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

temp_dir::~temp_dir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string temp_dir::write(const std::string& name, const std::string& content) const {
  auto p = path_ / name;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out << content;
  return p.string();
}

} // namespace troupe::test
