#include "actors/rl/placement.hpp"
#include "actors/rl/supervision.hpp"

#include "actors/rl/data.hpp"
#include "actors/rl/role_traits.hpp"
#include "actors/rl/roles.hpp"
#include "actors/rl/stage_table.hpp"
#include "actors/train/strategy_memory.hpp"
#include "models/config.hpp"
#include "models/pipeline_parallel.hpp"
#include "models/tensor_parallel.hpp"
#include "runtime/config.hpp"
#include "runtime/pipeline_schedule.hpp"
#include "runtime/shm_collectives.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include <unistd.h>

namespace troupe::actors::rl {

std::string rank_name(const std::string& role, const parallel_layout& l, int64_t rank) {
  if (l.ranks() == 1)
    return role;
  auto out = role + "[dp " + std::to_string(rank / (l.tp * l.pp));
  if (l.pp > 1)
    out += ", pp " + std::to_string(rank / l.tp % l.pp);
  if (l.tp > 1)
    out += ", tp " + std::to_string(rank % l.tp);
  return out + "]";
}

namespace {

bool known_role(const std::string& r) { return find_role(r) != nullptr; }

// The pools of a placement, with the colocated default.
std::vector<pool_config> pools_of(const placement_config& p) {
  if (p.pools.empty() && p.mode == placement_mode::colocated)
    return {pool_config{"all", 1}};
  return p.pools;
}

// The pool and dp of `role` (the first pool when not listed).
role_placement_config placement_of(const placement_config& p, const std::string& role) {
  for (const auto& r : p.roles)
    if (r.role == role)
      return r;
  auto pools = pools_of(p);
  role_placement_config out;
  out.role = role;
  out.pool = pools.empty() ? std::string{} : pools.front().name;
  return out;
}

// What each DP rank of `role` splits in the job's stages that train it
// (the stage table's rows).
std::vector<std::pair<std::string, int64_t>> split_rows(const job_config& c, const role_traits& role) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& st : all_stages())
    if (role.trains_in(st.id) && has_stage(c, st.name) && in_cast(st.id, role.id, c))
      out.push_back(st.dp_rows(c));
  return out;
}

using train::parameter_split;
using train::split_parameters;

int64_t parameters(const models::llama_config& c, bool lm_head) {
  return split_parameters(c, lm_head).total();
}

expected<models::llama_config> model_shape(const job_config& cfg) {
  if (!cfg.model.path.empty())
    return models::load_hf_config(cfg.model.path + "/config.json");
  models::llama_config c;
  c.vocab_size = 259; // the byte tokenizer (256 bytes + BOS, EOS, PAD)
  c.hidden_size = cfg.model.hidden_size;
  c.intermediate_size = cfg.model.intermediate_size;
  c.num_hidden_layers = cfg.model.num_layers;
  c.num_attention_heads = cfg.model.num_heads;
  c.num_key_value_heads = cfg.model.num_kv_heads;
  c.max_position_embeddings = cfg.model.max_position_embeddings;
  return c;
}

// The longest sequence a training pass sees: the built-in task's longest
// prompt plus rl.generation.max_tokens (its answers are shorter than that
// in sft and rm), else the context length (a bound).
int64_t pass_tokens(const job_config& cfg, const models::llama_config& m) {
  const bool files = !cfg.data.train_file.empty() || !cfg.data.sft_file.empty() ||
                     !cfg.data.preference_file.empty();
  const auto prompt = files ? 0 : max_task_prompt_tokens(cfg.data);
  return prompt > 0 ? std::min(prompt + cfg.rl.generation.max_tokens, m.max_position_embeddings)
                    : m.max_position_embeddings;
}

// NOTE [pipeline memory]: stage s of P holds its layers' parameters (the
// first also the embedding, the last the final norm and the head — a copy
// of the embedding when it is tied) and,
// under 1F1B, the activations of up to P − s micro-batches of its layers
// at once (NOTE [1F1B]); the head's activations are the last stage's, one
// micro-batch at a time.
void on_pipeline_stage(const models::llama_config& m, bool lm, int64_t tp, int64_t stage,
                       int64_t stages, int64_t micro, const std::vector<int64_t>& listed,
                       train::parameter_split& params, train::activation_split& activations) {
  auto counts = models::split_layers(m.num_hidden_layers, static_cast<int>(stages), listed);
  if (!counts) // the checks name it
    return;
  const auto layers = (*counts)[static_cast<size_t>(stage)];
  const auto whole_rest = params.rest;
  const auto embedding = ((m.vocab_size + tp - 1) / tp) * m.hidden_size;
  params.layers = layers;
  // A tied embedding (rest = embedding + norm) is on the last stage too.
  const bool tied = lm && m.tie_word_embeddings;
  params.rest = (stage == 0 ? embedding : 0) +
                (stage == stages - 1 ? whole_rest - (tied ? 0 : embedding) : 0);
  const double in_flight = static_cast<double>(std::min(stages - stage, micro));
  activations.layers = layers;
  activations.layer *= in_flight;
  activations.layer_input *= in_flight;
  if (stage != stages - 1) {
    activations.rest = 0;
    activations.logits = 0;
  }
}

// NOTE [communication volume] of a rank of trained role `t`.
comm_volume communication(const job_config& cfg, const models::llama_config& m,
                          const role_traits& t) {
  comm_volume out;
  const auto placed = placement_keys(cfg, t.name);
  int64_t rows = 0;
  for (const auto& st : all_stages())
    if (t.trains_in(st.id) && has_stage(cfg, st.name) && in_cast(st.id, t.id, cfg))
      rows = std::max(rows, st.dp_rows(cfg).second * st.sequences_per_row);
  if (rows == 0)
    return out;
  const auto dp = std::max<int64_t>(placed.dp, 1), tp = std::max<int64_t>(placed.tp, 1),
             pp = std::max<int64_t>(placed.pp, 1);
  const bool lm = t.head == models::head_kind::lm;
  const double w = train::bytes_per_element(placed.compute);
  auto params = split_parameters(m, lm, tp);
  auto activations = train::activation_bytes(m, lm, 1, 1, placed.compute);
  if (pp > 1) // the first stage's parameters and layers
    on_pipeline_stage(m, lm, tp, 0, pp, pp, placed.pp_layers, params, activations);
  const double phi = w * static_cast<double>(params.total());
  if (dp > 1)
    out.dp = (placed.strategy == dp_strategy::zero3 ? 3.0 : 2.0) * static_cast<double>(dp - 1) /
             static_cast<double>(dp) * phi;
  const double tokens = static_cast<double>(rows / dp * pass_tokens(cfg, m));
  const double H = static_cast<double>(m.hidden_size);
  if (tp > 1)
    out.tp = 2.0 * static_cast<double>(tp - 1) / static_cast<double>(tp) *
             (4.0 * static_cast<double>(params.layers) + 2) * tokens * H * w;
  if (pp > 1)
    out.pp = (pp > 2 ? 2.0 : 1.0) * tokens * H * w;
  return out;
}

