// NOTE [fuzz targets]: the normal build's form of a fuzz target — this
// main feeds every file named on the command line (a folder: each file in
// it, recursively, in name order) to the target's LLVMFuzzerTestOneInput,
// as the libFuzzer build (scripts/fuzz.sh) does with its corpus. ctest runs
// it over the target's seed corpus and saved reproducers, so a finding,
// once fixed, stays fixed in every build. A crash, an abort or a sanitizer
// report fails the run; so does an empty input set (a corpus went
// missing).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::filesystem::path> inputs_in(const std::filesystem::path& p) {
  std::vector<std::filesystem::path> out;
  if (std::filesystem::is_directory(p)) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(p))
      if (e.is_regular_file())
        out.push_back(e.path());
    std::sort(out.begin(), out.end());
  } else if (std::filesystem::exists(p)) {
    out.push_back(p);
  }
  return out;
}

} // namespace

int main(int argc, char** argv) {
  size_t ran = 0;
  for (int i = 1; i < argc; ++i)
    for (const auto& path : inputs_in(argv[i])) {
      std::ifstream in(path, std::ios::binary);
      const std::string bytes{std::istreambuf_iterator<char>(in), {}};
      if (!in.good() && !in.eof()) {
        std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
        return 1;
      }
      // (A copy of its own, as libFuzzer hands each input: an overread shows.)
      const std::vector<uint8_t> data(bytes.begin(), bytes.end());
      LLVMFuzzerTestOneInput(data.data(), data.size());
      ++ran;
    }
  if (ran == 0) {
    std::fprintf(stderr, "replay: no inputs under the paths given\n");
    return 1;
  }
  std::printf("replay: %zu inputs ran\n", ran);
  return 0;
}
