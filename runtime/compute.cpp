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

// libgomp's, linked with the OpenMP runtime (no OpenMP flags on this file).
extern "C" void omp_set_num_threads(int);

int set_thread_compute_threads(int requested) {
  // ATen sets a thread's count from the process's on the thread's first
  // parallel call: make that happen first, so it does not undo this.
  (void)at::get_num_threads();
  int n = requested > 0 ? requested : static_cast<int>(std::thread::hardware_concurrency());
  omp_set_num_threads(std::max(n, 1)); // the calling thread's setting only
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
