#include "runtime/safetensors.hpp"
#include "runtime/error.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace troupe;
using namespace troupe::runtime;

namespace {

// The 8-byte little-endian length, the header text, then the data.
std::string st_file(const std::string& header, const std::string& data, uint64_t len) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((len >> (8 * i)) & 0xFF);
  return out + header + data;
}

std::string st_file(const std::string& header, const std::string& data) {
  return st_file(header, data, header.size());
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string bytes_of(const at::Tensor& t) {
  auto c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

std::string f32_bytes(std::initializer_list<float> values) {
  std::string out;
  for (float v : values) {
    char b[4];
    std::memcpy(b, &v, 4);
    out.append(b, 4);
  }
  return out;
}

} // namespace

TEST(Safetensors, RoundTripKeepsDtypeShapeAndExactBytes) {
  torch::manual_seed(7);
  test::temp_dir dir;
  tensor_map in;
  in["f32"] = torch::randn({3, 5});
  in["f16"] = torch::randn({4, 3}).to(torch::kHalf);
  in["bf16"] = torch::randn({7}).to(torch::kBFloat16);
  in["i64"] = torch::arange(-3, 6, torch::kLong).reshape({3, 3});
  in["mask"] = torch::tensor({true, false, true});
  in["scalar"] = torch::tensor(2.5);
  in["empty"] = torch::zeros({0, 4});
  in["transposed"] = torch::randn({2, 3}).t(); // not contiguous
  auto path = dir.file("m.safetensors");
  ASSERT_TRUE(save_safetensors(path, in));
  auto out = load_safetensors(path);
  ASSERT_TRUE(out) << describe(out.error());
  ASSERT_EQ(out->size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(out->count(name)) << name;
    const auto& u = out->at(name);
    EXPECT_EQ(u.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(u.sizes(), t.sizes()) << name;
    EXPECT_TRUE(u.is_contiguous()) << name;
    EXPECT_EQ(bytes_of(u), bytes_of(t)) << name;
  }
  EXPECT_EQ(out->at("scalar").dim(), 0);
  EXPECT_EQ(out->at("scalar").item<double>(), 2.5);
}

TEST(Safetensors, MetadataRoundTrips) {
  test::temp_dir dir;
  auto path = dir.file("m.safetensors");
  string_map md{{"format", "pt"}, {"step", "42"}, {"note", "Grüße ✓"}};
  ASSERT_TRUE(save_safetensors(path, {{"w", torch::ones({2})}}, md));
  auto back = read_safetensors_metadata(path);
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(*back, md);
  ASSERT_TRUE(save_safetensors(path, {{"w", torch::ones({2})}}));
  back = read_safetensors_metadata(path);
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->empty());
}

TEST(Safetensors, WrittenFileFollowsTheSpec) {
  test::temp_dir dir;
  auto path = dir.file("m.safetensors");
  tensor_map in;
  in["b.f16"] = torch::tensor({1.0, 2.0, 3.0}).to(torch::kHalf); // 6 bytes
  in["a.f32"] = torch::tensor({1.0f, -2.0f});                    // 8 bytes
  in["c.i64"] = torch::tensor({int64_t{5}});                     // 8 bytes
  ASSERT_TRUE(save_safetensors(path, in, {{"format", "pt"}}));
  auto raw = read_all(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(raw[i]);
  EXPECT_EQ(n % 8, 0u) << "header padded to 8-byte alignment";
  ASSERT_LE(8 + n, raw.size());
  auto header = raw.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  auto last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"], (nlohmann::json{{"format", "pt"}}));
  // Larger elements first: i64, then f32, then f16; names break ties.
  EXPECT_EQ(j["c.i64"],
            (nlohmann::json{{"dtype", "I64"}, {"shape", {1}}, {"data_offsets", {0, 8}}}));
  EXPECT_EQ(j["a.f32"],
            (nlohmann::json{{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {8, 16}}}));
  EXPECT_EQ(j["b.f16"],
            (nlohmann::json{{"dtype", "F16"}, {"shape", {3}}, {"data_offsets", {16, 22}}}));
  EXPECT_EQ(raw.size(), 8 + n + 22);
  EXPECT_EQ(raw.substr(8 + n + 8, 8), f32_bytes({1.0f, -2.0f}));
  // No temporary file is left behind.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1u);
}

TEST(Safetensors, LoadsAHandBuiltFile) {
  test::temp_dir dir;
  std::string header =
      R"({"__metadata__":{"who":"hand"},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("y":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}})";
  // bf16 1.0 = 0x3F80, bf16 -0.5 = 0xBF00 (little-endian bytes).
  std::string data = f32_bytes({1.0f, -2.0f}) + std::string("\x80\x3F\x00\xBF", 4);
  auto path = dir.write("hand.safetensors", st_file(header, data));
  auto out = load_safetensors(path);
  ASSERT_TRUE(out) << describe(out.error());
  ASSERT_EQ(out->size(), 2u);
  auto x = out->at("x");
  EXPECT_EQ(x.scalar_type(), torch::kFloat);
  EXPECT_EQ(x[0].item<float>(), 1.0f);
  EXPECT_EQ(x[1].item<float>(), -2.0f);
  auto y = out->at("y");
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(y[0][0].item<float>(), 1.0f);
  EXPECT_EQ(y[0][1].item<float>(), -0.5f);
  auto h = read_safetensors_header(path);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->data_start, 8 + header.size());
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->tensors[1].name, "y");
  EXPECT_EQ(h->tensors[1].dtype, "BF16");
  EXPECT_EQ(h->tensors[1].data_begin, 8u);
  EXPECT_EQ(h->tensors[1].data_end, 12u);
  EXPECT_EQ(h->metadata.at("who"), "hand");
}

