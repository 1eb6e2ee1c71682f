#include "runtime/compute.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <thread>

#include <malloc.h>

namespace troupe::runtime {

int set_compute_threads(int requested) {
  int n = requested > 0 ? requested : static_cast<int>(std::thread::hardware_concurrency());
  at::set_num_threads(std::max(n, 1));
  return at::get_num_threads();
}

void return_free_memory() { ::malloc_trim(0); }

resident_memory resident_set() {
  resident_memory out;
  std::ifstream in("/proc/self/status");
  std::string line;
  auto kb = [](const std::string& l) { return std::stoll(l.substr(l.find(':') + 1)) * 1024; };
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0)
      out.peak = kb(line);
    else if (line.rfind("VmRSS:", 0) == 0)
      out.current = kb(line);
  }
  return out;
}

} // namespace troupe::runtime
