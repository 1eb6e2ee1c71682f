// Fuzz target: a job spec as `troupe run` and the controller load it
// (runtime/config.hpp, actors/rl/job_config.hpp) — YAML with `base:` files
// and `--set` overrides, from users and from the network (a submitted
// job). The input is sections split by lines "%%": the first is job.yaml,
// a section whose first line is "--set" holds one override a line, any
// other is a base file b1.yaml, b2.yaml, ... in order. Nothing is read
// from disk for the files; loading either succeeds or answers an error.
#include "actors/rl/job_config.hpp"
#include "runtime/config.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

using namespace troupe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto sections = fuzz::sections_of(fuzz::text_of(data, size));
  runtime::yaml_document::source_file main{"job.yaml", sections[0]};
  std::vector<runtime::yaml_document::source_file> bases;
  std::vector<std::string> sets;
  for (size_t i = 1; i < sections.size(); ++i) {
    const auto& s = sections[i];
    if (s.rfind("--set\n", 0) == 0) {
      size_t from = 6;
      while (from <= s.size()) {
        auto end = s.find('\n', from);
        if (end == std::string::npos)
          end = s.size();
        if (end > from)
          sets.push_back(s.substr(from, end - from));
        from = end + 1;
      }
    } else {
      bases.push_back({"b" + std::to_string(bases.size() + 1) + ".yaml", s});
    }
  }
  auto doc = runtime::yaml_document::from_sources(main, bases);
  if (!doc)
    return 0;
  for (const auto& s : sets)
    if (!doc->set(s))
      return 0;
  auto cfg = runtime::load_config<actors::rl::job_config>(*doc);
  if (!cfg)
    return 0;
  // A loaded job writes back as YAML that loads to the same job.
  const auto text = runtime::to_yaml(*cfg, false);
  auto again = runtime::yaml_document::from_text(text, "job.yaml");
  if (!again)
    fuzz::broken();
  auto cfg2 = runtime::load_config<actors::rl::job_config>(*again);
  if (!cfg2 || runtime::to_yaml(*cfg2, false) != text)
    fuzz::broken();
  return 0;
}
