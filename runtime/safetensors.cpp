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

struct dtype_entry {
  const char* name;
  uint64_t size;
  std::optional<at::ScalarType> type; // nullopt: known but not loadable here
};

// Every dtype of the specification with a whole-byte element size.
constexpr std::array<dtype_entry, 15> dtype_table{{
    {"F64", 8, at::kDouble},
    {"F32", 4, at::kFloat},
    {"F16", 2, at::kHalf},
    {"BF16", 2, at::kBFloat16},
    {"I64", 8, at::kLong},
    {"I32", 4, at::kInt},
    {"I16", 2, at::kShort},
    {"I8", 1, at::kChar},
    {"U8", 1, at::kByte},
    {"BOOL", 1, at::kBool},
    {"U16", 2, std::nullopt},
    {"U32", 4, std::nullopt},
    {"U64", 8, std::nullopt},
    {"F8_E5M2", 1, std::nullopt},
    {"F8_E4M3", 1, std::nullopt},
}};

const dtype_entry* find_dtype(std::string_view name) {
  for (const auto& e : dtype_table)
    if (name == e.name)
      return &e;
  return nullptr;
}

const dtype_entry* find_dtype(at::ScalarType type) {
  for (const auto& e : dtype_table)
    if (e.type && *e.type == type)
      return &e;
  return nullptr;
}

std::string supported_list() {
  std::string out;
  for (const auto& e : dtype_table) {
    if (!e.type)
      continue;
    if (!out.empty())
      out += ", ";
    out += e.name;
  }
  return out;
}

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

std::string render(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// Parses a JSON object and reports the first duplicated key in any object.
expected<json> parse_json_rejecting_duplicates(const std::string& text, const std::string& path) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
    case json::parse_event_t::object_start:
      open_objects.emplace_back();
      break;
    case json::parse_event_t::object_end:
      if (!open_objects.empty())
        open_objects.pop_back();
      break;
    case json::parse_event_t::key:
      if (!open_objects.empty() && parsed.is_string()) {
        const auto& k = parsed.get_ref<const std::string&>();
        if (!open_objects.back().insert(k).second && duplicate.empty())
          duplicate = k;
      }
      break;
    default:
      break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, cb);
  } catch (const json::exception& e) {
    return fail(errc::parse_error, path, std::string{"header is not valid JSON: "} + e.what());
  }
  if (!duplicate.empty())
    return fail(errc::parse_error, path, "header has the key '" + duplicate + "' twice");
  return j;
}