// NOTE [rank memory] for rank `rank` of `role` training in stage `st`:
// rank 0 exports the weights (the stage's output, the policy's weight
// syncs; a zero3 peer only gathers a unit alongside, less than its
// backward holds); its share of the stage's rows a micro-batch at a time
// (rm's and dpo's rows are pairs: two sequences each).
train::rank_memory training_memory(const job_config& cfg, const models::llama_config& m,
                                   const stage_traits& st, const role_traits& t, int64_t rank) {
  const auto placed = placement_keys(cfg, t.name);
  const bool lm = t.head == models::head_kind::lm;
  const auto dp = std::max<int64_t>(placed.dp, 1);
  int64_t rows = std::max<int64_t>(st.dp_rows(cfg).second / dp, 1);
  const auto tokens = pass_tokens(cfg, m);
  if (placed.micro_batch_rows > 0)
    rows = std::min(rows, placed.micro_batch_rows);
  if (placed.micro_batch_tokens > 0) // rows of the longest length that fit the budget
    rows = std::min(rows, std::max<int64_t>(placed.micro_batch_tokens / tokens, 1));
  const auto tp = std::max<int64_t>(placed.tp, 1), pp = std::max<int64_t>(placed.pp, 1);
  const auto micro = placed.pp_micro_batches > 0 ? placed.pp_micro_batches : pp;
  if (pp > 1 && placed.micro_batch_rows == 0 && placed.micro_batch_tokens == 0)
    rows = std::max<int64_t>((rows + micro - 1) / micro, 1); // NOTE [pipeline execution]
  rows *= st.sequences_per_row;
  auto params = split_parameters(m, lm, tp);
  auto activations = train::activation_bytes(m, lm, rows, tokens, placed.compute);
  if (pp > 1)
    on_pipeline_stage(m, lm, tp, rank / tp % pp, pp, micro, placed.pp_layers, params, activations);
  // Under TP and PP rank 0 exports the whole model, gathered from its TP
  // group and received from the other stages.
  return train::training_rank_memory(placed.strategy, dp, placed.bucket_mb, params, activations,
                                     placed.compute, /*exports=*/rank == 0,
                                     static_cast<double>(split_parameters(m, lm).total()));
}

// A role that does not train in the stage: its weights (a rollout rank's
// part at `tp`), and a rollout's KV pool, packed decode weights and the
// weight version it receives.
std::vector<train::memory_term> untrained_terms(const job_config& cfg,
                                                const models::llama_config& m, const role_traits& t,
                                                int64_t tp,
                                                std::optional<runtime::transport_kind> transport) {
  const auto& role = t.name;
  const auto split = split_parameters(m, t.head == models::head_kind::lm, tp);
  const double w = train::bytes_per_element(placement_keys(cfg, role).compute);
  std::vector<train::memory_term> out{{"weights", w * static_cast<double>(split.total())}};
  if (t.id == role_id::rollout) { // the engine's own rule (NOTE [kv pool size])
    auto e = engine_settings(cfg);
    auto part = models::partition_llama(m, 0, static_cast<int>(tp));
    const auto pool = part ? inference::kv_pool_shape(m, *part) : m;
    auto blocks = inference::kv_pool_blocks(e, pool, 4);
    out.push_back(
        {"KV pool", blocks ? static_cast<double>(*blocks * inference::kv_block_bytes(e, pool, 4))
                           : e.kv_cache_mb * 1024.0 * 1024.0});
    if (inference::packs_decode_panels(e)) // NOTE [decode panels]; a rank packs its part
      out.push_back({"packed decode weights",
                     static_cast<double>(models::decode_panels_bytes(m, e.decode_isa) / tp)});
    // A weight version arrives whole (as the policy exports it) and stays
    // mapped or read while the engine copies its part in; alias hands over
    // the publisher's own tensors (NOTE [rollout group], NOTE [sync staging]).
    if (transport && runtime::traits_of(*transport).receiver_stages)
      out.push_back({"received weights (while loading)",
                     train::bytes_per_element(placement_keys(cfg, "policy").compute) *
                         static_cast<double>(split_parameters(m, true).total())});
  }
  return out;
}

// Estimated bytes of one rank of `role` in `stage`, by term (NOTE [memory
// estimate]), largest first.
// NOTE [memory estimate]: weights cost 4 bytes a parameter (2 at
// precision bf16); a role
// that trains in the stage holds NOTE [rank memory]'s terms instead (its
// states under its strategy, one micro-batch's activations, the strategy's
// transients); lm-headed roles count the vocabulary head; the rollout adds
// its KV pool and its packed decode weights; a rule-only reward holds no
// model. A tensor-parallel rank counts its part of the split widths and
// its share of its group's shared segment. Read off the role-traits table.
std::vector<train::memory_term> role_terms(const job_config& cfg, const models::llama_config& m,
                                           const std::string& stage, const std::string& role,
                                           int64_t rank,
                                           std::optional<runtime::transport_kind> transport) {
  const auto* t = find_role(role);
  const auto* st = find_stage(stage);
  if (!t || !st)
    return {};
  // A rule-only judge holds no model.
  if (t->actor_in(st->id) == role_actor::judge && !uses_reward_model(cfg.rl.reward))
    return {};
  const bool trains = t->trains_in(st->id);
  // A tensor-parallel rank holds its part (a rollout's: NOTE [rollout group]).
  const auto tp = trains || t->id == role_id::rollout
                      ? std::max<int64_t>(placement_keys(cfg, role).tp, 1)
                      : int64_t{1};
  auto out = trains ? training_memory(cfg, m, *st, *t, rank).terms()
                    : untrained_terms(cfg, m, *t, tp, transport);
  // NOTE [peer state]: a restartable trainer's copy of the state its
  // updates begin from (its weights and AdamW moments, as saved).
  if (trains && detail::keeps_state_before_updates(cfg, stage, t->id)) {
    const auto kept = training_memory(cfg, m, *st, *t, rank);
    out.push_back({"state kept before each update (supervision)", kept.weights + kept.optimizer});
  }
  // Its TP group's sums and its pipeline line's hand-offs go through
  // shared segments that each of their ranks maps (NOTE [shm all-reduce],
  // NOTE [shm point-to-point]; a line across nodes uses none): a rank
  // counts its share.
  if (tp > 1)
    out.push_back({"TP shared-memory sums (its share)",
                   static_cast<double>(
                       runtime::shm_collectives_bytes(static_cast<int>(tp), tp_slot_bytes) / tp)});
  if (const auto pp = std::max<int64_t>(placement_keys(cfg, role).pp, 1); trains && pp > 1)
    out.push_back(
        {"PP shared-memory hand-offs (its share)",
         static_cast<double>(runtime::shm_point_to_point_bytes(static_cast<int>(pp), pp_slot_bytes,
                                                               pp_slots(static_cast<int>(pp))) /
                             pp)});
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  return out;
}

