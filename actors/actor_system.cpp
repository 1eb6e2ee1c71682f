#include "actors/actor_system.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>

namespace troupe::actors {

using ping_atom = caf::atom_constant<caf::atom("ping")>;

void configure(caf::actor_system_config& cfg) {
  cfg.add_error_category(error_category(), [](uint8_t code, caf::atom_value,
                                              const caf::message& ctx) {
    std::string out{to_string(static_cast<errc>(code))};
    if (ctx.size() == 1 && ctx.match_element<std::string>(0))
      out += ": " + ctx.get_as<std::string>(0);
    return out;
  });
}

namespace {

caf::behavior echo(caf::event_based_actor*) {
  return {[](ping_atom, int64_t x) { return x; }};
}

} // namespace

expected<std::vector<double>> measure_round_trip(caf::actor_system& sys, int count,
                                                 int64_t timeout_ms) {
  if (count <= 0)
    return make_error(errc::invalid_argument, "round-trip count must be positive");
  auto server = sys.spawn(echo);
  caf::scoped_actor self{sys};
  std::vector<double> us;
  us.reserve(static_cast<size_t>(count));
  caf::error failure;
  for (int i = 0; i < count && !failure; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    self->request(server, std::chrono::milliseconds(timeout_ms), ping_atom::value, int64_t{i})
      .receive(
        [&](int64_t back) {
          auto t1 = std::chrono::steady_clock::now();
          if (back != i)
            failure = make_error(errc::internal, "echo actor answered the wrong request");
          us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        },
        [&](caf::error& err) { failure = std::move(err); });
  }
  self->send_exit(server, caf::exit_reason::user_shutdown);
  if (failure)
    return failure;
  std::sort(us.begin(), us.end());
  return us;
}

} // namespace troupe::actors
