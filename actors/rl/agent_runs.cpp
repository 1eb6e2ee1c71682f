#include "actors/rl/agent_runs.hpp"

#include "models/tokenizer.hpp"
#include "runtime/bounded_call.hpp"
#include "runtime/file_io.hpp"

#include <nlohmann/json.hpp>

#include <cctype>
#include <chrono>
#include <thread>

// NOTE [agent runs] in agent_runs.hpp.
namespace troupe::actors::rl {

namespace {

using json = nlohmann::ordered_json;
using steady = std::chrono::steady_clock;

double seconds_since(steady::time_point t) {
  return std::chrono::duration<double>(steady::now() - t).count();
}

// "a, b, c and 5 more".
std::string listed(const std::vector<std::string>& ids) {
  constexpr size_t shown = 8;
  std::string out;
  for (size_t i = 0; i < ids.size() && i < shown; ++i)
    out += (i ? ", " : "") + ids[i];
  if (ids.size() > shown)
    out += " and " + std::to_string(ids.size() - shown) + " more";
  return out;
}

// An episode of the run, and what its agent is given.
struct planned {
  std::string id;
  const example* row = nullptr;
  json messages = json::array();
  json tools = json::array();
  std::string prompt;
  /// Its environment session is open.
  bool open = false;
};

class agent_runner {
public:
  agent_runner(agent_host& host, agent_book& book, std::shared_ptr<environment> env,
               const prompt_encoder& enc, const agent_run_options& o)
      : host_(host), book_(book), env_(std::move(env)), enc_(enc), o_(o) {}

  expected<agent_run> run(const std::vector<episode_prompt>& prompts) {
    const auto started = steady::now();
    const auto rewrites = book_.history_rewrites();
    plan(prompts);
    auto got = [&]() -> expected<agent_run> {
      if (auto ok = first_observations(); !ok)
        return ok.error();
      std::vector<std::string> ids;
      for (const auto& e : planned_)
        ids.push_back(e.id);
      book_.open(ids, o_.max_calls);
      if (auto ok = write_tasks(); !ok)
        return ok.error();
      if (auto ok = run_command(); !ok)
        return ok.error();
      return collect();
    }();
    book_.open({}, 0); // the iteration is over: nothing more is admitted
    close_open(got ? "max_turns" : "error");
    if (!got)
      return got;
    got->batch.stats.seconds = seconds_since(started);
    got->metrics["agent/history_rewrites"] =
        static_cast<double>(book_.history_rewrites() - rewrites);
    got->metrics["agent/seconds"] = got->batch.stats.seconds;
    return got;
  }

private:
  std::string what() const {
    std::string argv;
    for (const auto& a : o_.command)
      argv += (argv.empty() ? "" : " ") + a;
    return "agent '" + argv + "'";
  }
  std::string env_where(const std::string& phase) const {
    return "environment '" + env_->name() + "': " + phase;
  }

  void plan(const std::vector<episode_prompt>& prompts) {
    for (const auto& p : prompts)
      for (int32_t k = 0; k < p.sampling.n; ++k) {
        planned e;
        e.id = agent_episode_id(p.id, k);
        e.row = &p.row;
        planned_.push_back(std::move(e));
        sampling_.push_back(p.sampling);
      }
  }

  expected<void> first_observations();
  expected<void> describe_first(planned& e, const observation& first, const json& tools);
  expected<void> write_tasks() const;
  expected<void> run_command();
  expected<agent_run> collect();
  expected<void> score_last_turns(std::vector<episode>& eps, const std::vector<size_t>& which,
                                  episode_stats& stats);
  void close_open(std::string_view reason);