std::string gib(double bytes) {
  char b[32];
  if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(b, sizeof b, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  else
    std::snprintf(b, sizeof b, "%.1f MiB", bytes / (1024.0 * 1024));
  return b;
}

// The estimates of the ranks `device` holds in `stage` (-1: every rank, the
// driver's process).
std::vector<rank_estimate> ranks_in_stage(const job_config& cfg, const models::llama_config& m,
                                          const placement_plan& plan, const std::string& stage,
                                          const std::vector<std::string>& roles, int64_t device) {
  std::vector<rank_estimate> out;
  for (const auto& role : roles) {
    const auto* a = plan.find(role);
    const auto layout = plan.layout_of(stage, role);
    for (int64_t r = 0; r < layout.ranks(); ++r) {
      if (device >= 0 && (!a || a->devices[static_cast<size_t>(r)] != device))
        continue;
      rank_estimate e;
      e.rank = rank_name(role, layout, r);
      e.terms = role_terms(cfg, m, stage, role, r, plan.weight_transport);
      for (const auto& t : e.terms)
        e.bytes += t.bytes;
      out.push_back(std::move(e));
    }
  }
  return out;
}

double sum_of(const std::vector<rank_estimate>& ranks) {
  double total = 0;
  for (const auto& r : ranks)
    total += r.bytes;
  return total;
}

// "policy[dp 0]'s activations (3.10 GiB)", and what lowers that term.
std::string largest_term(const std::vector<rank_estimate>& ranks) {
  const rank_estimate* who = nullptr;
  const train::memory_term* big = nullptr;
  for (const auto& r : ranks)
    for (const auto& t : r.terms)
      if (!big || t.bytes > big->bytes) {
        big = &t;
        who = &r;
      }
  if (!big)
    return {};
  std::string hint = big->name == "activations" ? "lower its placement.roles[].micro_batch_rows"
                     : big->name == "KV pool"   ? "lower rl.rollout.kv_cache_mb"
                     : big->name == "weights"
                         ? "use a smaller model or a zero3 strategy"
                         : "shard it with a zero strategy (troupe plan --suggest)";
  return "; the largest term is " + who->rank + "'s " + std::string{big->name} + " (" +
         gib(big->bytes) + "): " + hint;
}

// "    policy[dp 0]: weights 1.0 MiB, gradients ..." lines.
std::string render_ranks(const std::vector<rank_estimate>& ranks, const std::string& indent) {
  std::string out;
  for (const auto& r : ranks) {
    out += indent + r.rank + ": " + gib(r.bytes);
    std::string parts;
    for (const auto& t : r.terms)
      parts += (parts.empty() ? "" : ", ") + std::string{t.name} + " " + gib(t.bytes);
    out += parts.empty() ? "\n" : " = " + parts + "\n";
  }
  return out;
}

double host_memory_bytes() {
  auto pages = ::sysconf(_SC_PHYS_PAGES);
  auto size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<double>(pages) * static_cast<double>(size) : 0;
}

// Roles of each stage of the job (the stage table's casts).
std::vector<std::pair<std::string, std::vector<std::string>>> job_stage_roles(const job_config& c) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const auto& s : c.stages) {
    std::vector<std::string> roles;
    if (const auto* st = find_stage(s))
      for (auto r : st->cast(c))
        roles.emplace_back(to_string(r));
    out.emplace_back(s, std::move(roles));
  }
  return out;
}

// NOTE [weight transport choice]: the pair's transport, or why the forced
// one cannot work.
expected<runtime::transport_kind> choose_transport(const job_config& cfg, const placement_plan& plan) {
  using runtime::transport_kind;
  using reach = runtime::transport_traits::reach;
  const auto& w = cfg.weight_sync;
  auto from = plan.device_of("policy", 0), to = plan.device_of("rollout", 0);
  auto node_of = [&](int64_t d) { return d < 0 ? int64_t{0} : plan.devices[static_cast<size_t>(d)].node; };
  bool one_process = from == to; // both -1 in process
  bool one_node = node_of(from) == node_of(to);
  // A tensor-parallel rollout's ranks each receive the weights (NOTE
  // [rollout group]): every rank must be in reach, and a kind that reaches
  // one receiver does not serve them.
  const auto* rollout = plan.find("rollout");
  const bool many = rollout && rollout->layout.ranks() > 1; // and a fleet's (NOTE [rollout fleet])
  for (int64_t r = 1; many && r < rollout->layout.ranks(); ++r) {
    one_process = one_process && plan.device_of("rollout", r) == from;
    one_node = one_node && node_of(plan.device_of("rollout", r)) == node_of(from);
  }
  if (!w.transport && many && !one_node && w.dir.empty())
    return make_error(
        errc::invalid_config,
        "weight_sync.dir: the rollout (" + std::to_string(rollout->layout.ranks()) +
            " ranks) is on another node than the policy, and its ranks each receive the "
            "weights: set weight_sync.dir to a directory both see (the broadcast "
            "reaches one receiver)");
  if (!w.transport)
    return one_process ? transport_kind::alias
           : one_node  ? transport_kind::shm
           : w.dir.empty() ? transport_kind::broadcast
                           : transport_kind::disk;
  auto kind = *w.transport;
  auto traits = runtime::traits_of(kind);
  auto name = std::string{to_string(kind)};
  auto where = [&](int64_t d) {
    return d < 0 ? std::string{"the driver's process"}
                 : "device " + std::to_string(d) + " on node " + std::to_string(node_of(d));
  };
  auto refuse = [&](const std::string& why) -> expected<transport_kind> {
    return make_error(errc::invalid_config,
                      "weight_sync.transport " + name + ": the policy (" + where(from) +
                          ") and the rollout (" + where(to) + ") " + why);
  };
  if (!runtime::available(kind))
    return make_error(errc::invalid_config, "weight_sync.transport " + name +
                                              ": this build has no CUDA (use auto, alias, shm, "
                                              "broadcast or disk)");
  if (traits.needs_cuda) // every role holds its weights on the CPU (no role is placed on a GPU)
    return make_error(errc::invalid_config,
                      "weight_sync.transport " + name +
                        ": the policy's weights are CPU tensors, and cuda_ipc carries CUDA "
                        "tensors (use auto, or shm on one host)");
  if (traits.one_receiver && many)
    return make_error(errc::invalid_config,
                      "weight_sync.transport " + name + ": the rollout (" +
                          std::to_string(rollout->layout.ranks()) +
                          " ranks) has several ranks that each receive the weights, and " + name +
                          " reaches one receiver (use auto, alias, shm or disk)");
  if (traits.span == reach::process && !one_process)
    return refuse("are in different processes, and " + name +
                  " hands tensors over inside one (use auto, shm, broadcast or disk)");
  if (traits.span == reach::host && !one_node)
    return refuse("are on different nodes, and " +
                  std::string{kind == transport_kind::shm ? "shared memory" : "a CUDA IPC handle"} +
                  " stays on one (use auto, broadcast or disk with weight_sync.dir)");
  if (traits.needs_dir && !one_node && w.dir.empty())
    return refuse("are on different nodes: set weight_sync.dir to a directory both see (a shared "
                  "filesystem), or use broadcast");
  return kind;
}

