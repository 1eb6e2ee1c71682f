#include "actors/rl/roles.hpp"

#include "actors/rl/environment.hpp"

#include "actors/rl/role_traits.hpp"

#include "actors/inference/rollout.hpp"
#include "actors/rl/job_config.hpp"
#include "actors/rl/job_internal.hpp"
#include "actors/rl/placement.hpp"
#include "actors/rl/reward.hpp"
#include "actors/rl/stage_table.hpp"
#include "actors/rl/supervision.hpp"
#include "actors/role_proxy.hpp"
#include "actors/train/engine_actor.hpp"
#include "runtime/collectives.hpp"
#include "runtime/compute.hpp"
#include "runtime/config.hpp"
#include "runtime/shm_collectives.hpp"

#include <caf/all.hpp>

#include <thread>

#include <unistd.h>

namespace troupe::actors::rl {

role_host::place role_host::where(const std::string&, int) const {
  return {"driver", static_cast<int64_t>(::getpid())};
}

namespace {

// The model a role starts from, and how: head, whether a missing head is
// initialised fresh, and the seed of torch's RNG while loading (fresh heads
// are then the same in every process).
struct model_recipe {
  models::head_kind head = models::head_kind::lm;
  bool allow_missing_head = false;
  uint64_t seed = 0;
  std::optional<train::optimizer_options> optim;
  role_actor actor = role_actor::trainer;
};

// Read off the role and stage tables (NOTE [stage table]).
expected<model_recipe> recipe_of(const job_config& cfg, const role_spec& s) {
  const auto* stage = find_stage(s.stage);
  const auto* role = find_role(s.role);
  if (!stage || !role || !in_cast(stage->id, role->id, cfg))
    return make_error(errc::invalid_argument, "no role '" + s.role + "' in stage '" + s.stage + "'");
  model_recipe r;
  r.head = role->head;
  r.allow_missing_head = role->fresh_head_in(stage->id);
  r.seed = stage->seed(cfg, *role);
  if (role->trains_in(stage->id))
    r.optim = stage->optim(cfg, role->id);
  r.actor = role->actor_in(stage->id);
  return r;
}

// Whether every rank of `line` binds the same host as this one (`host`):
// then they share a node. Each rank's host is broadcast in turn; every
// rank reaches the same answer.
expected<bool> on_one_host(runtime::process_group& line, const std::string& host) {
  bool same = true;
  for (int r = 0; r < line.size(); ++r) {
    std::string theirs = host;
    if (auto ok = runtime::broadcast_bytes(line, theirs, r); !ok)
      return ok.error();
    same = same && theirs == host;
  }
  return same;
}

// The groups of a trainer rank: the store client and the gloo group of its
// DP line; with tp or pp > 1 the role's group is a {dp, pp, tp} mesh (NOTE
// [parallel layout]), split into the DP, PP and TP lines (NOTE [tensor
// parallelism], NOTE [pipeline parallelism]).
expected<std::shared_ptr<train::data_parallel_group>> join_group(const role_spec& s) {
  auto st = runtime::connect_tcp_store(s.group_store, s.timeout_ms);
  if (!st)
    return with_prefix(st.error(), "joining the DP group");
  auto out = std::make_shared<train::data_parallel_group>();
  out->store = std::move(*st);
  runtime::group_options go;
  go.rank = s.rank;
  go.world_size = s.layout.ranks();
  go.name = s.group_name;
  go.interface_host = s.host;
  go.timeout_ms = s.timeout_ms;
  auto g = runtime::make_process_group(out->store, go);
  if (!g)
    return with_prefix(g.error(), "joining the DP group");
  if (s.layout.tp == 1 && s.layout.pp == 1) {
    out->group = std::move(*g);
    return out;
  }
  out->mesh = std::make_shared<runtime::process_group>(std::move(*g));
  const runtime::rank_mesh mesh{{s.layout.dp, s.layout.pp, s.layout.tp}};
  auto lines = runtime::make_mesh_groups(*out->mesh, mesh, {"dp", "pp", "tp"});
  if (!lines)
    return with_prefix(lines.error(), "splitting the role's mesh into its DP, PP and TP groups");
  out->group = std::move((*lines)[0]);
  auto pp = std::move((*lines)[1]);
  if (s.layout.pp > 1) {
    auto local = on_one_host(pp, s.host);
    if (!local)
      return with_prefix(local.error(), "the pipeline line's hosts");
    if (*local) { // its hand-offs through shared memory (NOTE [shm point-to-point])
      const auto line = mesh.line_index(s.rank, 1);
      auto shm = runtime::with_shm_point_to_point(
          std::move(pp), out->store, s.group_name + "/pp" + std::to_string(line), pp_slot_bytes,
          pp_slots(s.layout.pp), s.timeout_ms);
      if (!shm)
        return with_prefix(shm.error(), "the pipeline line's shared memory");
      pp = std::move(*shm);
    }
  }
  out->pp = std::make_shared<runtime::process_group>(std::move(pp));
  // A TP group is on one node (the planner's rule): its sums go through
  // shared memory (NOTE [shm all-reduce]).
  auto tp = std::move((*lines)[2]);
  if (s.layout.tp > 1) {
    auto shm = runtime::with_shm_collectives(
        std::move(tp), out->store, s.group_name + "/tp" + std::to_string(s.rank / s.layout.tp),
        tp_slot_bytes, s.timeout_ms);
    if (!shm)
      return with_prefix(shm.error(), "the tensor-parallel group's shared memory");
    tp = std::move(*shm);
  }
  out->tp = std::make_shared<runtime::process_group>(std::move(tp));
  return out;
}

// The built-in reward backends (NOTE [reward backends]): the rule and / or
// a reward model loaded from the spec's directory, by rl.reward.kind.
expected<std::vector<weighted_backend>> builtin_reward(const job_config& cfg, const role_spec& s,
                                                       const model_recipe& recipe,
                                                       const role_factories& factories) {
  const auto& r = cfg.rl.reward;
  std::vector<weighted_backend> out;
  if (r.kind == reward_kind::remote) {
    if (!factories.remote_reward)
      return make_error(errc::unsupported,
                        "rl.reward.kind: remote needs the RewardService client of troupe's "
                        "processes (a program embedding the actors passes "
                        "run_options::factories.remote_reward)");
    auto tok = detail::job_tokenizer(cfg.model);
    auto b = tok ? factories.remote_reward(cfg, tok->tok)
                 : expected<std::unique_ptr<reward_backend>>{tok.error()};
    if (!b)
      return b.error();
    out.push_back({std::move(*b), 1.0});
    return out;
  }
  if (uses_rules(r)) {
    auto tok = detail::job_tokenizer(cfg.model);
    if (!tok)
      return tok.error();
    auto rules = rule_set::make(reward_rules(r), cfg.rl.generation.max_tokens);
    if (!rules)
      return with_prefix(rules.error(), "rl.reward");
    out.push_back({make_rule_backend(tok->tok, std::move(*rules)), r.rule_weight});
  }
  if (uses_reward_model(r)) {
    auto m = detail::load_model(s.model_dir, recipe.head, false, recipe.seed);
    if (!m)
      return with_prefix(m.error(), "loading " + s.model_dir);
    auto e = train::train_engine::make(*m, std::nullopt);
    if (!e)
      return e.error();
    if (auto ok = (*e)->set_precision(placement_keys(cfg, s.role).compute); !ok)
      return ok.error();
    out.push_back({make_model_backend(std::move(*e)), r.model_weight});
  }
  return out;
}

// The rollout's engine; under TP (NOTE [rollout group]) one rank's: on its
// part of the model, driven by the group. With several ranks (TP ranks, a
// fleet's replicas: NOTE [rollout fleet]) each takes its share of the
// process's compute threads (a role's ranks run in one process at once).
expected<caf::actor> build_rollout(caf::actor_system& sys, const job_config& cfg,
                                   const role_spec& s, models::llama_model model,
                                   std::shared_ptr<train::data_parallel_group> groups) {
  inference::rollout_options options;
  if (s.layout.ranks() > 1) {
    const int64_t threads = cfg.run.threads > 0
                                ? cfg.run.threads
                                : static_cast<int64_t>(std::thread::hardware_concurrency());
    options.threads = static_cast<int>(std::max<int64_t>(1, threads / s.layout.ranks()));
  }
  if (groups) {
    auto part = models::partition_llama(model->config(), *groups->tp);
    if (!part)
      return with_prefix(part.error(), s.role);
    auto mine = models::make_model_part(model, *part);
    if (!mine)
      return mine.error();
    model = std::move(*mine);
    options.driven = true;
    options.keep_alive = std::move(groups); // the model sums over its TP group
  } else if (cfg.rl.inflight_updates) {     // NOTE [paced rollout]: a driven rank is not paced
    options.pace = cfg.rl.inflight_steps;
  }
  auto a = inference::spawn_rollout(sys, std::move(model), engine_settings(cfg), options);
  if (!a)
    return a.error();
  return caf::actor_cast<caf::actor>(*a);
}

expected<caf::actor> build(caf::actor_system& sys, const job_config& cfg, const role_spec& s,
                           const role_factories& factories) {
  auto recipe = recipe_of(cfg, s);
  if (!recipe)
    return recipe.error();
  const auto& l = s.layout;
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || s.rank < 0 || s.rank >= l.ranks())
    return make_error(errc::invalid_argument, "rank " + std::to_string(s.rank) + " of a layout dp " +
                                                std::to_string(l.dp) + " tp " + std::to_string(l.tp) +
                                                " pp " + std::to_string(l.pp));
  const bool rollout = recipe->actor == role_actor::rollout;
  if ((l.tp > 1 || l.pp > 1) && recipe->actor != role_actor::trainer && !(rollout && l.pp == 1))
    return make_error(errc::unsupported,
                      "model parallelism (tp " + std::to_string(l.tp) + ", pp " +
                          std::to_string(l.pp) +
                          ") is for the roles a train engine runs (policy, critic, reference, a "
                          "trained reward model) and tp for the rollout; " +
                          s.role + "'s is not available yet");
  if (l.dp > 1 && !recipe->optim && !rollout) // a rollout's: NOTE [rollout fleet]
    return make_error(errc::invalid_argument,
                      "data parallelism (dp " + std::to_string(l.dp) +
                          ") is for trained roles (policy, critic, the rm stage's reward)");
  runtime::set_compute_threads(static_cast<int>(cfg.run.threads));

