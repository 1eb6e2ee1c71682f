#include "runtime/file_io.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace troupe::runtime {

namespace {

caf::error os_error(std::string_view what, const std::string& path) {
  return make_error(errc::io_error, std::string{what} + " " + path + ": " +
                                        std::strerror(errno));
}

struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0)
      ::close(fd);
  }
};

expected<void> write_all(int fd, std::string_view bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    auto n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return os_error("cannot write", path);
    }
    done += static_cast<size_t>(n);
  }
  return caf::unit;
}

} // namespace

expected<uint64_t> file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return make_error(errc::not_found, "no such file: " + path);
    return os_error("cannot stat", path);
  }
  if (!S_ISREG(st.st_mode))
    return make_error(errc::io_error, "not a regular file: " + path);
  return static_cast<uint64_t>(st.st_size);
}

expected<std::string> read_file(const std::string& path, uint64_t max_bytes) {
  auto size = file_size(path);
  if (!size)
    return size.error();
  if (*size > max_bytes)
    return make_error(errc::out_of_range,
                      path + ": file is " + std::to_string(*size) +
                        " bytes, more than the limit of " +
                        std::to_string(max_bytes));
  fd_guard f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0)
    return os_error("cannot open", path);
  std::string out(*size, '\0');
  size_t done = 0;
  while (done < out.size()) {
    auto n = ::read(f.fd, out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return os_error("cannot read", path);
    }
    if (n == 0)
      break; // file shrank while reading
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

expected<void> write_file_atomic(const std::string& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  fs::path target{path};
  auto dir = target.has_parent_path() ? target.parent_path() : fs::path{"."};
  std::random_device rd;
  auto tmp = (dir / ("." + target.filename().string() + ".tmp." +
                     std::to_string(::getpid()) + "." + std::to_string(rd())))
               .string();
  {
    fd_guard f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
    if (f.fd < 0)
      return os_error("cannot create", tmp);
    auto ok = write_all(f.fd, bytes, tmp);
    if (ok && ::fsync(f.fd) != 0)
      ok = os_error("cannot fsync", tmp);
    if (!ok) {
      ::unlink(tmp.c_str());
      return ok;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    auto err = os_error("cannot rename to", path);
    ::unlink(tmp.c_str());
    return err;
  }
  fd_guard d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd >= 0)
    ::fsync(d.fd);
  return caf::unit;
}

mapped_file::mapped_file(mapped_file&& other) noexcept
  : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

mapped_file& mapped_file::operator=(mapped_file&& other) noexcept {
  if (this != &other) {
    this->~mapped_file();
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

mapped_file::~mapped_file() {
  if (data_ != nullptr && size_ > 0)
    ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

expected<mapped_file> mapped_file::open(const std::string& path) {
  auto size = file_size(path);
  if (!size)
    return size.error();
  mapped_file out;
  if (*size == 0)
    return out;
  fd_guard f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0)
    return os_error("cannot open", path);
  void* p = ::mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (p == MAP_FAILED)
    return os_error("cannot map", path);
  out.data_ = static_cast<const uint8_t*>(p);
  out.size_ = *size;
  return out;
}

std::string folder_unwritable_why(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty())
    return "is empty";
  std::error_code ec;
  auto p = fs::absolute(fs::path{path}, ec).lexically_normal();
  if (ec)
    return "cannot be resolved: " + ec.message();
  // The kernel's folders (through any link): a run's files have no place
  // there; /dev/shm is memory, a fine place for them.
  auto real = fs::weakly_canonical(p, ec);
  if (ec)
    real = p;
  auto under = [](const fs::path& x, const char* folder) {
    auto rel = x.lexically_relative(folder);
    return !rel.empty() && *rel.begin() != "..";
  };
  for (const char* special : {"/proc", "/sys", "/dev"})
    if (under(real, special) && !under(real, "/dev/shm"))
      return "lies under " + std::string{special} + ", where a run cannot write its files";
  for (auto at = p; !at.empty(); at = at.parent_path()) {
    struct stat st {};
    if (::stat(at.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) {
        if (at == at.parent_path())
          break;
        continue;
      }
      return "cannot be examined at " + at.string() + ": " + std::strerror(errno);
    }
    if (!S_ISDIR(st.st_mode))
      return at == p ? "is a file, not a folder" : at.string() + " is a file, not a folder";
    if (::access(at.c_str(), W_OK | X_OK) != 0)
      return at == p ? "is not writable by this process"
                     : "cannot be created: " + at.string() + " is not writable by this process";
    return "";
  }
  return "cannot be created (no existing folder above it)";
}

std::string unreadable_why(const std::string& path, bool folder) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return errno == ENOENT ? "does not exist"
                           : std::string{"cannot be examined: "} + std::strerror(errno);
  if (folder && !S_ISDIR(st.st_mode))
    return "is not a folder";
  if (!folder && !S_ISREG(st.st_mode))
    return S_ISDIR(st.st_mode) ? "is a folder, not a file" : "is not a regular file";
  if (::access(path.c_str(), folder ? (R_OK | X_OK) : R_OK) != 0)
    return "is not readable by this process";
  return "";
}

} // namespace troupe::runtime