// A TP group's ranks exchange activations every layer: they stay on one
// node (NOTE [tensor parallelism]).
expected<void> check_tp_nodes(const placement_plan& plan) {
  for (size_t i = 0; i < plan.roles.size(); ++i) {
    const auto& a = plan.roles[i];
    const auto tp = static_cast<size_t>(a.layout.tp);
    for (size_t g = 0; tp > 1 && (g + 1) * tp <= a.devices.size(); ++g) {
      const auto first = plan.devices[static_cast<size_t>(a.devices[g * tp])].node;
      const auto last = plan.devices[static_cast<size_t>(a.devices[(g + 1) * tp - 1])].node;
      if (first != last)
        return make_error(errc::invalid_config,
                          "placement: " + a.role + "'s tensor-parallel group " + std::to_string(g) +
                              " (tp " + std::to_string(tp) + ") spans nodes " +
                              std::to_string(first) + " and " + std::to_string(last) +
                              "; a TP group stays on one node (make tp divide the devices per "
                              "node, or order the pools)");
    }
  }
  return {};
}

// Fills in the node of each device (NOTE [nodes of a plan]).
void assign_nodes(const job_config& cfg, placement_plan& plan) {
  auto total = static_cast<int64_t>(plan.devices.size());
  plan.nodes = std::max<int64_t>(cfg.resources.nodes, 1);
  auto per = cfg.resources.devices_per_node > 0 ? cfg.resources.devices_per_node
                                                : (total + plan.nodes - 1) / plan.nodes;
  for (auto& d : plan.devices)
    d.node = std::min(d.index / std::max<int64_t>(per, 1), plan.nodes - 1);
}

} // namespace

namespace {

// NOTE [mixed precision]: bf16 is for the roles a train engine runs — the
// policy, the critic, the reference and a reward model; the rollout engine
// decodes in fp32, and a rule reward has no model.
void check_precision(const job_config& c, const role_placement_config& r, const std::string& at,
                     runtime::config_checks& checks) {
  const auto* t = find_role(r.role);
  if (r.compute != precision::bf16 || !t)
    return;
  checks.require(t->id != role_id::rollout, at + ".precision",
                 "the rollout engine decodes in fp32; bf16 is for the roles a train engine runs "
                 "(" +
                     role_names([](const role_traits& x) { return x.id != role_id::rollout; }) +
                     ")");
  checks.require(t->id != role_id::reward || uses_reward_model(c.rl.reward) || has_stage(c, "rm"),
                 at + ".precision",
                 "the reward is a rule (rl.reward.kind: rule): it has no model "
                 "to compute in bf16");
}

// NOTE [tensor parallelism] (models/tensor_parallel.hpp): for the roles a
// train engine trains (the frozen ones run one rank), with the attention
// heads and the intermediate size divisible by tp. A TP group stays on
// one node (make_plan checks the nodes).
void check_tensor_parallel(const job_config& c, const role_placement_config& r,
                           const std::string& at, runtime::config_checks& checks) {
  const auto* t = find_role(r.role);
  if (r.tp <= 1 || !t)
    return;
  const bool rollout = t->id == role_id::rollout; // NOTE [rollout group]
  const bool trained = t->trains() && !rollout;
  checks.require(trained || rollout, at + ".tp",
                 "tensor parallelism is for trained roles (" +
                     role_names([](const role_traits& x) { return x.trains(); }) +
                     ") and the rollout; " + r.role + "'s is not available yet");
  if (!trained && !rollout)
    return;
  if (rollout && r.pp > 1) // check_pipeline_parallel says why
    return;
  auto shape = model_shape(c);
  if (!shape) // the model's own check names what is wrong with it
    return;
  auto part = models::partition_llama(*shape, 0, static_cast<int>(r.tp));
  checks.require(part.engaged(), at + ".tp", part ? "" : context_of(part.error()));
}

// NOTE [pipeline parallelism] (models/pipeline_parallel.hpp): for trained
// roles, at most a stage a layer, the listed split adding up, at least as
// many micro-batches as stages (fewer leave a stage idle the whole step),
// and a tied embedding's two copies under ddp or zero1 (NOTE [tied
// embedding under PP] in actors/train/train_engine.cpp).
void check_pipeline_parallel(const job_config& c, const role_placement_config& r,
                             const std::string& at, runtime::config_checks& checks) {
  const auto* t = find_role(r.role);
  checks.require(r.pp_micro_batches >= 0, at + ".pp_micro_batches", "must be >= 0 (0 = pp)");
  checks.require(r.pp_layers.empty() || r.pp > 1, at + ".pp_layers",
                 "lists the layers of each pipeline stage: give pp > 1");
  if (r.pp <= 1 || !t)
    return;
  const bool trained = t->trains() && t->id != role_id::rollout;
  checks.require(
      trained, at + ".pp",
      "pipeline parallelism is for trained roles (" +
          role_names([](const role_traits& x) { return x.trains() && x.id != role_id::rollout; }) +
          "); " + r.role + "'s is not available yet");
  checks.require(r.pp_micro_batches == 0 || r.pp_micro_batches >= r.pp, at + ".pp_micro_batches",
                 std::to_string(r.pp_micro_batches) + " micro-batches are fewer than the " +
                     std::to_string(r.pp) + " stages");
  auto shape = model_shape(c);
  if (!trained || !shape || r.pp < 1)
    return;
  auto stage = models::stage_of(*shape, 0, static_cast<int>(r.pp), r.pp_layers);
  checks.require(stage.engaged(), at + (r.pp_layers.empty() ? ".pp" : ".pp_layers"),
                 stage ? "" : context_of(stage.error()));
  const bool sums_in_backward =
      r.strategy == dp_strategy::zero2 || r.strategy == dp_strategy::zero3;
  checks.require(
      !(shape->tie_word_embeddings && t->head == models::head_kind::lm && sums_in_backward),
      at + ".strategy",
      std::string{"a tied embedding under pipeline parallelism takes ddp or zero1 ("} +
          std::string{to_string(r.strategy)} +
          " reduces the gradients during backward, before the first and the last "
          "stage can add their copies' gradients)");
}

// One role's layout (NOTE [parallel layout]): sizes, what is available
// yet, the pool's devices and the rows its DP ranks split.
void check_role_layout(const job_config& c, const role_placement_config& r, const std::string& at,
                       const std::map<std::string, int64_t>& pool_devices, runtime::config_checks& checks) {
  const auto* t = find_role(r.role);
  checks.require(r.dp >= 1, at + ".dp", "must be >= 1");
  checks.require(r.tp >= 1, at + ".tp", "must be >= 1");
  checks.require(r.pp >= 1, at + ".pp", "must be >= 1");
  checks.require(r.bucket_mb > 0, at + ".bucket_mb", "must be > 0");
  checks.require(r.micro_batch_rows >= 0, at + ".micro_batch_rows", "must be >= 0 (0 = a rank's whole share)");
  checks.require(r.micro_batch_tokens >= 0, at + ".micro_batch_tokens", "must be >= 0 (0 = off)");
  checks.require(r.micro_batch_tokens == 0 || r.micro_batch_rows == 0, at + ".micro_batch_tokens",
                 "give micro_batch_rows or micro_batch_tokens, not both");
  check_tensor_parallel(c, r, at, checks);
  check_pipeline_parallel(c, r, at, checks);
  if (r.strategy != dp_strategy::ddp && t)
    checks.require(t->trains(), at + ".strategy",
                   std::string{to_string(r.strategy)} + " shards training state, and " + r.role +
                       " is not trained");
  check_precision(c, r, at, checks);
  if (r.dp > 1 && t && t->id != role_id::rollout) // a rollout's: NOTE [rollout fleet]
    checks.require(t && t->trains(), at + ".dp",
                   "data parallelism is for trained roles (policy, critic, reward); " + r.role +
                     " has one rank");
  auto ranks = r.dp * r.tp * r.pp;
  if (pool_devices.count(r.pool) && r.dp >= 1 && ranks >= 1) {
    auto n = pool_devices.at(r.pool);
    checks.require(ranks <= n && n % ranks == 0, at + ".dp",
                   "dp " + std::to_string(r.dp) + " must divide the " + std::to_string(n) +
                     " devices of pool '" + r.pool + "'");
  }
  if (r.dp > 1 && t)
    for (const auto& [what, rows] : split_rows(c, *t))
      checks.require(rows % r.dp == 0, at + ".dp",
                     "dp " + std::to_string(r.dp) + " must divide the " + what + " (" + std::to_string(rows) + ")");
  // NOTE [micro-batches]: a rank's share is computed micro_batch_rows at a
  // time; a share that is not a multiple would end on a shorter micro-batch
  // (exact, but not what the key promises to bound), so it is refused.
  if (r.micro_batch_rows > 0 && r.dp >= 1 && t)
    for (const auto& [what, rows] : split_rows(c, *t)) {
      const auto share = rows / r.dp;
      checks.require(
          share <= r.micro_batch_rows || share % r.micro_batch_rows == 0, at + ".micro_batch_rows",
          std::to_string(r.micro_batch_rows) + " does not divide a rank's share of the " + what +
              " (" + std::to_string(share) + " rows)");
    }
}

} // namespace