expected<tensor_info> parse_entry(const std::string& name, const json& v, const std::string& path) {
  auto where = "tensor '" + name + "'";
  if (!v.is_object())
    return fail(errc::parse_error, path, where + ": expected an object, got " + json_type_name(v));
  tensor_info info;
  info.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end())
    return fail(errc::parse_error, path, where + ": missing key 'dtype'");
  if (!dt->is_string())
    return fail(errc::parse_error, path,
                where + ": 'dtype': expected a string, got " + json_type_name(*dt));
  info.dtype = dt->get<std::string>();
  const auto* entry = find_dtype(info.dtype);
  if (entry == nullptr)
    return fail(errc::unsupported, path,
                where + ": unknown dtype '" + info.dtype + "' (supported: " + supported_list() +
                    ")");
  auto sh = v.find("shape");
  if (sh == v.end())
    return fail(errc::parse_error, path, where + ": missing key 'shape'");
  if (!sh->is_array())
    return fail(errc::parse_error, path,
                where + ": 'shape': expected an array, got " + json_type_name(*sh));
  uint64_t numel = 1;
  uint64_t nonzero_product = 1;
  for (size_t i = 0; i < sh->size(); ++i) {
    const auto& d = (*sh)[i];
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      std::string got = d.is_number() ? d.dump() : json_type_name(d);
      return fail(errc::parse_error, path,
                  where + ": 'shape[" + std::to_string(i) +
                      "]': expected a non-negative integer, got " + got);
    }
    auto dim = d.get<uint64_t>();
    info.shape.push_back(static_cast<int64_t>(dim));
    numel *= dim; // exact while nonzero_product does not overflow
    if (dim != 0 && (__builtin_mul_overflow(nonzero_product, dim, &nonzero_product) ||
                     nonzero_product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
      return fail(errc::corrupted, path,
                  where + ": shape " + render(info.shape) + "... is too large");
  }
  auto off = v.find("data_offsets");
  if (off == v.end())
    return fail(errc::parse_error, path, where + ": missing key 'data_offsets'");
  if (!off->is_array() || off->size() != 2)
    return fail(errc::parse_error, path,
                where + ": 'data_offsets': expected an array of two integers, got " + off->dump());
  for (size_t i = 0; i < 2; ++i)
    if (!(*off)[i].is_number_unsigned())
      return fail(errc::parse_error, path,
                  where + ": 'data_offsets[" + std::to_string(i) +
                      "]': expected a non-negative integer, got " + (*off)[i].dump());
  info.data_begin = (*off)[0].get<uint64_t>();
  info.data_end = (*off)[1].get<uint64_t>();
  if (info.data_end < info.data_begin)
    return fail(errc::corrupted, path,
                where + ": data_offsets end " + std::to_string(info.data_end) +
                    " is before begin " + std::to_string(info.data_begin));
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, entry->size, &nbytes))
    return fail(errc::corrupted, path, where + ": shape " + render(info.shape) + " is too large");
  if (nbytes != info.data_end - info.data_begin)
    return fail(errc::corrupted, path,
                where + ": shape " + render(info.shape) + " of " + info.dtype + " needs " +
                    std::to_string(nbytes) + " bytes but data_offsets [" +
                    std::to_string(info.data_begin) + ", " + std::to_string(info.data_end) +
                    "] span " + std::to_string(info.data_end - info.data_begin));
  return info;
}

// Validates a header against the file it came from (`data_size` bytes of data).
expected<safetensors_header> parse_header(const std::string& text, uint64_t data_size,
                                          const std::string& path) {
  if (text.empty() || text.front() != '{')
    return fail(errc::parse_error, path, "header must be a JSON object starting with '{'");
  auto j = parse_json_rejecting_duplicates(text, path);
  if (!j)
    return j.error();
  if (!j->is_object())
    return fail(errc::parse_error, path, "header is not a JSON object");
  safetensors_header out;
  for (const auto& [key, value] : j->items()) {
    if (key == "__metadata__") {
      if (value.is_null())
        continue;
      if (!value.is_object())
        return fail(errc::parse_error, path,
                    std::string{"'__metadata__': expected an object, got "} +
                        json_type_name(value));
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          return fail(errc::parse_error, path,
                      "'__metadata__." + mk + "': expected a string, got " + json_type_name(mv));
        out.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    auto info = parse_entry(key, value, path);
    if (!info)
      return info.error();
    out.tensors.push_back(std::move(*info));
  }
  std::stable_sort(
      out.tensors.begin(), out.tensors.end(), [](const tensor_info& a, const tensor_info& b) {
        return std::pair{a.data_begin, a.data_end} < std::pair{b.data_begin, b.data_end};
      });
  // The spec requires the tensors to cover the data buffer exactly.
  uint64_t prev_end = 0;
  const tensor_info* prev = nullptr;
  for (const auto& t : out.tensors) {
    if (t.data_end > data_size)
      return fail(errc::out_of_range, path,
                  "tensor '" + t.name + "': data_offsets [" + std::to_string(t.data_begin) + ", " +
                      std::to_string(t.data_end) + "] run past the end of the " +
                      std::to_string(data_size) + "-byte data buffer");
    if (t.data_begin < prev_end)
      return fail(errc::corrupted, path,
                  "tensor '" + t.name + "' (bytes [" + std::to_string(t.data_begin) + ", " +
                      std::to_string(t.data_end) + "]) overlaps tensor '" + prev->name +
                      "' (bytes [" + std::to_string(prev->data_begin) + ", " +
                      std::to_string(prev->data_end) + "])");
    if (t.data_begin > prev_end)
      return fail(errc::corrupted, path,
                  "data bytes [" + std::to_string(prev_end) + ", " + std::to_string(t.data_begin) +
                      ") belong to no tensor");
    prev_end = t.data_end;
    prev = &t;
  }
  if (prev_end != data_size)
    return fail(errc::corrupted, path,
                "data buffer has " + std::to_string(data_size - prev_end) +
                    " trailing bytes that belong to no tensor");
  return out;
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
  if (file_size < 8)
    return fail(errc::corrupted, path,
                "file is " + std::to_string(file_size) +
                    " bytes, shorter than the 8-byte header length");
  unsigned char len_bytes[8];
  if (auto ok = read_exact(f.fd, len_bytes, 8, 0, path); !ok)
    return ok.error();
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | len_bytes[i];
  if (n > safetensors_max_header_bytes)
    return fail(errc::out_of_range, path,
                "header length " + std::to_string(n) + " exceeds the limit of " +
                    std::to_string(safetensors_max_header_bytes) + " bytes");
  if (n > file_size - 8)
    return fail(errc::corrupted, path,
                "header length " + std::to_string(n) + " is larger than the " +
                    std::to_string(file_size - 8) + " bytes after the length field");
  std::string text(n, '\0');
  if (auto ok = read_exact(f.fd, text.data(), n, 8, path); !ok)
    return ok.error();
  auto header = parse_header(text, file_size - 8 - n, path);
  if (header)
    header->data_start = 8 + n;
  return header;
}

std::string tmp_name_for(const std::filesystem::path& target) {
  std::random_device rd;
  auto dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path{"."};
  return (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                 std::to_string(rd())))
      .string();
}

} // namespace

