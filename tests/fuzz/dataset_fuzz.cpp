// Fuzz target: the prompt dataset reader (actors/rl/datasets.hpp) — JSONL
// or JSON files of prompts, demonstrations or preference pairs that users
// download and hand to a job. The first byte picks the format (bit 0:
// JSONL or a JSON array), the row kind (bits 1-2) and a nested field name
// (bit 3); the rest is the file. Opening succeeds or answers an error; an
// opened file's rows read back (indexed, then whole) as the same rows, and
// check_rows counts them.
#include "actors/rl/datasets.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

using namespace troupe;
using namespace troupe::actors::rl;

namespace {

/// One file of this process, rewritten for each input.
const std::string& scratch(bool jsonl) {
  static const std::string base = [] {
    const char* tmp = std::getenv("TMPDIR");
    return (std::filesystem::path{tmp && *tmp ? tmp : "/tmp"} /
            ("troupe-fuzz-dataset-" + std::to_string(::getpid())))
        .string();
  }();
  static const std::string jsonl_path = base + ".jsonl", json_path = base + ".json";
  static const bool removed_at_exit = [] {
    std::atexit([] {
      std::remove(jsonl_path.c_str());
      std::remove(json_path.c_str());
    });
    return true;
  }();
  (void)removed_at_exit;
  return jsonl ? jsonl_path : json_path;
}

template <class Row>
void read_back(const std::string& path, const dataset_fields& fields, row_use use) {
  auto table = open_rows<Row>(path, fields);
  if (!table)
    return;
  auto all = table->all();
  if (!all || static_cast<int64_t>(all->size()) != table->size())
    fuzz::broken();
  for (int64_t i = 0; i < table->size(); ++i) {
    auto row = table->at(i);
    if (!row || !(*row == (*all)[static_cast<size_t>(i)]))
      fuzz::broken();
  }
  auto counted = check_rows(path, fields, use);
  if (!counted || *counted != table->size())
    fuzz::broken();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const bool jsonl = (data[0] & 1) == 0;
  const auto& path = scratch(jsonl);
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f)
      fuzz::broken();
    std::fwrite(data + 1, 1, size - 1, f);
    std::fclose(f);
  }
  dataset_fields fields;
  if (data[0] & 8) {
    fields.prompt = "question.text";
    fields.answer = "reward_model.ground_truth";
  }
  switch ((data[0] >> 1) & 3) {
  case 0:
  case 3:
    read_back<example>(path, fields, row_use::prompts);
    break;
  case 1:
    read_back<demonstration>(path, fields, row_use::demos);
    break;
  case 2:
    read_back<preference_pair>(path, fields, row_use::preferences);
    break;
  }
  return 0;
}