void check_placement(const job_config& c, runtime::config_checks& checks) {
  const auto& p = c.placement;
  const auto& res = c.resources;
  checks.require(res.nodes >= 1, "resources.nodes", "must be >= 1");
  checks.require(res.nodes == 1 || p.mode != placement_mode::in_process, "resources.nodes",
                 "in_process runs every role in the driver's process, on one node; give a mode "
                 "(colocated, disaggregated, hybrid) and pools to use " + std::to_string(res.nodes));
  checks.require(res.launcher != launcher_kind::nodes || p.mode != placement_mode::in_process,
                 "resources.launcher",
                 "nodes start worker processes, and in_process runs none; give a mode and pools");
  checks.require(res.devices_per_node >= 0, "resources.devices_per_node", "must be >= 0");
  checks.require(res.device_memory_gb >= 0, "resources.device_memory_gb", "must be >= 0 (0 = host memory / devices)");
  if (p.mode == placement_mode::in_process) {
    checks.require(p.pools.empty(), "placement.pools", "in_process runs no workers: give a mode "
                                                       "(colocated, disaggregated, hybrid) to use pools");
    checks.require(p.roles.empty(), "placement.roles", "in_process runs no workers: give a mode "
                                                       "(colocated, disaggregated, hybrid) to place roles");
    return;
  }
  auto pools = pools_of(p);
  checks.require(!pools.empty(), "placement.pools",
                 "mode " + std::string{to_string(p.mode)} + " needs at least one pool");
  std::map<std::string, int64_t> pool_devices;
  int64_t total = 0;
  for (size_t i = 0; i < p.pools.size(); ++i) {
    auto at = "placement.pools[" + std::to_string(i) + "]";
    const auto& pool = p.pools[i];
    checks.require(!pool.name.empty(), at + ".name", "must not be empty");
    checks.require(!pool_devices.count(pool.name), at + ".name", "pool '" + pool.name + "' is given twice");
    checks.require(pool.devices >= 1, at + ".devices", "must be >= 1");
  }
  for (const auto& pool : pools) {
    pool_devices[pool.name] = pool.devices;
    total += std::max<int64_t>(pool.devices, 0);
  }
  if (p.mode == placement_mode::colocated)
    checks.require(pools.size() == 1, "placement.pools",
                   "colocated places every role in one pool, got " + std::to_string(pools.size()));
  checks.require(res.devices_per_node == 0 || total <= res.nodes * res.devices_per_node,
                 "placement.pools",
                 "the pools need " + std::to_string(total) + " devices, resources give " +
                     std::to_string(res.nodes * res.devices_per_node));
  if (res.nodes >= 1 && total >= 1) {
    auto per = res.devices_per_node > 0 ? res.devices_per_node : (total + res.nodes - 1) / res.nodes;
    checks.require((total + per - 1) / per >= res.nodes, "resources.nodes",
                   std::to_string(res.nodes) + " nodes, but the pools' " + std::to_string(total) +
                       " devices at " + std::to_string(per) + " per node fill only " +
                       std::to_string((total + per - 1) / per) + " (NOTE [nodes of a plan])");
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < p.roles.size(); ++i) {
    auto at = "placement.roles[" + std::to_string(i) + "]";
    const auto& r = p.roles[i];
    checks.require(known_role(r.role), at + ".role",
                   "expected one of policy, critic, reference, reward, rollout, got '" + r.role + "'");
    checks.require(seen.insert(r.role).second, at + ".role", "role '" + r.role + "' is placed twice");
    checks.require(pool_devices.count(r.pool) != 0, at + ".pool", "no pool named '" + r.pool + "'");
    check_role_layout(c, r, at, pool_devices, checks);
  }
  if (p.mode == placement_mode::disaggregated) {
    auto gen = placement_of(p, "rollout").pool;
    for (const char* t : {"policy", "critic"})
      checks.require(placement_of(p, t).pool != gen, "placement.roles",
                     std::string{"disaggregated: "} + t + " and rollout share pool '" + gen +
                         "' (use hybrid for any mapping)");
  }
}

