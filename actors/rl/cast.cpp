#include "actors/rl/cast.hpp"

#include "actors/inference/rollout_group.hpp"
#include "actors/rl/job_internal.hpp"
#include "actors/train/engine_actor.hpp"
#include "actors/train/engine_group.hpp"
#include "actors/weight_channel.hpp"

#include <caf/all.hpp>

#include <algorithm>

namespace troupe::actors::rl::detail {

cast::cast(cast_env env, stage_id stage) : env_(std::move(env)), stage_(stage) {}
cast::cast(cast&&) noexcept = default;
cast& cast::operator=(cast&&) noexcept = default;

cast::~cast() {
  stop();
}

void cast::announce(const role_spec& spec, const char* status, const std::string& reason) const {
  job::role_changed ev;
  ev.status = status;
  ev.reason = reason;
  announce(spec, std::move(ev));
}

void cast::announce(const role_spec& spec, job::role_changed ev) const {
  if (!env_.emit)
    return;
  ev.stage = spec.stage;
  ev.role = spec.role;
  for (int32_t r = 0; r < spec.layout.ranks(); ++r) {
    auto place = env_.host->where(spec.role, r);
    ev.rank = r;
    ev.process = place.process;
    ev.pid = place.pid;
    ev.node = place.node;
    env_.emit(ev);
  }
}

void cast::announce(role_id role, job::role_changed ev) const {
  if (const auto* m = member(role))
    announce(m->spec, std::move(ev));
}

namespace {

// A rollout of several ranks behind one handle: its TP groups of `tp`
// consecutive ranks (NOTE [rollout group]), and over dp of them (or of
// single engines) a fleet (NOTE [rollout fleet]).
expected<inference::rollout_actor>
rollout_handle(caf::actor_system& sys, const std::vector<caf::actor>& ranks, int64_t tp) {
  std::vector<inference::rollout_actor> replicas;
  const auto width = static_cast<size_t>(std::max<int64_t>(tp, 1));
  for (size_t first = 0; first < ranks.size(); first += width) {
    std::vector<inference::rollout_actor> typed;
    for (size_t r = first; r < std::min(first + width, ranks.size()); ++r)
      typed.push_back(caf::actor_cast<inference::rollout_actor>(ranks[r]));
    if (typed.size() == 1) {
      replicas.push_back(typed.front());
      continue;
    }
    auto group = inference::spawn_rollout_group(sys, std::move(typed));
    if (!group)
      return group.error();
    replicas.push_back(*group);
  }
  if (replicas.size() == 1)
    return replicas.front();
  return inference::spawn_rollout_fleet(sys, std::move(replicas));
}

} // namespace

expected<void> cast::spawn(role_id role, const std::string& model_dir) {
  const auto& traits = traits_of(role);
  auto stage_name = std::string{to_string(stage_)};
  if (has(role))
    return make_error(errc::invalid_argument,
                      stage_name + ": " + std::string{traits.name} + " is already in the cast");
  role_spec spec;
  spec.stage = stage_name;
  spec.role = std::string{traits.name};
  spec.job_yaml = env_.job_yaml;
  spec.model_dir = model_dir;
  if (env_.layout_of)
    spec.layout = env_.layout_of(role);
  spec.timeout_ms = env_.group_timeout_ms;
  announce(spec, "started", "");
  if (env_.rollbacks > 0) // NOTE [rollback]
    spec.group_name = group_name(spec, 0);
  auto ranks = env_.host->spawn(*env_.sys, spec);
  if (!ranks) {
    announce(spec, "failed", describe(ranks.error()));
    return with_prefix(ranks.error(), stage_name + ": spawning " + spec.role);
  }
  announce(spec, "ready", "");
  cast_member m;
  m.traits = &traits;
  m.spec = std::move(spec);
  m.ranks = std::move(*ranks);
  auto handle = handle_of(m);
  if (!handle)
    return handle.error();
  m.handle = std::move(*handle);
  members_.push_back(std::move(m));
  return {};
}

expected<caf::actor> cast::handle_of(const cast_member& m) const {
  if (m.ranks.size() == 1)
    return m.ranks.front();
  if (m.traits->actor_in(stage_) == role_actor::rollout) {
    auto group = rollout_handle(*env_.sys, m.ranks, m.spec.layout.tp);
    if (!group) {
      for (const auto& a : m.ranks)
        caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
      return with_prefix(group.error(), m.spec.stage + ": " + m.spec.role);
    }
    return caf::actor_cast<caf::actor>(*group);
  }
  // The other roles with several ranks are train engines (the plan
  // refuses the rest): one group actor (NOTE [tensor-parallel dispatch]).
  std::vector<train::engine_actor> typed;
  for (const auto& a : m.ranks)
    typed.push_back(caf::actor_cast<train::engine_actor>(a));
  auto strategy = env_.strategy_of ? env_.strategy_of(m.traits->id) : train::dp_strategy::ddp;
  return caf::actor_cast<caf::actor>(train::spawn_engine_group(
      *env_.sys, m.spec.role, std::move(typed), strategy, m.spec.layout.tp, m.spec.layout.pp));
}

std::string cast::group_name(const role_spec& spec, uint64_t generation) const {
  auto name = spec.stage + "/" + spec.role + "/";
  if (env_.rollbacks > 0)
    name += "r" + std::to_string(env_.rollbacks);
  if (generation > 0)
    name += "g" + std::to_string(generation);
  return name;
}

expected<void> cast::revive(role_id role) {
  role_spec spec;
  spec.stage = std::string{to_string(stage_)};
  spec.role = std::string{to_string(role)};
  if (env_.layout_of)
    spec.layout = env_.layout_of(role);
  if (auto ok = env_.host->revive(spec); !ok)
    return with_prefix(ok.error(), spec.stage + ": restarting " + spec.role + "'s processes");
  return {};
}

expected<void> cast::respawn(role_id role) {
  auto it = std::find_if(members_.begin(), members_.end(),
                         [role](const cast_member& m) { return m.traits->id == role; });
  if (it == members_.end())
    return make_error(errc::not_found,
                      "respawn: " + std::string{to_string(role)} + " is not in the cast");
  // The old instance ends (its proxies end their ranks, where they still run).
  caf::anon_send_exit(it->handle, caf::exit_reason::user_shutdown);
  auto spec = it->spec;
  // NOTE [supervision]: the new generation's groups meet under a prefix
  // of their own, so a rank of an older one cannot join them.
  spec.group_name = group_name(spec, it->generation + 1);
  const auto where = spec.stage + ": restarting " + spec.role;
  if (auto ok = env_.host->revive(spec); !ok)
    return with_prefix(ok.error(), where);
  auto ranks = env_.host->spawn(*env_.sys, spec);
  if (!ranks)
    return with_prefix(ranks.error(), where);
  it->ranks = std::move(*ranks);
  it->spec = std::move(spec);
  auto handle = handle_of(*it);
  if (!handle)
    return handle.error();
  it->handle = std::move(*handle);
  ++it->generation;
  return {};
}

bool cast::kill(role_id role, int rank, int64_t collective, bool hang) {
  const auto* m = member(role);
  if (!m || rank < 0 || static_cast<size_t>(rank) >= m->ranks.size())
    return false;
  // A rank in the driver's process ends alone; one in a worker, its process.
  const bool whole = env_.host->where(m->spec.role, rank).process != "driver";
  const auto& target = m->ranks[static_cast<size_t>(rank)];
  if (collective > 0 && hang && whole)
    env_.self->send(target, actors::inject_hang_atom::value, collective);
  else if (collective > 0)
    env_.self->send(target, actors::inject_kill_atom::value, whole, collective);
  else
    env_.self->send(target, actors::inject_kill_atom::value, whole);
  return true;
}

const cast_member* cast::member(role_id role) const {
  auto it = std::find_if(members_.begin(), members_.end(),
                         [role](const cast_member& m) { return m.traits->id == role; });
  return it == members_.end() ? nullptr : &*it;
}

bool cast::has(role_id role) const {
  return member(role) != nullptr;
}

caf::actor cast::handle(role_id role) const {
  const auto* m = member(role);
  return m ? m->handle : caf::actor{};
}

void cast::for_each(const std::function<void(const cast_member&)>& f) const {
  for (const auto& m : members_)
    f(m);
}

uint64_t cast::generation(role_id role) const {
  const auto* m = member(role);
  return m ? m->generation : 0;
}

void cast::stop() {
  // The handle: the only rank, or the group, which ends its ranks.
  for (const auto& m : members_)
    caf::anon_send_exit(m.handle, caf::exit_reason::user_shutdown);
  members_.clear();
}

expected<std::optional<int64_t>> cast::release_after(std::string_view phase,
                                                     const std::function<bool(role_id)>& keep,
                                                     double& busy_s) {
  std::optional<int64_t> freed;
  for (const auto& m : members_) {
    const auto& t = *m.traits;
    if (t.rl_idle_after != phase || (keep && keep(t.id)))
      continue;
    auto what = std::string{t.name} + ": release";
    auto actor = t.actor_in(stage_);
    if (actor == role_actor::judge && m.spec.model_dir.empty())
      continue; // a rule holds nothing to free
    expected<int64_t> got = int64_t{0};
    if (actor == role_actor::rollout) {
      got = make_error(errc::internal, what + ": no reply");
      env_.self->request(m.handle, env_.control_timeout, actors::release_atom::value)
          .receive([&](int64_t bytes) { got = bytes; },
                   [&](caf::error& e) { got = request_error(e, what, env_.control_timeout); });
    } else {
      got = make_error(errc::internal, what + ": no reply");
      env_.self
          ->request(m.handle, env_.state_timeout, actors::release_atom::value, env_.offload_dir)
          .receive(
              [&](train::served_bytes& b) {
                busy_s += b.busy_s;
                got = b.value;
              },
              [&](caf::error& e) { got = request_error(e, what, env_.state_timeout); });
    }
    if (!got)
      return got.error();
    freed = freed.value_or(0) + *got;
  }
  return freed;
}

bool cast::inject(role_id role) {
  const auto* m = member(role);
  if (!m || !m->traits->injectable)
    return false;
  // From the driver itself: its next request to the role comes after this.
  env_.self->send(m->handle, train::inject_failure_atom::value);
  return true;
}

expected<void> cast::replace(role_id role, int rank, caf::actor fresh) {
  auto it = std::find_if(members_.begin(), members_.end(),
                         [role](const cast_member& m) { return m.traits->id == role; });
  auto name = std::string{to_string(role)};
  if (it == members_.end())
    return make_error(errc::not_found, "replace: " + name + " is not in the cast");
  if (rank < 0 || static_cast<size_t>(rank) >= it->ranks.size())
    return make_error(errc::out_of_range,
                      "replace: " + name + " has no rank " + std::to_string(rank));
  if (it->ranks.size() > 1)
    return make_error(errc::unsupported, "replace: rank " + std::to_string(rank) + " of " + name +
                                             "'s DP group (a group's ranks are not swapped yet)");
  if (!fresh)
    return make_error(errc::invalid_argument, "replace: " + name + ": no actor");
  it->ranks[static_cast<size_t>(rank)] = fresh;
  it->handle = fresh;
  ++it->generation;
  return {};
}

} // namespace troupe::actors::rl::detail
