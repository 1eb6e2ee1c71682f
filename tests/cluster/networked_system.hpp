#pragma once
// An actor system with troupe's message types and CAF's middleman loaded,
// for tests that talk across systems or processes. The config lives beside
// the system because CAF keeps a reference to it.
#include "actors/actor_system.hpp"
#include "cluster/workers.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <memory>

namespace troupe::test {

struct networked_system {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  networked_system() {
    actors::configure(cfg);
    cluster::configure_network(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

} // namespace troupe::test