const role_assignment* placement_plan::find(const std::string& role) const {
  for (const auto& r : roles)
    if (r.role == role)
      return &r;
  return nullptr;
}

parallel_layout placement_plan::layout_of(const std::string& stage, const std::string& role) const {
  auto* r = find(role);
  const auto* t = find_role(role);
  const auto* st = find_stage(stage);
  if (!r || !t || !st)
    return {};
  // Frozen roles have one rank; the rollout its TP ranks (NOTE [rollout
  // group]) times its replicas (NOTE [rollout fleet]).
  return t->trains_in(st->id) || t->actor_in(st->id) == role_actor::rollout ? r->layout
                                                                            : parallel_layout{};
}

std::vector<std::string> placement_plan::worker_labels() const {
  std::vector<std::string> out;
  for (const auto& d : devices) {
    std::string roles_here;
    for (const auto& r : roles)
      if (std::find(r.devices.begin(), r.devices.end(), d.index) != r.devices.end())
        roles_here += (roles_here.empty() ? "" : "+") + r.role;
    out.push_back(d.pool + ":" + (roles_here.empty() ? "idle" : roles_here));
  }
  return out;
}

std::vector<int64_t> placement_plan::devices_per_node() const {
  std::vector<int64_t> out(static_cast<size_t>(std::max<int64_t>(nodes, 1)), 0);
  for (const auto& d : devices)
    if (d.node >= 0 && static_cast<size_t>(d.node) < out.size())
      ++out[static_cast<size_t>(d.node)];
  return out;
}

int64_t placement_plan::device_of(const std::string& role, int64_t rank) const {
  const auto* a = find(role);
  if (!a || rank < 0 || static_cast<size_t>(rank) >= a->devices.size())
    return -1;
  return a->devices[static_cast<size_t>(rank)];
}

namespace {

// "dp 1.2 MB, tp 3.4 MB" (the dimensions that move anything).
std::string comm_text(const comm_volume& c) {
  std::string out;
  for (auto [name, bytes] : {std::pair{"dp", c.dp}, {"tp", c.tp}, {"pp", c.pp}}) {
    if (bytes <= 0)
      continue;
    char mb[48];
    std::snprintf(mb, sizeof mb, "%s %.2f MB", name, bytes / 1e6);
    out += (out.empty() ? "" : ", ") + std::string{mb};
  }
  return out.empty() ? "nothing" : out;
}

// What a rank of a trained role receives a step (NOTE [communication volume]).
std::string render_comm(const comm_volume& c) {
  if (c.total() <= 0)
    return {};
  return "    a rank receives a step: " + comm_text(c) + " (NOTE [communication volume])\n";
}

// A pipelined role's stages and its 1F1B grid (NOTE [1F1B]).
std::string render_pipeline(const role_assignment& r) {
  if (r.layout.pp <= 1 || r.stage_layers.empty())
    return {};
  std::string layers;
  for (auto n : r.stage_layers)
    layers += (layers.empty() ? "" : " + ") + std::to_string(n);
  std::string out = "    stages: layers " + layers + "; " + std::to_string(r.micro_batches) +
                    " micro-batches, 1F1B:\n";
  auto grid = runtime::one_f_one_b(r.layout.pp, static_cast<int>(r.micro_batches));
  if (!grid)
    return out;
  std::istringstream lines(runtime::render_grid(*grid));
  for (std::string line; std::getline(lines, line);)
    out += "      " + line + "\n";
  return out;
}

} // namespace

std::string placement_plan::render() const {
  std::string out = "placement: " + std::string{to_string(mode)} + "\n";
  for (const auto& w : warnings)
    out += "warning: " + w + "\n";
  auto transport = weight_transport ? std::string{to_string(*weight_transport)} : std::string{};
  out += "model: " + std::to_string(parameters) + " parameters (policy)\n";
  for (const auto& d : data)
    out += d + "\n";
  if (!uses_workers()) {
    out += "every role runs in the driver's process; estimated peak " + gib(driver_peak_bytes) +
           (driver_peak_stage.empty() ? "" : " in " + driver_peak_stage) +
           " (NOTE [memory estimate])\n" + render_ranks(driver_peak_ranks, "  ");
    if (weight_transport)
      out += "weights: policy → rollout by " + transport + "\n";
    return out;
  }
  out += "devices: " + std::to_string(devices.size()) + " worker processes on " +
         std::to_string(nodes) + (nodes == 1 ? " node, " : " nodes, ") + gib(device_memory_bytes) +
         " each\n";
  for (int64_t n = 0; n < nodes; ++n) {
    out += "  node " + std::to_string(n) + ":\n";
    for (const auto& d : devices) {
      if (d.node != n)
        continue;
      std::string ranks;
      for (const auto& r : d.ranks)
        ranks += (ranks.empty() ? "" : ", ") + r;
      out += "    device " + std::to_string(d.index) + " (pool " + d.pool +
             "): " + (ranks.empty() ? "idle" : ranks) + "; peak " + gib(d.peak_bytes) +
             (d.peak_stage.empty() ? "" : " in " + d.peak_stage) + "\n" +
             render_ranks(d.peak_ranks, "      ");
    }
  }
  out += "roles:\n";
  for (const auto& r : roles) {
    std::string devs;
    for (auto d : r.devices)
      devs += (devs.empty() ? "" : ", ") + std::to_string(d);
    std::string how; // what is not the default
    if (r.strategy != train::dp_strategy::ddp)
      how += ", " + std::string{to_string(r.strategy)};
    if (r.compute != train::precision::fp32)
      how += ", " + std::string{to_string(r.compute)};
    const auto tp = r.layout.tp > 1 ? ", tp " + std::to_string(r.layout.tp) : std::string{};
    const auto pp = r.layout.pp > 1 ? ", pp " + std::to_string(r.layout.pp) : std::string{};
    out += "  " + r.role + ": pool " + r.pool + ", dp " + std::to_string(r.layout.dp) + tp + pp +
           how + ", devices [" + devs + "]\n" + render_pipeline(r) + render_comm(r.comm);
  }
  if (weight_transport)
    out += "weights: policy → rollout by " + transport + "\n";
  return out;
}