  if (recipe->actor == role_actor::judge) {
    auto backends =
        factories.reward ? factories.reward(cfg, s) : builtin_reward(cfg, s, *recipe, factories);
    if (!backends)
      return backends.error();
    auto a = spawn_reward(sys, std::move(*backends));
    if (!a)
      return a.error();
    return caf::actor_cast<caf::actor>(*a);
  }

  auto model = detail::load_model(s.model_dir, recipe->head, recipe->allow_missing_head, recipe->seed);
  if (!model)
    return with_prefix(model.error(), "loading " + s.model_dir);
  std::shared_ptr<train::data_parallel_group> groups;
  if (l.ranks() > 1 && !(rollout && l.tp == 1)) { // a fleet's replicas share no collective
    auto g = join_group(s);
    if (!g)
      return g.error();
    groups = std::move(*g);
  }
  if (rollout)
    return build_rollout(sys, cfg, s, std::move(*model), std::move(groups));
  const auto placed = placement_keys(cfg, s.role);
  if (l.tp > 1 || l.pp > 1) { // this rank's part of the model (NOTE [tensor parallelism])
    auto part = models::partition_llama((*model)->config(), *groups->tp);
    if (!part)
      return with_prefix(part.error(), s.role);
    auto stage = models::stage_of((*model)->config(), *groups->pp, placed.pp_layers);
    if (!stage)
      return with_prefix(stage.error(), s.role);
    model = models::make_model_part(*model, *part, *stage);
    if (!model)
      return model.error();
  }
  auto engine = train::train_engine::make(*model, recipe->optim);
  if (!engine)
    return engine.error();
  if (auto ok = (*engine)->set_pipeline_micro_batches(placed.pp_micro_batches); !ok)
    return ok.error();
  if (auto ok = (*engine)->set_precision(placed.compute); !ok)
    return ok.error();
  if (auto ok = (*engine)->set_micro_batch_rows(placed.micro_batch_rows); !ok)
    return ok.error();
  if (auto ok = (*engine)->set_micro_batch_tokens(placed.micro_batch_tokens); !ok)
    return ok.error();
  if (s.stage == "rl" && s.role == "policy" && cfg.rl.true_on_policy) // NOTE [true on-policy]
    if (auto ok = (*engine)->set_batch_invariant(true); !ok)
      return with_prefix(ok.error(), "rl.true_on_policy: policy");
  if (groups)
    if (auto ok = (*engine)->join_data_parallel(groups, {placed.strategy, placed.bucket_mb}); !ok)
      return ok.error();
  // NOTE [peer state]: a trainer that may restart from a peer keeps the
  // state its updates begin from.
  if (const auto* t = find_role(s.role);
      t && recipe->optim && detail::keeps_state_before_updates(cfg, s.stage, t->id))
    if (auto ok = (*engine)->keep_state_before_updates(true); !ok)
      return with_prefix(ok.error(), "supervision.roles: " + s.role);
  return caf::actor_cast<caf::actor>(
      train::spawn_engine_actor(sys, rank_name(s.role, s.layout, s.rank), std::move(*engine)));
}

} // namespace

