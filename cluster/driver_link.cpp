#include "cluster/driver_link.hpp"

#include <caf/all.hpp>

#include <optional>
#include <vector>

namespace troupe::cluster {

namespace {

struct front_state {
  std::optional<worker_request_file> workers;
  std::optional<caf::actor> job;
  std::vector<caf::typed_response_promise<worker_request_file>> asked_workers;
  std::vector<caf::typed_response_promise<caf::actor>> asked_job;
  static inline const char* name = "troupe.driver_front";
};

caf::behavior front(caf::stateful_actor<front_state>* self) {
  return {
      [=](workers_atom) -> caf::result<worker_request_file> {
        auto& s = self->state;
        if (s.workers)
          return *s.workers;
        return s.asked_workers.emplace_back(self->make_response_promise<worker_request_file>());
      },
      [=](driver_job_atom) -> caf::result<caf::actor> {
        auto& s = self->state;
        if (s.job)
          return *s.job;
        return s.asked_job.emplace_back(self->make_response_promise<caf::actor>());
      },
      [=](workers_atom, const worker_request_file& w) {
        auto& s = self->state;
        s.workers = w;
        for (auto& p : std::exchange(s.asked_workers, {}))
          p.deliver(w);
      },
      [=](driver_job_atom, const caf::actor& job) {
        auto& s = self->state;
        s.job = job;
        for (auto& p : std::exchange(s.asked_job, {}))
          p.deliver(job);
      },
  };
}

} // namespace

caf::actor spawn_driver_front(caf::actor_system& sys) {
  return sys.spawn(front);
}

} // namespace troupe::cluster