namespace {

expected<placement_plan> with_transport(const job_config& cfg, placement_plan plan) {
  if (!has_stage(cfg, "rl"))
    return plan;
  auto t = choose_transport(cfg, plan);
  if (!t)
    return with_prefix(t.error(), "placement");
  plan.weight_transport = *t;
  return plan;
}

} // namespace

expected<placement_plan> make_plan(const job_config& cfg) {
  placement_plan plan;
  const auto& p = cfg.placement;
  plan.mode = p.mode;
  auto shape = model_shape(cfg);
  if (!shape)
    return with_prefix(shape.error(), "planning the placement");
  plan.parameters = parameters(*shape, true);
  auto data = check_data_files(cfg.data); // every row, before anything starts
  if (!data)
    return data.error();
  plan.data = std::move(*data);
  for (size_t i = 0; i < p.roles.size(); ++i)
    if (const auto& r = p.roles[i]; r.strategy != dp_strategy::ddp && r.dp <= 1)
      plan.warnings.push_back("placement.roles[" + std::to_string(i) + "].strategy: " +
                              std::string{to_string(r.strategy)} + " with dp 1 has nothing to "
                              "shard: " + r.role + " trains as ddp does");
  auto stages = job_stage_roles(cfg);
  std::set<std::string> used;
  for (const auto& [stage, roles] : stages)
    used.insert(roles.begin(), roles.end());

  if (p.mode == placement_mode::in_process) {
    for (const auto& r : used)
      plan.roles.push_back({r, "", parallel_layout{}, {}});
    for (const auto& [stage, roles] : stages) {
      auto ranks = ranks_in_stage(cfg, *shape, plan, stage, roles, -1);
      if (const double total = sum_of(ranks); total > plan.driver_peak_bytes) {
        plan.driver_peak_bytes = total;
        plan.driver_peak_stage = stage;
        plan.driver_peak_ranks = std::move(ranks);
      }
    }
    // Refused before anything is spawned, not in the allocator mid-run.
    plan.device_memory_bytes = cfg.resources.device_memory_gb > 0
                                 ? cfg.resources.device_memory_gb * 1024.0 * 1024 * 1024
                                 : host_memory_bytes();
    if (plan.device_memory_bytes > 0 && plan.driver_peak_bytes > plan.device_memory_bytes)
      return make_error(errc::invalid_config,
                        "placement: the driver's process needs an estimated " +
                            gib(plan.driver_peak_bytes) + ", more than this machine's " +
                            gib(plan.device_memory_bytes) +
                            " (resources.device_memory_gb) in stage " + plan.driver_peak_stage +
                            largest_term(plan.driver_peak_ranks) +
                            "; or spread the roles over devices (placement.mode)");
    return with_transport(cfg, std::move(plan));
  }

  // Devices: pools laid out in order.
  std::map<std::string, int64_t> first;
  for (const auto& pool : pools_of(p)) {
    first[pool.name] = static_cast<int64_t>(plan.devices.size());
    for (int64_t i = 0; i < pool.devices; ++i) {
      device_plan d;
      d.index = static_cast<int64_t>(plan.devices.size());
      d.pool = pool.name;
      plan.devices.push_back(d);
    }
  }
  for (const auto& t : all_roles()) {
    std::string role{t.name};
    if (!used.count(role))
      continue;
    auto rp = placement_of(p, role);
    parallel_layout layout{static_cast<int32_t>(rp.dp), static_cast<int32_t>(rp.tp), static_cast<int32_t>(rp.pp)};
    role_assignment a{role, rp.pool, layout, {}, rp.strategy, rp.compute, {}, 0};
    if (layout.pp > 1) {
      auto counts = models::split_layers(shape->num_hidden_layers, layout.pp, rp.pp_layers);
      if (!counts)
        return with_prefix(counts.error(), "placement: " + role);
      a.stage_layers = *counts;
      a.micro_batches = rp.pp_micro_batches > 0 ? rp.pp_micro_batches : layout.pp;
    }
    if (t.trains())
      a.comm = communication(cfg, *shape, t);
    for (int64_t r = 0; r < layout.ranks(); ++r)
      a.devices.push_back(first.at(rp.pool) + r);
    plan.roles.push_back(a);
  }
  assign_nodes(cfg, plan);
  if (auto ok = check_tp_nodes(plan); !ok)
    return ok.error();
  // Before the estimates: the rollout's receive buffer depends on it.
  auto with = with_transport(cfg, std::move(plan));
  if (!with)
    return with.error();
  plan = std::move(*with);
  for (auto& d : plan.devices) {
    for (const auto& a : plan.roles)
      for (size_t r = 0; r < a.devices.size(); ++r)
        if (a.devices[r] == d.index)
          d.ranks.push_back(rank_name(a.role, a.layout, static_cast<int64_t>(r)));
    for (const auto& [stage, roles] : stages) {
      auto ranks = ranks_in_stage(cfg, *shape, plan, stage, roles, d.index);
      if (const double total = sum_of(ranks); total > d.peak_bytes) {
        d.peak_bytes = total;
        d.peak_stage = stage;
        d.peak_ranks = std::move(ranks);
      }
    }
  }
  plan.device_memory_bytes = cfg.resources.device_memory_gb > 0
                                 ? cfg.resources.device_memory_gb * 1024.0 * 1024 * 1024
                                 : host_memory_bytes() / static_cast<double>(plan.devices.size());
  for (const auto& d : plan.devices)
    if (plan.device_memory_bytes > 0 && d.peak_bytes > plan.device_memory_bytes) {
      std::string ranks;
      for (const auto& r : d.ranks)
        ranks += (ranks.empty() ? "" : ", ") + r;
      return make_error(errc::invalid_config,
                        "placement: device " + std::to_string(d.index) + " (pool " + d.pool + ": " +
                            ranks + ") needs an estimated " + gib(d.peak_bytes) + " in stage " +
                            d.peak_stage + ", more than its " + gib(plan.device_memory_bytes) +
                            " (resources.device_memory_gb)" + largest_term(d.peak_ranks) +
                            "; or spread the roles over more devices");
    }
  return plan;
}

namespace {

// The estimate of `role`'s rank 0 on its device at the device's peak.
double rank0_bytes(const placement_plan& plan, const std::string& role) {
  const auto d = plan.device_of(role, 0);
  if (d < 0)
    return 0;
  const std::string rank0 = rank_name(role, plan.find(role)->layout, 0);
  for (const auto& r : plan.devices[static_cast<size_t>(d)].peak_ranks)
    if (r.rank == rank0)
      return r.bytes;
  return 0;
}

} // namespace