TEST(Safetensors, HeaderOfUnloadableDtypeCanStillBeInspected) {
  test::temp_dir dir;
  auto path =
      dir.write("f8.safetensors",
                st_file(R"({"q":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", "abcd"));
  auto h = read_safetensors_header(path);
  ASSERT_TRUE(h) << describe(h.error());
  EXPECT_EQ(h->tensors[0].dtype, "F8_E4M3");
  auto t = load_safetensors(path);
  ASSERT_FALSE(t);
  EXPECT_EQ(code_of(t.error()), errc::unsupported);
  EXPECT_NE(context_of(t.error()).find("tensor 'q': dtype 'F8_E4M3' is not supported"),
            std::string::npos)
      << describe(t.error());
}

struct bad_file {
  const char* label;
  std::string bytes;
  errc code;
  const char* reason;
};

TEST(Safetensors, RejectsMalformedFilesWithClearErrors) {
  auto entry = [](const char* name, const char* dtype, const char* shape, const char* offsets) {
    return std::string{"\""} + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
           ",\"data_offsets\":" + offsets + "}";
  };
  auto one = [&](const char* dtype, const char* shape, const char* offsets, std::string data) {
    return st_file("{" + entry("t", dtype, shape, offsets) + "}", data);
  };
  std::string d8 = f32_bytes({1, 2});
  std::vector<bad_file> cases = {
      {"short", "abc", errc::corrupted, "file is 3 bytes, shorter than the 8-byte header length"},
      {"header_past_file", st_file("{}", "", 100), errc::corrupted,
       "header length 100 is larger than the 2 bytes after the length field"},
      {"huge_header", st_file("{}", "", uint64_t{1} << 63), errc::out_of_range,
       "header length 9223372036854775808 exceeds the limit of 100000000 bytes"},
      {"not_json", st_file("{not json}", ""), errc::parse_error, "header is not valid JSON"},
      {"not_object", st_file("[1, 2]", ""), errc::parse_error, "must be a JSON object"},
      {"past_end", one("F32", "[2]", "[0,8]", f32_bytes({1})), errc::out_of_range,
       "tensor 't': data_offsets [0, 8] run past the end of the 4-byte data buffer"},
      {"end_before_begin", one("F32", "[0]", "[8,0]", d8), errc::corrupted,
       "tensor 't': data_offsets end 0 is before begin 8"},
      {"size_mismatch", one("F32", "[3]", "[0,8]", d8), errc::corrupted,
       "tensor 't': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8"},
      {"overlap",
       st_file("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[4,12]") +
                   "}",
               f32_bytes({1, 2, 3})),
       errc::corrupted, "tensor 'b' (bytes [4, 12]) overlaps tensor 'a' (bytes [0, 8])"},
      {"hole",
       st_file("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]") +
                   "}",
               f32_bytes({1, 2, 3})),
       errc::corrupted, "data bytes [4, 8) belong to no tensor"},
      {"trailing", one("F32", "[1]", "[0,4]", d8), errc::corrupted,
       "data buffer has 4 trailing bytes that belong to no tensor"},
      {"unknown_dtype", one("Q4", "[2]", "[0,8]", d8), errc::unsupported,
       "tensor 't': unknown dtype 'Q4'"},
      {"unsupported_dtype", one("U16", "[4]", "[0,8]", d8), errc::unsupported,
       "tensor 't': dtype 'U16' is not supported"},
      {"negative_dim", one("F32", "[-2]", "[0,8]", d8), errc::parse_error,
       "tensor 't': 'shape[0]': expected a non-negative integer, got -2"},
      {"fractional_dim", one("F32", "[2.0]", "[0,8]", d8), errc::parse_error,
       "tensor 't': 'shape[0]': expected a non-negative integer, got 2.0"},
      {"string_dim", one("F32", "[\"2\"]", "[0,8]", d8), errc::parse_error,
       "tensor 't': 'shape[0]': expected a non-negative integer, got string"},
      {"shape_overflow", one("F32", "[4294967296,4294967296]", "[0,8]", d8), errc::corrupted,
       "is too large"},
      {"negative_offset", one("F32", "[2]", "[-1,8]", d8), errc::parse_error,
       "'data_offsets[0]': expected a non-negative integer, got -1"},
      {"missing_offsets", st_file(R"({"t":{"dtype":"F32","shape":[2]}})", d8), errc::parse_error,
       "tensor 't': missing key 'data_offsets'"},
      {"duplicate_key",
       st_file("{" + entry("t", "F32", "[1]", "[0,4]") + "," + entry("t", "F32", "[1]", "[4,8]") +
                   "}",
               d8),
       errc::parse_error, "header has the key 't' twice"},
      {"metadata_not_string", st_file(R"({"__metadata__":{"n":1}})", ""), errc::parse_error,
       "'__metadata__.n': expected a string, got integer"},
      {"bool_not_0_or_1", one("BOOL", "[2]", "[0,2]", std::string("\x01\x02", 2)), errc::corrupted,
       "BOOL element 1 has byte value 2"},
  };
  test::temp_dir dir;
  for (const auto& c : cases) {
    auto path = dir.write(std::string{c.label} + ".safetensors", c.bytes);
    auto out = load_safetensors(path);
    ASSERT_FALSE(out) << c.label;
    EXPECT_EQ(code_of(out.error()), c.code) << c.label << ": " << describe(out.error());
    auto msg = context_of(out.error());
    EXPECT_NE(msg.find(path), std::string::npos) << c.label << ": " << msg;
    EXPECT_NE(msg.find(c.reason), std::string::npos) << c.label << ": " << msg;
  }
}