  agent_host& host_;
  agent_book& book_;
  std::shared_ptr<environment> env_;
  const prompt_encoder& enc_;
  const agent_run_options& o_;
  std::vector<planned> planned_;
  std::vector<inference::sampling_params> sampling_;
};

// Each episode's first messages and tools: its environment session's
// (Reset), else the data row's conversation or prompt.
expected<void> agent_runner::first_observations() {
  if (!env_) {
    for (auto& e : planned_) {
      observation first;
      if (!e.row->messages.empty()) {
        auto parsed = json::parse(e.row->messages, nullptr, false);
        if (parsed.is_discarded() || !parsed.is_array())
          return make_error(errc::parse_error, "episode " + e.id + ": the row's messages");
        for (const auto& m : parsed)
          first.messages.push_back({m.value("role", "user"), m.value("content", ""), "", ""});
      } else {
        first.messages.push_back({"user", e.row->prompt, "", ""});
      }
      if (auto ok = describe_first(e, first, json::array()); !ok)
        return ok;
    }
    return {};
  }
  std::vector<reset_task> tasks;
  for (const auto& e : planned_)
    tasks.push_back({e.id, *e.row});
  auto env = env_;
  auto got = runtime::bounded_call<std::vector<reset_result>>(
      o_.episodes.timeout_s, [env, tasks] { return env->reset(tasks); });
  if (!got)
    return with_prefix(got.error(), env_where("reset"));
  if (got->size() != tasks.size())
    return make_error(errc::corrupted, env_where("reset") + ": " + std::to_string(got->size()) +
                                           " results for " + std::to_string(tasks.size()) +
                                           " sessions");
  for (auto& e : planned_)
    e.open = true;
  for (size_t i = 0; i < planned_.size(); ++i) {
    auto& e = planned_[i];
    const auto& r = (*got)[i];
    if (auto ok = check_reset_answer(r, e.id); !ok)
      return with_prefix(ok.error(), env_where("session " + e.id + ": reset"));
    if (auto ok = describe_first(e, r.first, r.tools.is_null() ? json::array() : r.tools); !ok)
      return ok;
  }
  return {};
}

// The task file's view of a first observation: messages (text as one user
// message) and, for completions agents, the text of the prompt the episode
// runner would send (after its BOS).
expected<void> agent_runner::describe_first(planned& e, const observation& first,
                                            const json& tools) {
  e.tools = tools;
  e.messages = first.messages.empty() ? json::array({{{"role", "user"}, {"content", first.text}}})
                                      : first.messages_json();
  auto ids = render_first_prompt(enc_, first, tools);
  if (!ids)
    return with_prefix(ids.error(), "episode " + e.id + ": its first prompt");
  // The completions endpoint puts BOS before a prompt itself.
  const auto& tok = enc_.tokenizer();
  if (!ids->empty() && tok.bos_id() && ids->front() == *tok.bos_id())
    ids->erase(ids->begin());
  auto text = tok.decode(*ids, {.skip_special_tokens = false});
  if (!text)
    return with_prefix(text.error(), "episode " + e.id + ": its first prompt");
  e.prompt = std::move(*text);
  return {};
}

expected<void> agent_runner::write_tasks() const {
  std::string lines;
  for (size_t i = 0; i < planned_.size(); ++i) {
    const auto& e = planned_[i];
    const auto& s = sampling_[i];
    json task{{"episode", e.id},
              {"base_url", host_.base_url(e.id)},
              {"messages", e.messages},
              {"prompt", e.prompt},
              {"tools", e.tools},
              {"max_tokens", s.max_tokens},
              {"temperature", s.temperature},
              {"top_p", s.top_p}};
    lines += task.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  }
  if (auto ok = runtime::write_file_atomic(o_.task_file, lines); !ok)
    return with_prefix(ok.error(), what() + ": the task file");
  return {};
}

// Runs the command to its end, within timeout_s.
expected<void> agent_runner::run_command() {
  const std::vector<std::pair<std::string, std::string>> env{
      {"OPENAI_BASE_URL", host_.api_base()},
      {"OPENAI_API_KEY", host_.key()},
      {"TROUPE_AGENT_TASKS", o_.task_file},
      {"TROUPE_AGENT_STEP", std::to_string(o_.episodes.step)}};
  if (auto ok = host_.start(o_.command, env, o_.log_file); !ok)
    return with_prefix(ok.error(), what());
  const auto deadline = steady::now() + std::chrono::duration<double>(o_.timeout_s);
  std::optional<std::string> ended;
  while (!(ended = host_.ended())) {
    if (steady::now() >= deadline) {
      host_.kill();
      std::vector<std::string> missing;
      for (const auto& e : planned_)
        if (!book_.rewarded(e.id))
          missing.push_back(e.id);
      return make_error(errc::timeout, what() + ": still running after " +
                                           std::to_string(o_.timeout_s) +
                                           " s (rl.agent.timeout_s); episodes without a reward: " +
                                           (missing.empty() ? "none" : listed(missing)) +
                                           " (its output: " + o_.log_file + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!ended->empty())
    return make_error(errc::process_failed,
                      what() + " " + *ended + " (its output: " + o_.log_file + ")");
  return {};
}

// Each episode's last trajectory and its reward.
expected<agent_run> agent_runner::collect() {
  agent_run out;
  std::vector<std::string> no_call, no_reward;
  std::vector<size_t> to_score;
  double trajectories = 0, calls = 0;
  for (size_t i = 0; i < planned_.size(); ++i) {
    const auto& e = planned_[i];
    auto got = book_.take(e.id);
    if (!got) {
      no_call.push_back(e.id);
      continue;
    }
    trajectories += static_cast<double>(got->trajectories.size());
    for (const auto& t : got->trajectories)
      calls += t.turns;
    auto ep = std::move(got->trajectories.back());
    ep.session = e.id;
    if (got->reward)
      ep.reward = *got->reward;
    else if (env_)
      to_score.push_back(i);
    else if (o_.need_reward)
      no_reward.push_back(e.id);
    out.batch.episodes.push_back(std::move(ep));
  }
  if (!no_call.empty())
    return make_error(errc::process_failed, what() +
                                                ": episodes without a call: " + listed(no_call) +
                                                " (its output: " + o_.log_file + ")");
  if (!no_reward.empty())
    return make_error(errc::process_failed,
                      what() +
                          ": episodes without a reward (POST /v1/episodes/{id}/reward, or an "
                          "rl.environment to score the last turn): " +
                          listed(no_reward));
  // Every episode made a call (else returned above), so batch index i is
  // planned index i, as to_score holds them.
  if (auto ok = score_last_turns(out.batch.episodes, to_score, out.batch.stats); !ok)
    return ok.error();
  const auto n = std::max<double>(1.0, static_cast<double>(planned_.size()));
  out.metrics["agent/trajectories/mean"] = trajectories / n;
  out.metrics["agent/calls/mean"] = calls / n;
  return out;
}

// NOTE [agent runs]: the environment's Step on the last assistant turn of
// the episodes `which` that posted no reward, in one call.
expected<void> agent_runner::score_last_turns(std::vector<episode>& eps,
                                              const std::vector<size_t>& which,
                                              episode_stats& stats) {
  std::vector<env_turn> turns;
  std::vector<size_t> stepped;
  for (auto i : which) {
    auto& ep = eps[i];
    std::vector<int64_t> last(ep.tokens.begin() + static_cast<long>(ep.last_turn_begin),
                              ep.tokens.end());
    auto read = read_model_turn(enc_, last, o_.episodes.tool_format, planned_[i].tools);
    if (!read)
      return with_prefix(read.error(), "episode " + ep.session + ": its last turn");
    if (!read->errors.empty()) { // a malformed call ends nothing: no reward
      ep.end = episode_end::max_turns;
      continue;
    }
    turns.push_back(env_turn_of(ep.session, ep.turns, *read,
                                ep.end == episode_end::length ? "length" : "stop"));
    stepped.push_back(i);
  }
  if (turns.empty())
    return {};
  auto env = env_;
  const auto t0 = steady::now();
  auto got = runtime::bounded_call<std::vector<step_result>>(
      o_.episodes.timeout_s, [env, turns] { return env->step(turns); });
  stats.step_seconds.push_back(seconds_since(t0));
  if (!got)
    return with_prefix(got.error(), env_where("step (the agents' last turns)"));
  if (got->size() != turns.size())
    return make_error(errc::corrupted, env_where("step (the agents' last turns)") + ": " +
                                           std::to_string(got->size()) + " results for " +
                                           std::to_string(turns.size()) + " turns");
  for (size_t j = 0; j < stepped.size(); ++j) {
    auto& ep = eps[stepped[j]];
    const auto& r = (*got)[j];
    if (auto ok = check_step_answer(r, ep.session); !ok)
      return with_prefix(ok.error(), env_where("session " + ep.session + ": step"));
    for (const auto& [name, v] : r.info)
      ep.info[name] += v;
    if (r.done) {
      ep.reward = r.reward;
      ep.end = episode_end::done;
      planned_[stepped[j]].open = false;
    } else {
      ep.end = episode_end::max_turns;
    }
  }
  return {};
}

void agent_runner::close_open(std::string_view reason) {
  if (!env_)
    return;
  std::vector<std::string> ids;
  for (auto& e : planned_)
    if (std::exchange(e.open, false))
      ids.push_back(e.id);
  if (ids.empty())
    return;
  auto env = env_;
  (void)runtime::bounded_call<bool>(o_.episodes.timeout_s,
                                    [env, ids, r = std::string{reason}]() -> expected<bool> {
                                      env->close(ids, r);
                                      return true;
                                    });
}

} // namespace

std::string agent_episode_id(const std::string& id, int64_t k) {
  auto out = id + "." + std::to_string(k);
  for (auto& c : out)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':' ||
          c == '-'))
      c = '.';
  return out;
}

expected<agent_run> run_agent_episodes(agent_host& host, agent_book& book,
                                       std::shared_ptr<environment> env, const prompt_encoder& enc,
                                       const std::vector<episode_prompt>& prompts,
                                       const agent_run_options& opts) {
  return agent_runner{host, book, std::move(env), enc, opts}.run(prompts);
}

} // namespace troupe::actors::rl
