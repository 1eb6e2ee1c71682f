#include "runtime/safetensors.hpp"

#include "runtime/jsonl.hpp"

#include "runtime/torch_guard.hpp"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace troupe::runtime {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts need byte swaps");

namespace {

using json = nlohmann::json;

caf::error fail(errc code, const std::string& path, const std::string& what) {
  return make_error(code, path + ": " + what);
}

caf::error os_fail(const std::string& what, const std::string& path) {
  return make_error(errc::io_error, what + " " + path + ": " + std::strerror(errno));
}

struct fd_guard {
  int fd = -1;
  fd_guard() = default;
  explicit fd_guard(int f) : fd(f) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd >= 0)
      ::close(fd);
  }
};

// Reads exactly `n` bytes at `offset`; a short read means the file shrank.
expected<void> read_exact(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(dst);
  uint64_t done = 0;
  while (done < n) {
    auto chunk = std::min<uint64_t>(n - done, uint64_t{1} << 30);
    auto r = ::pread(fd, p + done, chunk, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return os_fail("cannot read", path);
    }
    if (r == 0)
      return fail(errc::corrupted, path,
                  "unexpected end of file at byte " + std::to_string(offset + done) +
                      " (the file was truncated while reading)");
    done += static_cast<uint64_t>(r);
  }
  return caf::unit;
}

expected<void> write_all(int fd, const void* src, uint64_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(src);
  uint64_t done = 0;
  while (done < n) {
    auto chunk = std::min<uint64_t>(n - done, uint64_t{1} << 30);
    auto w = ::write(fd, p + done, chunk);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return os_fail("cannot write", path);
    }
    done += static_cast<uint64_t>(w);
  }
  return caf::unit;
}

// Opens `path` and reads and validates its header.
expected<safetensors_header> open_and_read_header(const std::string& path, fd_guard& f) {
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) {
    if (errno == ENOENT)
      return make_error(errc::not_found, "no such file: " + path);
    return os_fail("cannot open", path);
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0)
    return os_fail("cannot stat", path);
  if (!S_ISREG(st.st_mode))
    return fail(errc::io_error, path, "not a regular file");
  auto file_size = static_cast<uint64_t>(st.st_size);
  unsigned char len_bytes[8] = {};
  if (file_size >= 8)
    if (auto ok = read_exact(f.fd, len_bytes, 8, 0, path); !ok)
      return ok.error();
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | len_bytes[i];
  if (auto ok = check_safetensors_header_length(n, file_size, path); !ok)
    return ok.error();
  std::string text(n, '\0');
  if (auto ok = read_exact(f.fd, text.data(), n, 8, path); !ok)
    return ok.error();
  return parse_safetensors_header(text, file_size - 8 - n, path);
}

std::string tmp_name_for(const std::filesystem::path& target) {
  std::random_device rd;
  auto dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path{"."};
  return (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                 std::to_string(rd())))
      .string();
}

} // namespace

expected<safetensors_header> read_safetensors_header(const std::string& path) {
  fd_guard f;
  return open_and_read_header(path, f);
}

expected<string_map> read_safetensors_metadata(const std::string& path) {
  auto h = read_safetensors_header(path);
  if (!h)
    return h.error();
  return std::move(h->metadata);
}

expected<tensor_map> load_safetensors(const std::string& path, const tensor_target& target) {
  fd_guard f;
  auto header = open_and_read_header(path, f);
  if (!header)
    return header.error();
  for (const auto& t : header->tensors)
    if (!safetensors_dtype_supported(t.dtype))
      return fail(errc::unsupported, path,
                  "tensor '" + t.name + "': dtype '" + t.dtype +
                      "' is not supported (supported: " + safetensors_supported_dtypes() + ")");
  tensor_map out;
  for (const auto& t : header->tensors) {
    const auto type = *safetensors_scalar_type(t.dtype);
    auto tensor = guarded("allocating tensor '" + t.name + "' of " + path, [&] {
      if (target) {
        auto into = target(t.name);
        if (into.defined() && into.device().is_cpu() && into.is_contiguous() &&
            into.scalar_type() == type && into.sizes() == at::IntArrayRef(t.shape))
          return into;
      }
      return at::empty(t.shape, at::TensorOptions().dtype(type).device(at::kCPU));
    });
    if (!tensor)
      return tensor.error();
    auto nbytes = t.data_end - t.data_begin;
    if (nbytes > 0) {
      auto ok =
          read_exact(f.fd, tensor->data_ptr(), nbytes, header->data_start + t.data_begin, path);
      if (!ok)
        return ok.error();
    }
    if (type == at::kBool) {
      const auto* bytes = static_cast<const uint8_t*>(tensor->data_ptr());
      for (uint64_t i = 0; i < nbytes; ++i)
        if (bytes[i] > 1)
          return fail(errc::corrupted, path,
                      "tensor '" + t.name + "': BOOL element " + std::to_string(i) +
                          " has byte value " + std::to_string(bytes[i]) + " (expected 0 or 1)");
    }
    out.emplace(t.name, std::move(*tensor));
  }
  return out;
}