uint64_t safetensors_dtype_size(const std::string& dtype) {
  const auto* e = find_dtype(dtype);
  return e ? e->size : 0;
}

bool safetensors_dtype_supported(const std::string& dtype) {
  const auto* e = find_dtype(dtype);
  return e != nullptr && e->type.has_value();
}

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
                      "' is not supported (supported: " + supported_list() + ")");
  tensor_map out;
  for (const auto& t : header->tensors) {
    const auto* entry = find_dtype(t.dtype);
    auto tensor = guarded("allocating tensor '" + t.name + "' of " + path, [&] {
      if (target) {
        auto into = target(t.name);
        if (into.defined() && into.device().is_cpu() && into.is_contiguous() &&
            into.scalar_type() == *entry->type && into.sizes() == at::IntArrayRef(t.shape))
          return into;
      }
      return at::empty(t.shape, at::TensorOptions().dtype(*entry->type).device(at::kCPU));
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
    if (*entry->type == at::kBool) {
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

std::string safetensors_dtype_name(at::ScalarType type) {
  const auto* e = find_dtype(type);
  return e != nullptr ? std::string{e->name} : std::string{};
}

std::optional<at::ScalarType> safetensors_scalar_type(const std::string& dtype) {
  const auto* e = find_dtype(std::string_view{dtype});
  return e != nullptr ? e->type : std::nullopt;
}

expected<void> save_safetensors(const std::string& path, const tensor_map& tensors,
                                const string_map& metadata) {
  struct planned {
    const std::string* name;
    const at::Tensor* tensor;
    const dtype_entry* dtype;
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
    const auto* entry = find_dtype(t.scalar_type());
    if (entry == nullptr)
      return fail(errc::unsupported, path,
                  "tensor '" + name + "': dtype " + std::string{c10::toString(t.scalar_type())} +
                      " has no safetensors equivalent here (supported: " + supported_list() + ")");
    plan.push_back({&name, &t, entry, static_cast<uint64_t>(t.numel()) * entry->size});
  }
  // Larger elements first keeps every tensor aligned to its element size.
  std::stable_sort(plan.begin(), plan.end(), [](const planned& a, const planned& b) {
    if (a.dtype->size != b.dtype->size)
      return a.dtype->size > b.dtype->size;
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
    e["dtype"] = p.dtype->name;
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
