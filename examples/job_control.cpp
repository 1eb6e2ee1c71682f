// Drives a job through its job actor from C++: start a small PPO job, pause
// it at the start of iteration 2, raise the KL coefficient, resume, and
// print the events as they arrive. Usage: job_control_example RUN_DIR
#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"

#include <caf/all.hpp>

#include <cstdio>
#include <string>

using namespace troupe;
namespace job = troupe::actors::job;

namespace {

const char* yaml =
    "stages: [sft, rl]\n"
    "run: {seed: 3, progress: none}\n"
    "data: {task: sort, min_digits: 2, max_digits: 3, train_size: 64, eval_size: 8}\n"
    "model: {hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 2,\n"
    "        num_kv_heads: 1, max_position_embeddings: 24}\n"
    "sft: {steps: 3, batch_size: 8, eval_every: 0}\n"
    "rl: {iterations: 3, prompts_per_iteration: 4, eval_every: 0, generation: {max_tokens: 5},\n"
    "     rollout: {num_blocks: 64, block_size: 4}}\n";

// Prints what a user watching the job would want to see.
caf::behavior printer(caf::event_based_actor* self) {
  return {[=](const job::event& e) {
    if (auto* s = std::get_if<job::state_changed>(&e.body)) {
      std::printf("#%lld state %s -> %s %s\n", static_cast<long long>(e.seq),
                  std::string{job::to_string(s->from)}.c_str(),
                  std::string{job::to_string(s->to)}.c_str(), s->reason.c_str());
      if (job::is_final(s->to))
        self->quit();
    } else if (auto* m = std::get_if<job::metrics_reported>(&e.body)) {
      auto it = m->metrics.find("actor/reward_kl_penalty_coeff");
      std::printf("#%lld %s step %lld/%lld kl_coeff %s\n", static_cast<long long>(e.seq),
                  m->stage.c_str(), static_cast<long long>(m->step),
                  static_cast<long long>(m->total),
                  it == m->metrics.end() ? "-" : std::to_string(it->second).c_str());
    } else if (auto* u = std::get_if<job::setting_updated>(&e.body)) {
      std::printf("#%lld setting %s = %s (was %s) from iteration %lld\n",
                  static_cast<long long>(e.seq), u->key.c_str(), u->value.c_str(),
                  u->previous.c_str(), static_cast<long long>(u->iteration));
    }
  }};
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s RUN_DIR\n", argv[0]);
    return 2;
  }
  auto doc = runtime::yaml_document::from_text(yaml, "job_control.yaml");
  if (!doc || !doc->set(std::string{"run.dir="} + argv[1]))
    return 1;
  auto cfg = runtime::load_config<actors::rl::job_config>(*doc);
  if (!cfg) {
    std::fprintf(stderr, "%s\n", describe(cfg.error()).c_str());
    return 1;
  }
  caf::actor_system_config sc;
  actors::configure(sc);
  caf::actor_system sys{sc};
  auto j = actors::rl::spawn_rl_job(sys, *cfg, {});
  if (!j) {
    std::fprintf(stderr, "%s\n", describe(j.error()).c_str());
    return 1;
  }
  caf::scoped_actor self{sys};
  auto watch = sys.spawn(printer);
  auto call = [&](auto... xs) {
    bool ok = false;
    self->request(j->actor, std::chrono::seconds(60), xs...)
        .receive([&](job::job_status&) { ok = true; },
                 [&](caf::error& e) { std::fprintf(stderr, "%s\n", caf::to_string(e).c_str()); });
    return ok;
  };
  self->request(j->actor, std::chrono::seconds(10), job::subscribe_atom::value, watch, int64_t{1})
      .receive([](int64_t) {}, [](caf::error&) {});
  if (!call(job::pause_at_atom::value, std::string{"rl:2"}) || !call(job::start_atom::value))
    return 1;
  // Wait until the job is paused, then change a setting and resume.
  for (;;) {
    job::job_status st;
    self->request(j->actor, std::chrono::seconds(10), job::status_atom::value)
        .receive([&](job::job_status& s) { st = s; }, [](caf::error&) {});
    if (st.state == job::job_state::paused)
      break;
    if (job::is_final(st.state))
      return 1;
    self->receive(caf::after(std::chrono::milliseconds(50)) >> [] {});
  }
  if (!call(job::update_atom::value, std::string{"rl.kl.coef"}, std::string{"0.2"}) ||
      !call(job::resume_atom::value))
    return 1;
  job::job_status end;
  self->request(j->actor, std::chrono::minutes(10), job::await_atom::value)
      .receive([&](job::job_status& s) { end = s; }, [](caf::error&) {});
  self->wait_for(watch);
  self->send_exit(j->actor, caf::exit_reason::user_shutdown);
  std::printf("final state %s\n", std::string{job::to_string(end.state)}.c_str());
  return end.state == job::job_state::succeeded ? 0 : 1;
}
