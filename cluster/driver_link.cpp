#include "cluster/driver_link.hpp"

#include <caf/all.hpp>

#include <deque>
#include <map>
#include <optional>
#include <vector>

namespace troupe::cluster {

namespace {

struct front_state {
  std::optional<worker_request_file> workers;
  std::optional<caf::actor> job;
  std::vector<caf::typed_response_promise<worker_request_file>> asked_workers;
  std::vector<caf::typed_response_promise<caf::actor>> asked_job;
  /// NOTE [replacing a worker]: workers the driver wants again, not yet
  /// handed to a controller; those handed out (to `handed_to`) and not
  /// answered; the driver's waits, by rank; a controller's wait.
  std::deque<worker_entry> to_replace;
  std::map<int32_t, worker_entry> handed;
  caf::actor_addr handed_to;
  std::map<int32_t, caf::typed_response_promise<worker_replaced>> replacing;
  std::vector<caf::typed_response_promise<worker_entry>> asked_replace;
  static inline const char* name = "troupe.driver_front";
};

// The next worker to replace for the controller asking (`asker`). Asks
// handed to another controller, one that went away before answering (it
// restarted), are handed out again.
std::optional<worker_entry> next_to_replace(front_state& s, const caf::actor_addr& asker) {
  if (s.handed_to != asker) {
    for (auto& [rank, x] : s.handed)
      s.to_replace.push_back(x);
    s.handed.clear();
    s.handed_to = asker;
  }
  if (s.to_replace.empty())
    return std::nullopt;
  auto x = s.to_replace.front();
  s.to_replace.pop_front();
  s.handed[x.rank] = x;
  return x;
}

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
      // The driver: worker x again.
      [=](replace_worker_atom, const worker_entry& x) -> caf::result<worker_replaced> {
        auto& s = self->state;
        if (s.replacing.count(x.rank) > 0)
          return make_error(errc::invalid_argument,
                            "worker " + std::to_string(x.rank) + " is being replaced already");
        auto promise = self->make_response_promise<worker_replaced>();
        s.replacing.emplace(x.rank, promise);
        s.to_replace.push_back(x);
        if (!s.asked_replace.empty()) {
          auto asker = s.asked_replace.back();
          s.asked_replace.pop_back();
          if (auto next = next_to_replace(s, s.handed_to))
            asker.deliver(*next);
        }
        return promise;
      },
      // A controller: the next worker to replace.
      [=](replace_worker_atom) -> caf::result<worker_entry> {
        auto& s = self->state;
        if (auto next = next_to_replace(
                s, self->current_sender() ? self->current_sender()->address() : caf::actor_addr{}))
          return *next;
        s.asked_replace.clear(); // one controller asks at a time
        return s.asked_replace.emplace_back(self->make_response_promise<worker_entry>());
      },
      // A controller's answer.
      [=](replace_worker_atom, const worker_replaced& r) {
        auto& s = self->state;
        s.handed.erase(r.rank);
        if (auto it = s.replacing.find(r.rank); it != s.replacing.end()) {
          it->second.deliver(r);
          s.replacing.erase(it);
        }
      },
  };
}

} // namespace

caf::actor spawn_driver_front(caf::actor_system& sys) {
  return sys.spawn(front);
}

expected<job_node> ask_for_worker_again(caf::actor_system& sys, const caf::actor& front,
                                        const worker_entry& x) {
  caf::scoped_actor self{sys};
  expected<job_node> out = make_error(errc::internal, "no answer");
  self->request(front, caf::infinite, replace_worker_atom::value, x)
      .receive(
          [&](const worker_replaced& r) {
            if (!r.error.empty())
              out =
                  make_error(errc::unavailable, "the controller cannot start worker " +
                                                    std::to_string(x.rank) + " again: " + r.error);
            else
              out = job_node{r.node, r.host};
          },
          [&](caf::error& e) {
            out = make_error(errc::unavailable, "asking the controller for worker " +
                                                    std::to_string(x.rank) +
                                                    " again: " + sys.render(e));
          });
  return out;
}

} // namespace troupe::cluster
