#include "runtime/safetensors_header.hpp"

#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <limits>
#include <set>

namespace troupe::runtime {

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

caf::error refuse(errc code, const std::string& path, const std::string& what) {
  return make_error(code, path + ": " + what);
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
  if (auto at = json_too_deep_at(text); at != std::string_view::npos)
    return json_too_deep(path + ": header", at);
  json j;
  try {
    j = json::parse(text, cb);
  } catch (const json::exception& e) {
    return refuse(errc::parse_error, path, std::string{"header is not valid JSON: "} + e.what());
  }
  if (!duplicate.empty())
    return refuse(errc::parse_error, path, "header has the key '" + duplicate + "' twice");
  return j;
}

expected<tensor_info> parse_entry(const std::string& name, const json& v, const std::string& path) {
  auto where = "tensor '" + name + "'";
  if (!v.is_object())
    return refuse(errc::parse_error, path,
                  where + ": expected an object, got " + json_type_name(v));
  tensor_info info;
  info.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end())
    return refuse(errc::parse_error, path, where + ": missing key 'dtype'");
  if (!dt->is_string())
    return refuse(errc::parse_error, path,
                  where + ": 'dtype': expected a string, got " + json_type_name(*dt));
  info.dtype = dt->get<std::string>();
  const auto* entry = find_dtype(info.dtype);
  if (entry == nullptr)
    return refuse(errc::unsupported, path,
                  where + ": unknown dtype '" + info.dtype + "' (supported: " + supported_list() +
                      ")");
  auto sh = v.find("shape");
  if (sh == v.end())
    return refuse(errc::parse_error, path, where + ": missing key 'shape'");
  if (!sh->is_array())
    return refuse(errc::parse_error, path,
                  where + ": 'shape': expected an array, got " + json_type_name(*sh));
  uint64_t numel = 1;
  uint64_t nonzero_product = 1;
  for (size_t i = 0; i < sh->size(); ++i) {
    const auto& d = (*sh)[i];
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      std::string got = d.is_number() ? d.dump() : json_type_name(d);
      return refuse(errc::parse_error, path,
                    where + ": 'shape[" + std::to_string(i) +
                        "]': expected a non-negative integer, got " + got);
    }
    auto dim = d.get<uint64_t>();
    info.shape.push_back(static_cast<int64_t>(dim));
    numel *= dim; // exact while nonzero_product does not overflow
    if (dim != 0 && (__builtin_mul_overflow(nonzero_product, dim, &nonzero_product) ||
                     nonzero_product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
      return refuse(errc::corrupted, path,
                    where + ": shape " + render(info.shape) + "... is too large");
  }
  auto off = v.find("data_offsets");
  if (off == v.end())
    return refuse(errc::parse_error, path, where + ": missing key 'data_offsets'");
  if (!off->is_array() || off->size() != 2)
    return refuse(errc::parse_error, path,
                  where + ": 'data_offsets': expected an array of two integers, got " +
                      off->dump());
  for (size_t i = 0; i < 2; ++i)
    if (!(*off)[i].is_number_unsigned())
      return refuse(errc::parse_error, path,
                    where + ": 'data_offsets[" + std::to_string(i) +
                        "]': expected a non-negative integer, got " + (*off)[i].dump());
  info.data_begin = (*off)[0].get<uint64_t>();
  info.data_end = (*off)[1].get<uint64_t>();
  if (info.data_end < info.data_begin)
    return refuse(errc::corrupted, path,
                  where + ": data_offsets end " + std::to_string(info.data_end) +
                      " is before begin " + std::to_string(info.data_begin));
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, entry->size, &nbytes))
    return refuse(errc::corrupted, path, where + ": shape " + render(info.shape) + " is too large");
  if (nbytes != info.data_end - info.data_begin)
    return refuse(errc::corrupted, path,
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
    return refuse(errc::parse_error, path, "header must be a JSON object starting with '{'");
  auto j = parse_json_rejecting_duplicates(text, path);
  if (!j)
    return j.error();
  if (!j->is_object())
    return refuse(errc::parse_error, path, "header is not a JSON object");
  safetensors_header out;
  for (const auto& [key, value] : j->items()) {
    if (key == "__metadata__") {
      if (value.is_null())
        continue;
      if (!value.is_object())
        return refuse(errc::parse_error, path,
                      std::string{"'__metadata__': expected an object, got "} +
                          json_type_name(value));
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          return refuse(errc::parse_error, path,
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
      return refuse(errc::out_of_range, path,
                    "tensor '" + t.name + "': data_offsets [" + std::to_string(t.data_begin) +
                        ", " + std::to_string(t.data_end) + "] run past the end of the " +
                        std::to_string(data_size) + "-byte data buffer");
    if (t.data_begin < prev_end)
      return refuse(errc::corrupted, path,
                    "tensor '" + t.name + "' (bytes [" + std::to_string(t.data_begin) + ", " +
                        std::to_string(t.data_end) + "]) overlaps tensor '" + prev->name +
                        "' (bytes [" + std::to_string(prev->data_begin) + ", " +
                        std::to_string(prev->data_end) + "])");
    if (t.data_begin > prev_end)
      return refuse(errc::corrupted, path,
                    "data bytes [" + std::to_string(prev_end) + ", " +
                        std::to_string(t.data_begin) + ") belong to no tensor");
    prev_end = t.data_end;
    prev = &t;
  }
  if (prev_end != data_size)
    return refuse(errc::corrupted, path,
                  "data buffer has " + std::to_string(data_size - prev_end) +
                      " trailing bytes that belong to no tensor");
  return out;
}

// A shard name must be a plain file name inside the checkpoint directory.
bool safe_file_name(const std::string& name) {
  if (name.empty() || name == "." || name == "..")
    return false;
  for (char ch : name)
    if (ch == '/' || ch == '\\' || ch == '\0')
      return false;
  return true;
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

std::string safetensors_dtype_name(at::ScalarType type) {
  const auto* e = find_dtype(type);
  return e != nullptr ? std::string{e->name} : std::string{};
}

std::optional<at::ScalarType> safetensors_scalar_type(const std::string& dtype) {
  const auto* e = find_dtype(std::string_view{dtype});
  return e != nullptr ? e->type : std::nullopt;
}

std::string safetensors_supported_dtypes() {
  return supported_list();
}

expected<void> check_safetensors_header_length(uint64_t n, uint64_t file_size,
                                               const std::string& path) {
  if (file_size < 8)
    return refuse(errc::corrupted, path,
                  "file is " + std::to_string(file_size) +
                      " bytes, shorter than the 8-byte header length");
  if (n > safetensors_max_header_bytes)
    return refuse(errc::out_of_range, path,
                  "header length " + std::to_string(n) + " exceeds the limit of " +
                      std::to_string(safetensors_max_header_bytes) + " bytes");
  if (n > file_size - 8)
    return refuse(errc::corrupted, path,
                  "header length " + std::to_string(n) + " is larger than the " +
                      std::to_string(file_size - 8) + " bytes after the length field");
  return {};
}

expected<safetensors_header> parse_safetensors_header(const std::string& text, uint64_t data_size,
                                                      const std::string& path) {
  auto header = parse_header(text, data_size, path);
  if (header)
    header->data_start = 8 + text.size();
  return header;
}

expected<safetensors_header> parse_safetensors_bytes(std::string_view file,
                                                     const std::string& path) {
  uint64_t n = 0;
  for (size_t i = std::min<size_t>(file.size(), 8); i-- > 0;)
    n = (n << 8) | static_cast<unsigned char>(file[i]);
  if (auto ok = check_safetensors_header_length(n, file.size(), path); !ok)
    return ok.error();
  return parse_safetensors_header(std::string{file.substr(8, n)}, file.size() - 8 - n, path);
}

expected<safetensors_index> parse_safetensors_index(const std::string& text,
                                                    const std::string& index_path) {
  if (auto at = json_too_deep_at(text); at != std::string_view::npos)
    return json_too_deep(index_path, at);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return make_error(errc::parse_error, index_path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object())
    return make_error(errc::parse_error, index_path + ": expected a JSON object");
  auto wm = j.find("weight_map");
  if (wm == j.end())
    return make_error(errc::parse_error, index_path + ": missing key 'weight_map'");
  if (!wm->is_object())
    return make_error(errc::parse_error, index_path + ": 'weight_map': expected an object");
  if (auto md = j.find("metadata"); md != j.end() && !md->is_null() && !md->is_object())
    return make_error(errc::parse_error, index_path + ": 'metadata': expected an object");
  safetensors_index out;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string())
      return make_error(errc::parse_error, index_path + ": 'weight_map." + name +
                                               "': expected a file name string, got " +
                                               file.type_name());
    auto f = file.get<std::string>();
    if (!safe_file_name(f))
      return make_error(errc::invalid_config,
                        index_path + ": 'weight_map." + name + "': shard name '" + f +
                            "' is not a plain file name inside the checkpoint directory");
    out.shard_of.emplace(name, f);
    out.listed[f].insert(name);
  }
  return out;
}

} // namespace troupe::runtime