expected<void> save_safetensors(const std::string& path, const tensor_map& tensors,
                                const string_map& metadata) {
  struct planned {
    const std::string* name;
    const at::Tensor* tensor;
    std::string dtype;
    uint64_t element_size;
    uint64_t nbytes;
    uint64_t begin = 0;
  };
  std::vector<planned> plan;
  plan.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__")
      return fail(errc::invalid_argument, path, "'__metadata__' cannot be a tensor name");
    if (!t.defined())
      return fail(errc::invalid_argument, path, "tensor '" + name + "' is undefined");
    if (t.is_sparse() || t.is_quantized())
      return fail(errc::unsupported, path,
                  "tensor '" + name + "': only dense, non-quantized tensors can be saved");
    auto dtype = safetensors_dtype_name(t.scalar_type());
    if (dtype.empty())
      return fail(errc::unsupported, path,
                  "tensor '" + name + "': dtype " + std::string{c10::toString(t.scalar_type())} +
                      " has no safetensors equivalent here (supported: " +
                      safetensors_supported_dtypes() + ")");
    const auto size = safetensors_dtype_size(dtype);
    plan.push_back({&name, &t, std::move(dtype), size, static_cast<uint64_t>(t.numel()) * size});
  }
  // Larger elements first keeps every tensor aligned to its element size.
  std::stable_sort(plan.begin(), plan.end(), [](const planned& a, const planned& b) {
    if (a.element_size != b.element_size)
      return a.element_size > b.element_size;
    return *a.name < *b.name;
  });
  uint64_t offset = 0;
  for (auto& p : plan) {
    p.begin = offset;
    offset += p.nbytes;
  }
  std::sort(plan.begin(), plan.end(),
            [](const planned& a, const planned& b) { return *a.name < *b.name; });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = header["__metadata__"];
    m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata)
      m[k] = v;
  }
  for (const auto& p : plan) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = p.dtype;
    auto shape = nlohmann::ordered_json::array();
    for (auto d : p.tensor->sizes())
      shape.push_back(d);
    e["shape"] = std::move(shape);
    e["data_offsets"] = {p.begin, p.begin + p.nbytes};
    header[*p.name] = std::move(e);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    return fail(errc::invalid_argument, path,
                std::string{"cannot encode the header (names and metadata must be UTF-8): "} +
                    e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::sort(plan.begin(), plan.end(),
            [](const planned& a, const planned& b) { return a.begin < b.begin; });

  namespace fs = std::filesystem;
  auto tmp = tmp_name_for(fs::path{path});
  auto written = [&]() -> expected<void> {
    fd_guard f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
    if (f.fd < 0)
      return os_fail("cannot create", tmp);
    unsigned char len_bytes[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i)
      len_bytes[i] = static_cast<unsigned char>(n >> (8 * i));
    if (auto ok = write_all(f.fd, len_bytes, 8, tmp); !ok)
      return ok;
    if (auto ok = write_all(f.fd, text.data(), text.size(), tmp); !ok)
      return ok;
    for (const auto& p : plan) {
      if (p.nbytes == 0)
        continue;
      auto cpu = guarded("copying tensor '" + *p.name + "' to the CPU for " + path,
                         [&] { return p.tensor->to(at::kCPU).contiguous(); });
      if (!cpu)
        return cpu.error();
      if (auto ok = write_all(f.fd, cpu->data_ptr(), p.nbytes, tmp); !ok)
        return ok;
    }
    if (::fsync(f.fd) != 0)
      return os_fail("cannot fsync", tmp);
    return caf::unit;
  }();
  if (!written) {
    ::unlink(tmp.c_str());
    return written;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    auto err = os_fail("cannot rename to", path);
    ::unlink(tmp.c_str());
    return err;
  }
  auto dir = fs::path{path}.has_parent_path() ? fs::path{path}.parent_path() : fs::path{"."};
  fd_guard d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd >= 0)
    ::fsync(d.fd);
  return caf::unit;
}

} // namespace troupe::runtime
