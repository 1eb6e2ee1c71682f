#include "runtime/compute.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <thread>

namespace troupe::runtime {

int set_compute_threads(int requested) {
  int n = requested > 0 ? requested : static_cast<int>(std::thread::hardware_concurrency());
  at::set_num_threads(std::max(n, 1));
  return at::get_num_threads();
}

} // namespace troupe::runtime
