#include "runtime/error.hpp"
#include "runtime/file_io.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

using namespace troupe;

TEST(Error, EveryCodeHasAUniqueNameAndRoundTrips) {
  std::set<std::string> names;
  for (uint8_t i = 1; i < errc_count; ++i) {
    auto code = static_cast<errc>(i);
    auto name = std::string{to_string(code)};
    EXPECT_NE(name, "unknown") << int(i);
    EXPECT_TRUE(names.insert(name).second) << name;
    auto err = make_error(code, "ctx");
    EXPECT_EQ(code_of(err), code);
    EXPECT_EQ(context_of(err), "ctx");
    EXPECT_EQ(describe(err), name + ": ctx");
  }
  EXPECT_EQ(code_of(caf::error{}), errc::none);
}

TEST(Error, PrefixKeepsCodeAndAddsWhere) {
  auto err = with_prefix(make_error(errc::parse_error, "bad byte"), "model.safetensors");
  EXPECT_EQ(code_of(err), errc::parse_error);
  EXPECT_EQ(describe(err), "parse_error: model.safetensors: bad byte");
}

TEST(FileIo, AtomicWriteReplacesWholeFileAndLeavesNoTemp) {
  test::temp_dir dir;
  auto path = dir.file("a.bin");
  ASSERT_TRUE(runtime::write_file_atomic(path, "first"));
  ASSERT_TRUE(runtime::write_file_atomic(path, "second version"));
  auto back = runtime::read_file(path);
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(*back, "second version");
  int entries = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir.path()))
    ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(FileIo, ReadRejectsMissingAndOversizedFiles) {
  test::temp_dir dir;
  auto missing = runtime::read_file(dir.file("nope"));
  ASSERT_FALSE(missing);
  EXPECT_EQ(code_of(missing.error()), errc::not_found);
  auto path = dir.write("big", std::string(100, 'x'));
  auto big = runtime::read_file(path, 10);
  ASSERT_FALSE(big);
  EXPECT_EQ(code_of(big.error()), errc::out_of_range);
  auto mapped = runtime::mapped_file::open(path);
  ASSERT_TRUE(mapped);
  EXPECT_EQ(mapped->size(), 100u);
  EXPECT_EQ(mapped->data()[99], 'x');
}

#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

TEST(Jsonl, ReadsObjectsAndReportsFileLineOnBadInput) {
  test::temp_dir dir;
  auto good = dir.write("good.jsonl", "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\"}\r\n");
  std::vector<std::string> seen;
  auto n = runtime::read_jsonl(good, [&](const nlohmann::json& j) -> expected<void> {
    seen.push_back(j.at("prompt").get<std::string>());
    return caf::unit;
  });
  ASSERT_TRUE(n) << describe(n.error());
  EXPECT_EQ(*n, 2);
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b"}));

  auto bad = dir.write("bad.jsonl", "{\"prompt\": \"a\"}\n{\"prompt\": \n");
  auto r = runtime::read_jsonl(bad, [](const nlohmann::json&) -> expected<void> { return caf::unit; });
  ASSERT_FALSE(r);
  EXPECT_EQ(describe(r.error()), "parse_error: " + bad + ":2: not valid JSON");

  auto arr = dir.write("arr.jsonl", "[1, 2]\n");
  r = runtime::read_jsonl(arr, [](const nlohmann::json&) -> expected<void> { return caf::unit; });
  ASSERT_FALSE(r);
  EXPECT_EQ(describe(r.error()), "parse_error: " + arr + ":1: expected a JSON object, got array");

  r = runtime::read_jsonl(good, [](const nlohmann::json&) -> expected<void> {
    return make_error(errc::invalid_argument, "field 'prompt': too short");
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(describe(r.error()), "invalid_argument: " + good + ":1: field 'prompt': too short");
}

// NOTE [json nesting]: the depth counts arrays and objects, not brackets
// inside strings (escaped quotes included).
TEST(Jsonl, NestingPastTheLimitIsFoundBeforeParsing) {
  using runtime::json_too_deep_at;
  const auto npos = std::string_view::npos;
  const auto deep = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_EQ(json_too_deep_at(deep(runtime::max_json_depth)), npos);
  EXPECT_EQ(json_too_deep_at(deep(runtime::max_json_depth + 1)),
            static_cast<size_t>(runtime::max_json_depth));
  EXPECT_EQ(json_too_deep_at(R"({"a": "[[[[[[", "b": "\"[[[["})", 3), npos);
  EXPECT_EQ(json_too_deep_at(R"({"a": [{"b": [1]}]})", 3), 13u);
  EXPECT_EQ(json_too_deep_at("]]]]{{{", 2), npos); // malformed: the parser refuses it
  EXPECT_EQ(json_too_deep_at("\"\\", 1), npos);    // a string cut after a backslash
  const auto e = runtime::json_too_deep("rows.jsonl:3", 300);
  EXPECT_EQ(e.code(), static_cast<uint8_t>(errc::parse_error));
  EXPECT_NE(describe(e).find("rows.jsonl:3: JSON nests arrays and objects deeper than 256 levels "
                             "(the limit), at byte 300"),
            std::string::npos)
      << describe(e);
  // Each reader refuses it before parsing: a JSONL file, say.
  test::temp_dir tmp;
  auto path = tmp.write("deep.jsonl", "{\"a\": " + deep(100000) + "}\n");
  auto n = runtime::read_jsonl(path, [](const nlohmann::json&) -> expected<void> { return {}; });
  ASSERT_FALSE(n);
  EXPECT_NE(describe(n.error()).find(path + ":1: JSON nests"), std::string::npos)
      << describe(n.error());
}

TEST(Jsonl, TypeNamesAndBase64) {
  EXPECT_STREQ(runtime::json_type_name(nlohmann::json(3)), "integer");
  EXPECT_STREQ(runtime::json_type_name(nlohmann::json(3u)), "integer");
  EXPECT_STREQ(runtime::json_type_name(nlohmann::json(0.5)), "number");
  EXPECT_STREQ(runtime::json_type_name(nlohmann::json("x")), "string");
  EXPECT_STREQ(runtime::json_type_name(nlohmann::json::array()), "array");
  // RFC 4648's test vectors, and bytes that are not UTF-8.
  const std::pair<std::string, std::string> vectors[] = {
      {"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},         {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}, {std::string("\xFF\x00\xFE", 3), "/wD+"}};
  for (const auto& [in, out] : vectors)
    EXPECT_EQ(runtime::base64(in), out) << in;
}