role_placement_config placement_keys(const job_config& cfg, std::string_view role) {
  role_placement_config placed;
  for (const auto& rp : cfg.placement.roles)
    if (rp.role == role)
      placed = rp;
  return placed;
}

// NOTE [strategy suggestions].
std::vector<strategy_fit> suggest_strategies(const job_config& cfg) {
  std::vector<strategy_fit> out;
  auto shape = model_shape(cfg);
  for (size_t i = 0; i < cfg.placement.roles.size(); ++i) {
    const auto& rp = cfg.placement.roles[i];
    const auto* t = find_role(rp.role);
    if (!t || !t->trains() || !shape || rp.dp <= 1) // nothing to shard at dp 1
      continue;
    const double phi =
        4.0 *
        static_cast<double>(split_parameters(*shape, t->head == models::head_kind::lm).total());
    const double ring =
        rp.dp > 1 ? static_cast<double>(rp.dp - 1) / static_cast<double>(rp.dp) * phi : 0;
    std::vector<strategy_fit> mine;
    for (auto s : {dp_strategy::ddp, dp_strategy::zero1, dp_strategy::zero2, dp_strategy::zero3}) {
      auto changed = cfg;
      changed.placement.roles[i].strategy = s;
      strategy_fit f{rp.role, "placement.roles[" + std::to_string(i) + "].strategy", s};
      f.received_bytes = (s == dp_strategy::zero3 ? 3 : 2) * ring;
      if (auto plan = make_plan(changed)) {
        f.fits = true;
        f.rank_bytes = rank0_bytes(*plan, rp.role);
      } else
        f.refusal = describe(plan.error());
      mine.push_back(std::move(f));
    }
    std::stable_sort(mine.begin(), mine.end(), [](const strategy_fit& a, const strategy_fit& b) {
      if (a.fits != b.fits)
        return a.fits;
      if (a.received_bytes != b.received_bytes)
        return a.received_bytes < b.received_bytes;
      return a.rank_bytes < b.rank_bytes;
    });
    out.insert(out.end(), mine.begin(), mine.end());
  }
  return out;
}

namespace {

// The layout `l` of placement.roles[i] judged (NOTE [layout suggestions]).
layout_fit judge_layout(const job_config& cfg, size_t i, const parallel_layout& l) {
  auto changed = cfg;
  auto& r = changed.placement.roles[i];
  layout_fit f{r.role, "placement.roles[" + std::to_string(i) + "]", l};
  r.dp = l.dp;
  r.tp = l.tp;
  r.pp = l.pp;
  if (static_cast<int64_t>(r.pp_layers.size()) != r.pp)
    r.pp_layers.clear();
  if (r.pp_micro_batches > 0 && r.pp_micro_batches < r.pp)
    r.pp_micro_batches = 0;
  runtime::config_errors errors;
  runtime::location_map locations;
  runtime::config_checks checks{errors, locations, "suggestion"};
  check_placement(changed, checks);
  if (!errors.empty()) {
    f.refusal = errors.lines().front();
    return f;
  }
  auto plan = make_plan(changed);
  if (!plan) {
    f.refusal = describe(plan.error());
    return f;
  }
  const auto* placed = plan->find(r.role);
  for (auto d : placed->devices)
    f.peak_bytes = std::max(f.peak_bytes, plan->devices[static_cast<size_t>(d)].peak_bytes);
  f.comm = placed->comm;
  f.fits = plan->device_memory_bytes <= 0 || f.peak_bytes <= 0.9 * plan->device_memory_bytes;
  if (!f.fits)
    f.refusal = "its devices peak at " + gib(f.peak_bytes) + ", above 90% of a device's " +
                gib(plan->device_memory_bytes);
  return f;
}

} // namespace

std::vector<layout_fit> suggest_layouts(const job_config& cfg) {
  std::vector<layout_fit> out;
  for (size_t i = 0; i < cfg.placement.roles.size(); ++i) {
    const auto& rp = cfg.placement.roles[i];
    const auto* t = find_role(rp.role);
    const auto ranks = rp.dp * rp.tp * rp.pp;
    if (!t || !t->trains() || t->id == role_id::rollout || ranks < 2)
      continue;
    std::vector<layout_fit> mine;
    for (int tp : {1, 2, 4, 8})
      for (int pp : {1, 2, 4, 8, 16})
        if (ranks % (tp * pp) == 0)
          mine.push_back(judge_layout(
              cfg, i, parallel_layout{static_cast<int32_t>(ranks / (tp * pp)), tp, pp}));
    std::stable_sort(mine.begin(), mine.end(), [](const layout_fit& a, const layout_fit& b) {
      if (a.fits != b.fits)
        return a.fits;
      if (a.comm.total() != b.comm.total())
        return a.comm.total() < b.comm.total();
      return a.peak_bytes < b.peak_bytes;
    });
    out.insert(out.end(), mine.begin(), mine.end());
  }
  return out;
}

std::string render_layouts(const std::vector<layout_fit>& fits) {
  if (fits.empty())
    return "layouts: no trained role with 2 ranks or more in placement.roles\n";
  std::string out = "layouts (fitting first, least communication first; NOTE [layout "
                    "suggestions]):\n";
  std::string role;
  for (const auto& f : fits) {
    if (f.role != role) {
      role = f.role;
      out +=
          "  " + role + " (" + f.yaml_path + ", " + std::to_string(f.layout.ranks()) + " ranks):\n";
    }
    out += "    dp " + std::to_string(f.layout.dp) + ", tp " + std::to_string(f.layout.tp) +
           ", pp " + std::to_string(f.layout.pp) + ": " +
           (f.fits ? "fits, its devices peak at " + gib(f.peak_bytes) + ", a rank receives " +
                         comm_text(f.comm) + " a step"
                   : "does not fit: " + f.refusal) +
           "\n";
  }
  return out;
}

std::string render_suggestions(const std::vector<strategy_fit>& fits) {
  if (fits.empty())
    return "strategies: no trained role in placement.roles (a strategy shards over a role's DP "
           "ranks: give placement.mode, pools and the role's dp)\n";
  std::string out = "strategies (cheapest communication first; NOTE [strategy suggestions]):\n";
  std::string role;
  for (const auto& f : fits) {
    if (f.role != role) {
      role = f.role;
      out += "  " + role + " (" + f.yaml_path + "):\n";
    }
    char mb[32];
    std::snprintf(mb, sizeof mb, "%.1f MB", f.received_bytes / 1e6);
    out += "    " + std::string{to_string(f.strategy)} + ": " +
           (f.fits ? "fits, a rank " + gib(f.rank_bytes) + ", receives " + mb + " a step"
                   : "does not fit: " + f.refusal) +
           "\n";
  }
  return out;
}

} // namespace troupe::actors::rl