namespace detail {

expected<job_tokenizer_info> job_tokenizer(const model_config& m) {
  job_tokenizer_info out;
  if (!m.path.empty()) {
    auto tok = models::load_tokenizer(m.path);
    if (!tok)
      return with_prefix(tok.error(), "model.path: tokenizer");
    auto pad = (*tok)->pad_id() ? (*tok)->pad_id() : (*tok)->eos_id();
    if (!pad)
      return make_error(errc::invalid_config,
                        "model.path: the tokenizer has neither a pad nor an eos token");
    out.pad = *pad;
    out.tok = std::shared_ptr<const models::tokenizer>(std::move(*tok));
    return out;
  }
  auto tok = std::make_shared<models::byte_tokenizer>();
  models::special_token_ids ids;
  ids.bos = models::byte_tokenizer::bos_token;
  ids.eos = models::byte_tokenizer::eos_token;
  ids.pad = models::byte_tokenizer::pad_token;
  if (auto ok = tok->set_special_ids(ids); !ok)
    return ok.error();
  out.tok = tok;
  out.pad = models::byte_tokenizer::pad_token;
  return out;
}

} // namespace detail

expected<caf::actor> spawn_role(caf::actor_system& sys, const role_spec& spec,
                                const role_factories& factories) {
  auto where = spec.stage + " " + spec.role;
  auto doc = runtime::yaml_document::from_text(spec.job_yaml, "role spec (" + where + ")");
  if (!doc)
    return with_prefix(doc.error(), spec.role);
  auto cfg = runtime::load_config<job_config>(*doc);
  if (!cfg)
    return with_prefix(cfg.error(), spec.role);
  auto a = build(sys, *cfg, spec, factories);
  if (!a)
    return with_prefix(a.error(), spec.role);
  return a;
}