TEST(Safetensors, MissingFileIsNotFound) {
  test::temp_dir dir;
  auto out = load_safetensors(dir.file("nope.safetensors"));
  ASSERT_FALSE(out);
  EXPECT_EQ(code_of(out.error()), errc::not_found);
  EXPECT_NE(context_of(out.error()).find("nope.safetensors"), std::string::npos);
}

TEST(Safetensors, SaveRejectsWhatTheFormatCannotHold) {
  test::temp_dir dir;
  auto path = dir.file("x.safetensors");
  auto r = save_safetensors(path, {{"__metadata__", torch::ones({1})}});
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::invalid_argument);
  r = save_safetensors(path, {{"c", torch::ones({2}, torch::kComplexFloat)}});
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::unsupported);
  EXPECT_NE(context_of(r.error()).find("tensor 'c'"), std::string::npos);
  r = save_safetensors(path, {{"u", at::Tensor{}}});
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::invalid_argument);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Safetensors, SaveReplacesAnExistingFile) {
  test::temp_dir dir;
  auto path = dir.file("x.safetensors");
  ASSERT_TRUE(save_safetensors(path, {{"a", torch::ones({100})}}));
  ASSERT_TRUE(save_safetensors(path, {{"b", torch::zeros({2}, torch::kInt)}}));
  auto out = load_safetensors(path);
  ASSERT_TRUE(out);
  ASSERT_EQ(out->size(), 1u);
  EXPECT_TRUE(torch::equal(out->at("b"), torch::zeros({2}, torch::kInt)));
}
