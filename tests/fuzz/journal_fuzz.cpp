// Fuzz target: an events.jsonl journal as a resumed run, the controller
// and the dashboard read it (actors/job/events.hpp) — a file anyone with
// the run folder can edit, and torn by a killed writer. Every line that
// parses as an event writes back as a line that parses to the same event
// (its JSON stable from the second writing on).
#include "actors/job/events.hpp"

#include <cstdint>
#include <string_view>

using namespace troupe::actors::job;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text{reinterpret_cast<const char*>(data), size};
  const auto complete = each_journal_event(text, [](const event& e) {
    const auto line = to_json(e);
    auto back = event_from_json(line);
    if (!back || to_json(*back) != line)
      __builtin_trap();
  });
  if (complete > size)
    __builtin_trap();
  return 0;
}