expected<std::vector<caf::actor>> spawn_ranks(
    const role_spec& spec, std::vector<std::shared_ptr<void>>& stores, const std::string& store_host,
    const std::function<expected<caf::actor>(const role_spec&)>& spawn_one) {
  auto n = spec.layout.ranks();
  if (n < 1)
    return make_error(errc::invalid_argument, spec.role + ": " + std::to_string(n) + " ranks");
  if (n == 1) {
    auto a = spawn_one(spec);
    if (!a)
      return a.error();
    return std::vector<caf::actor>{*a};
  }
  runtime::store_options so;
  so.host = store_host;
  so.is_server = true;
  so.timeout_ms = spec.timeout_ms;
  auto st = runtime::make_tcp_store(so);
  if (!st)
    return with_prefix(st.error(), spec.role + ": the DP group's store");
  auto server = std::make_shared<runtime::store>(std::move(*st));
  auto addr = so.host + ":" + std::to_string(server->port());
  stores.push_back(server);
  std::vector<expected<caf::actor>> got(static_cast<size_t>(n), make_error(errc::internal, "not built"));
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto s = spec;
      s.rank = r;
      s.group_store = addr;
      if (s.group_name.empty())
        s.group_name = spec.stage + "/" + spec.role;
      got[static_cast<size_t>(r)] = spawn_one(s);
    });
  for (auto& t : threads)
    t.join();
  std::vector<caf::actor> out;
  caf::error first;
  for (size_t r = 0; r < got.size(); ++r) {
    if (got[r])
      out.push_back(*got[r]);
    else if (!first)
      first = with_prefix(got[r].error(), "dp rank " + std::to_string(r));
  }
  if (first) {
    for (auto& a : out)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    return first;
  }
  return out;
}

expected<std::vector<caf::actor>> in_process_host::spawn(caf::actor_system& sys,
                                                          const role_spec& spec) {
  return spawn_ranks(spec, stores_, store_host(), [&](const role_spec& s) -> expected<caf::actor> {
    auto a = spawn_role(sys, s, factories_);
    if (!a)
      return a.error();
    return spawn_role_proxy(sys, std::move(*a), rank_name(s.role, s.layout, s.rank) + " (driver)");
  });
}

expected<std::shared_ptr<environment>> job_environment(const job_config& cfg,
                                                       const role_factories& factories) {
  const auto& e = cfg.rl.environment;
  switch (e.kind) {
  case environment_kind::none:
    return std::shared_ptr<environment>{};
  case environment_kind::remote: {
    if (!factories.remote_environment)
      return make_error(errc::unsupported,
                        "rl.environment.kind: remote needs the EnvironmentService client of "
                        "troupe's processes (a program embedding the actors passes "
                        "run_options::factories.remote_environment)");
    auto env = factories.remote_environment(cfg);
    if (!env)
      return env.error();
    return std::shared_ptr<environment>{std::move(*env)};
  }
  case environment_kind::task:
  case environment_kind::calculator:
    break;
  }
  auto rules = rule_set::make(reward_rules(cfg.rl.reward), cfg.rl.generation.max_tokens);
  if (!rules)
    return with_prefix(rules.error(), "rl.environment");
  if (e.kind == environment_kind::task)
    return std::shared_ptr<environment>{make_task_environment(std::move(*rules))};
  return std::shared_ptr<environment>{make_calculator_environment(std::move(*rules))};
}

} // namespace troupe::actors::rl
