#include "actors/rl/episodes.hpp"

#include "models/tokenizer.hpp"
#include "runtime/bounded_call.hpp"
#include "runtime/metric_name.hpp"
#include "runtime/utf8.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>

// The episode runner (NOTE [episodes] in episodes.hpp).
namespace troupe::actors::rl {

namespace {

using steady = std::chrono::steady_clock;

double seconds_since(steady::time_point t) {
  return std::chrono::duration<double>(steady::now() - t).count();
}

using runtime::bounded_call;

bool finite_in_fp32(double v) {
  return std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max();
}

// ---- rendering -------------------------------------------------------------------

bool has_chat_template(const prompt_encoder& enc) {
  return static_cast<bool>(enc.tokenizer().chat());
}

// NOTE [observation tokens]: a model without a chat template reads
// observations in a plain rendering: a tool message as
// "<tool_response>CONTENT</tool_response>\n", any other as "CONTENT\n".
std::string plain_rendering(const observation& o) {
  std::string out;
  for (const auto& m : o.messages)
    out +=
        m.role == "tool" ? "<tool_response>" + m.content + "</tool_response>\n" : m.content + "\n";
  return out;
}

// NOTE [observation tokens]: with a chat template, the observation's text
// is what the template adds to a conversation that ends with an assistant
// turn when the observation's messages follow it (and the generation
// prompt after them): the render of [user U, assistant A] is cut after the
// EOS text that ends A's turn — where the model's own turn ended — and the
// render with the observation must extend that cut; the rest is the
// observation. Placeholders stand for U and A, so the result depends on the
// template alone, never on what the model wrote.
expected<std::string> templated_observation(const prompt_encoder& enc, const observation& o,
                                            const nlohmann::ordered_json& tools) {
  static const std::string user = "troupe-user-turn", answer = "troupe-assistant-turn";
  auto base = nlohmann::ordered_json::array(
      {{{"role", "user"}, {"content", user}}, {{"role", "assistant"}, {"content", answer}}});
  auto with = base;
  for (auto& m : o.messages_json())
    with.push_back(std::move(m));
  auto before = enc.render(base, false, tools);
  if (!before)
    return before.error();
  auto after = enc.render(with, true, tools);
  if (!after)
    return after.error();
  auto at = before->find(answer);
  if (at == std::string::npos)
    return make_error(errc::unsupported,
                      "the chat template does not render an assistant message's content");
  size_t cut = before->size();
  const auto& eos = enc.tokenizer().eos_text();
  if (auto end = eos.empty() ? std::string::npos : before->find(eos, at + answer.size());
      end != std::string::npos)
    cut = end + eos.size();
  if (after->compare(0, cut, *before, 0, cut) != 0)
    return make_error(errc::unsupported, "the chat template renders the turns before an "
                                         "observation differently once it follows");
  return after->substr(cut);
}

} // namespace

void append_model_tokens(episode& ep, const inference::sample_output& out) {
  ep.last_turn_begin = ep.tokens.size();
  ep.tokens.insert(ep.tokens.end(), out.tokens.begin(), out.tokens.end());
  ep.loss_mask.resize(ep.tokens.size(), 1.0f);
  ep.logprobs.insert(ep.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
  ep.logprobs.resize(ep.tokens.size(), 0.0f);
  ep.versions.insert(ep.versions.end(), out.versions.begin(), out.versions.end());
  ep.versions.resize(ep.tokens.size(), ep.versions.empty() ? 0 : ep.versions.back());
  ++ep.turns;
}

void append_observation_tokens(episode& ep, const std::vector<int64_t>& tokens) {
  ep.tokens.insert(ep.tokens.end(), tokens.begin(), tokens.end());
  ep.loss_mask.resize(ep.tokens.size(), 0.0f);
  ep.logprobs.resize(ep.tokens.size(), 0.0f);
  ep.versions.resize(ep.tokens.size(), ep.versions.empty() ? 0 : ep.versions.back());
  ep.observation_tokens += static_cast<int64_t>(tokens.size());
}

expected<void> check_reset_answer(const reset_result& r, const std::string& session) {
  if (r.session != session)
    return make_error(errc::corrupted, "answered for session '" + r.session + "'");
  if (r.first.empty() || (!r.first.messages.empty() && !r.first.text.empty()))
    return make_error(errc::corrupted, "a first observation needs messages or text, not both");
  if (!r.tools.is_null() && !r.tools.is_array())
    return make_error(errc::corrupted, "tools are not a list");
  return {};
}

expected<void> check_step_answer(const step_result& r, const std::string& session) {
  if (r.session != session)
    return make_error(errc::corrupted, "answered for session '" + r.session + "'");
  if (!finite_in_fp32(r.reward))
    return make_error(errc::corrupted, "a reward that is not a finite fp32 number (" +
                                           std::to_string(r.reward) + ")");
  if (!r.done && r.next.empty())
    return make_error(errc::corrupted, "an empty observation before done");
  if (!r.next.messages.empty() && !r.next.text.empty())
    return make_error(errc::corrupted, "an observation with both messages and text");
  if (r.info.size() > max_env_info)
    return make_error(errc::corrupted, std::to_string(r.info.size()) + " info entries (at most " +
                                           std::to_string(max_env_info) + ")");
  for (const auto& [name, v] : r.info) {
    if (auto why = runtime::peer_metric_name_why(name); !why.empty())
      return make_error(errc::corrupted, "info: " + why);
    if (!finite_in_fp32(v))
      return make_error(errc::corrupted, "info '" + name + "' is not a finite fp32 number");
  }
  return {};
}

expected<std::vector<int64_t>> render_observation(const prompt_encoder& enc, const observation& o,
                                                  const nlohmann::ordered_json& tools) {
  const auto& tok = enc.tokenizer();
  if (o.messages.empty())
    return tok.encode(o.text);
  if (!has_chat_template(enc))
    return tok.encode(plain_rendering(o));
  auto text = templated_observation(enc, o, tools);
  if (!text)
    return text.error();
  return tok.encode(*text);
}

expected<std::vector<int64_t>> render_first_prompt(const prompt_encoder& enc, const observation& o,
                                                   const nlohmann::ordered_json& tools) {
  const bool has_tools = tools.is_array() && !tools.empty();
  const bool templated = has_chat_template(enc);
  if (!templated && !o.messages.empty())
    return encode_prompt(enc.tokenizer(), plain_rendering(o));
  if (o.messages.empty() && !(templated && (has_tools || enc.templates_plain_prompts())))
    return enc.prompt(o.text, "");
  auto messages = o.messages.empty()
                      ? nlohmann::ordered_json::array({{{"role", "user"}, {"content", o.text}}})
                      : o.messages_json();
  auto text = enc.render(messages, true, tools);
  if (!text)
    return text.error();
  return enc.tokenizer().encode(*text);
}

expected<read_turn> read_model_turn(const prompt_encoder& enc, const std::vector<int64_t>& turn,
                                    models::tool_call_format format,
                                    const nlohmann::ordered_json& tools) {
  const auto& tok = enc.tokenizer();
  auto eos = tok.eos_id();
  auto end = eos ? std::find(turn.begin(), turn.end(), *eos) : turn.end();
  std::vector<int64_t> cut(turn.begin(), end);
  read_turn out;
  out.tokens = static_cast<int64_t>(cut.size());
  auto text = tok.decode(cut, {.skip_special_tokens = true});
  auto raw = tok.decode(cut, {.skip_special_tokens = false});
  if (!text || !raw)
    return text ? raw.error() : text.error();
  // Text leaves as UTF-8 (a byte-level model may cut a character).
  out.text = runtime::valid_utf8(*text);
  *raw = runtime::valid_utf8(*raw);
  if (tools.empty()) { // a session without tools: its text is all content
    out.parsed.content = out.text;
    return out;
  }
  out.parsed = models::parse_tool_calls(*raw, format);
  out.errors = out.parsed.malformed;
  for (size_t i = 0; i < out.parsed.calls.size(); ++i)
    if (auto ok = models::check_tool_call(out.parsed.calls[i], tools); !ok)
      out.errors.push_back("tool call " + std::to_string(i + 1) + ": " + context_of(ok.error()));
  return out;
}

env_turn env_turn_of(const std::string& session, int32_t turn, const read_turn& read,
                     const std::string& finish_reason) {
  env_turn t{session, turn, read.text, read.parsed.content, {}, finish_reason, read.tokens};
  for (size_t i = 0; i < read.parsed.calls.size(); ++i) {
    const auto& c = read.parsed.calls[i];
    t.calls.push_back(
        {"call_" + std::to_string(turn) + "_" + std::to_string(i + 1), c.name, c.arguments.dump()});
  }
  return t;
}

expected<demonstration_tokens> render_demonstration(const prompt_encoder& enc,
                                                    const demonstration& d,
                                                    models::tool_call_format format) {
  using json = nlohmann::ordered_json;
  auto parse = [](const std::string& text, const char* what) -> expected<json> {
    auto j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_array())
      return make_error(errc::parse_error,
                        std::string{"a demonstration's "} + what + ": expected a JSON list");
    return j;
  };
  // A plain prompt is text, as an environment's first observation of a
  // data row is.
  auto prompt = d.messages.empty() ? expected<json>{json::array()} : parse(d.messages, "messages");
  auto turns = parse(d.turns, "turns");
  auto tools = d.tools.empty() ? expected<json>{json::array()} : parse(d.tools, "tools");
  if (!prompt || !turns || !tools)
    return !prompt ? prompt.error() : !turns ? turns.error() : tools.error();
  demonstration_tokens out;
  auto head = observation_from_messages(*prompt);
  if (d.messages.empty())
    head.text = d.prompt;
  auto first = render_first_prompt(enc, head, *tools);
  if (!first)
    return first.error();
  out.prompt = std::move(*first);
  auto append = [&](const std::vector<int64_t>& ids, float mask) {
    out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
    out.loss_mask.insert(out.loss_mask.end(), ids.size(), mask);
  };
  for (size_t i = 0; i < turns->size();) {
    const auto& m = (*turns)[i];
    if (m.value("role", "") == "assistant") {
      append(enc.response(models::write_tool_calls(message_text(m), tool_calls_of(m), format)),
             1.0f);
      ++i;
      continue;
    }
    size_t end = i;
    while (end < turns->size() && (*turns)[end].value("role", "") != "assistant")
      ++end;
    json between(turns->begin() + static_cast<long>(i), turns->begin() + static_cast<long>(end));
    auto obs = render_observation(enc, observation_from_messages(between), *tools);
    if (!obs)
      return with_prefix(obs.error(), "a demonstration's turn " + std::to_string(i + 1));
    append(*obs, 0.0f);
    i = end;
  }
  return out;
}

namespace {

// ---- the runner ------------------------------------------------------------------

// An episode on its way, with what its next turn needs.
struct live_episode {
  episode ep;
  nlohmann::ordered_json tools;
  inference::sampling_params sampling; ///< n = 1; the seed is set per turn
  std::optional<uint64_t> seed;
  uint64_t sample = 0;
  /// The sample its next turn extends (generate_request::extends).
  std::string extends;
  /// The session is open at the environment.
  bool open = true;
  /// The turn just generated, not yet taken.
  std::optional<inference::sample_output> first;
};

class runner {
public:
  runner(caf::actor_system& sys, inference::rollout_actor rollout, std::shared_ptr<environment> env,
         const prompt_encoder& enc, episode_options opts)
      : sys_(sys), rollout_(std::move(rollout)), env_(std::move(env)), enc_(enc),
        opts_(std::move(opts)) {}

  expected<episode_batch> run(const std::vector<episode_prompt>& prompts) {
    auto started = steady::now();
    if (auto ok = open_sessions(prompts); !ok)
      return ok.error();
    if (auto ok = first_turns(prompts); !ok) {
      close_open("error");
      return ok.error();
    }
    drive_all();
    close_open(error_ ? "error" : "cancelled");
    if (error_)
      return *error_;
    episode_batch out;
    for (auto& le : live_)
      out.episodes.push_back(std::move(le.ep));
    out.stats = std::move(stats_);
    out.stats.seconds = seconds_since(started);
    return out;
  }

private:
  std::string where(const std::string& session, const std::string& phase) const {
    return "environment '" + env_->name() + "': session " + session + ": " + phase;
  }

  expected<void> open_sessions(const std::vector<episode_prompt>& prompts);
  expected<void> first_turns(const std::vector<episode_prompt>& prompts);
  void parallel(size_t n, int64_t threads, const std::function<void(size_t)>& fn);
  void drive_all();
  void drive_lockstep();
  expected<void> drive(live_episode& le, caf::scoped_actor& self);
  expected<inference::generation> generate(caf::scoped_actor& self,
                                           std::vector<inference::generate_request> reqs,
                                           const std::string& what);
  /// Takes the turn `out` into `le`; answers the next request, or nullopt
  /// when the episode ended.
  expected<std::optional<inference::generate_request>> take_turn(live_episode& le,
                                                                 inference::sample_output out);
  expected<step_result> step(live_episode& le, const env_turn& t);
  expected<std::optional<observation>> respond(live_episode& le, const read_turn& read,
                                               const inference::sample_output& out);
  void end(live_episode& le, episode_end why, bool close);
  void close_open(std::string_view reason);
  void saw(const inference::engine_metrics& m) {
    std::lock_guard lock{mu_};
    if (m.steps >= stats_.engine.steps)
      stats_.engine = m;
  }
  void fail(caf::error err) {
    std::lock_guard lock{mu_};
    if (!error_)
      error_ = std::move(err);
    abort_ = true;
  }

  caf::actor_system& sys_;
  inference::rollout_actor rollout_;
  std::shared_ptr<environment> env_;
  const prompt_encoder& enc_;
  episode_options opts_;
  std::vector<live_episode> live_;
  std::mutex mu_;
  std::optional<caf::error> error_;
  std::atomic<bool> abort_{false};
  episode_stats stats_;
};

expected<void> runner::open_sessions(const std::vector<episode_prompt>& prompts) {
  std::vector<reset_task> tasks;
  for (const auto& p : prompts)
    for (int32_t k = 0; k < p.sampling.n; ++k) {
      live_episode le;
      le.ep.session = p.id + "/" + std::to_string(k);
      le.sampling = p.sampling;
      le.sampling.n = 1;
      le.seed = p.sampling.seed;
      le.sample = static_cast<uint64_t>(k);
      tasks.push_back({le.ep.session, p.row});
      live_.push_back(std::move(le));
    }
  auto t0 = steady::now();
  auto env = env_;
  auto got = bounded_call<std::vector<reset_result>>(opts_.timeout_s,
                                                     [env, tasks] { return env->reset(tasks); });
  stats_.reset_seconds = seconds_since(t0);
  const std::string sessions =
      tasks.empty() ? "-" : tasks.front().session + ".." + tasks.back().session;
  if (!got)
    return with_prefix(got.error(), where(sessions, "reset"));
  if (got->size() != tasks.size())
    return make_error(errc::corrupted, where(sessions, "reset") + ": " +
                                           std::to_string(got->size()) + " results for " +
                                           std::to_string(tasks.size()) + " sessions");
  for (size_t i = 0; i < tasks.size(); ++i) {
    auto& r = (*got)[i];
    auto& le = live_[i];
    const auto at = where(le.ep.session, "reset");
    if (auto ok = check_reset_answer(r, le.ep.session); !ok)
      return with_prefix(ok.error(), at);
    auto prompt = render_first_prompt(enc_, r.first, r.tools);
    if (!prompt)
      return with_prefix(prompt.error(), at);
    le.ep.prompt = std::move(*prompt);
    le.tools = r.tools.is_null() ? nlohmann::ordered_json::array() : r.tools;
    le.ep.transcript =
        r.first.messages.empty()
            ? nlohmann::ordered_json::array({{{"role", "user"}, {"content", r.first.text}}})
            : r.first.messages_json();
  }
  return {};
}

// The first turns in one call: a prompt's samples as one request of n when
// their first prompts are the same (the batch path's request), else one
// request each.
expected<void> runner::first_turns(const std::vector<episode_prompt>& prompts) {
  std::vector<inference::generate_request> reqs;
  std::vector<std::vector<size_t>> episodes_of; // per request
  size_t at = 0;
  for (const auto& p : prompts) {
    const auto n = static_cast<size_t>(p.sampling.n);
    bool same = true;
    for (size_t k = 1; k < n; ++k)
      same = same && live_[at + k].ep.prompt == live_[at].ep.prompt;
    if (same) {
      reqs.push_back({p.id, live_[at].ep.prompt, p.sampling, ""});
      episodes_of.emplace_back();
      for (size_t k = 0; k < n; ++k) {
        episodes_of.back().push_back(at + k);
        live_[at + k].extends = inference::sample_ref(p.id, k);
      }
    } else {
      for (size_t k = 0; k < n; ++k) {
        auto& le = live_[at + k];
        inference::generate_request q{le.ep.session, le.ep.prompt, le.sampling, ""};
        if (le.seed)
          q.sampling.seed = mix_seed({*le.seed, 61, k});
        reqs.push_back(std::move(q));
        episodes_of.push_back({at + k});
        le.extends = le.ep.session;
      }
    }
    at += n;
  }
  caf::scoped_actor self{sys_};
  auto got = generate(self, std::move(reqs), "episodes' first turns");
  if (!got)
    return got.error();
  for (size_t r = 0; r < episodes_of.size(); ++r)
    for (size_t k = 0; k < episodes_of[r].size(); ++k)
      live_[episodes_of[r][k]].first = std::move(got->outputs[r].samples.at(k));
  return {};
}

// Runs fn(i) for i in [0, n) on up to `threads` threads (0 = one per
// index, up to 256); stops starting new ones once the run aborts.
void runner::parallel(size_t n, int64_t threads_wanted, const std::function<void(size_t)>& fn) {
  size_t threads =
      threads_wanted > 0 ? static_cast<size_t>(threads_wanted) : std::min<size_t>(n, 256);
  threads = std::max<size_t>(1, std::min(threads, n));
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (size_t i = next++; i < n && !abort_; i = next++)
        fn(i);
    });
  for (auto& t : pool)
    t.join();
}

void runner::drive_all() {
  if (!opts_.overlap)
    return drive_lockstep();
  parallel(live_.size(), opts_.threads, [&](size_t i) {
    caf::scoped_actor actor{sys_};
    if (auto ok = drive(live_[i], actor); !ok)
      fail(ok.error());
  });
}

// Without overlap: every episode's turn k is generated in one call, then
// every environment step of turn k is awaited, then turn k + 1.
void runner::drive_lockstep() {
  std::vector<std::optional<inference::generate_request>> next(live_.size());
  std::vector<std::optional<inference::sample_output>> outs(live_.size());
  for (size_t i = 0; i < live_.size(); ++i)
    outs[i] = std::move(live_[i].first);
  caf::scoped_actor self{sys_};
  while (!abort_) {
    parallel(live_.size(), opts_.threads, [&](size_t i) {
      next[i].reset();
      if (!outs[i])
        return;
      auto r = take_turn(live_[i], std::move(*outs[i]));
      outs[i].reset();
      if (!r)
        return fail(r.error());
      next[i] = std::move(*r);
    });
    std::vector<inference::generate_request> reqs;
    std::vector<size_t> who;
    for (size_t i = 0; i < next.size(); ++i)
      if (next[i]) {
        who.push_back(i);
        reqs.push_back(std::move(*next[i]));
      }
    if (reqs.empty() || abort_)
      return;
    auto got = generate(self, std::move(reqs), "episodes' turns");
    if (!got)
      return fail(got.error());
    for (size_t k = 0; k < who.size(); ++k) {
      live_[who[k]].extends = got->outputs[k].id;
      outs[who[k]] = std::move(got->outputs[k].samples.at(0));
    }
  }
}

expected<inference::generation> runner::generate(caf::scoped_actor& self,
                                                 std::vector<inference::generate_request> reqs,
                                                 const std::string& what) {
  const auto asked = reqs.size();
  expected<inference::generation> got = make_error(errc::internal, "no reply");
  self->request(rollout_,
                std::chrono::milliseconds(static_cast<int64_t>(opts_.generate_timeout_s * 1000)),
                inference::generate_atom::value, std::move(reqs))
      .receive([&](inference::generation& g) { got = std::move(g); },
               [&](caf::error& e) { got = with_prefix(e, "rollout: " + what); });
  if (!got)
    return got;
  saw(got->engine);
  if (got->outputs.size() != asked)
    return make_error(errc::internal, "rollout: " + what + ": answered " +
                                          std::to_string(got->outputs.size()) + " of " +
                                          std::to_string(asked) + " requests");
  return got;
}

expected<void> runner::drive(live_episode& le, caf::scoped_actor& self) {
  auto next = take_turn(le, std::move(*le.first));
  while (next && *next && !abort_) {
    const auto turn = "session " + le.ep.session + ": turn " + std::to_string(le.ep.turns + 1);
    auto got = generate(self, {std::move(**next)}, turn);
    if (!got)
      return got.error();
    if (got->outputs[0].samples.size() != 1)
      return make_error(errc::internal, "rollout: " + turn + ": answered " +
                                            std::to_string(got->outputs[0].samples.size()) +
                                            " samples");
    le.extends = got->outputs[0].id;
    next = take_turn(le, std::move(got->outputs[0].samples[0]));
  }
  if (!next)
    return next.error();
  return {};
}

expected<step_result> runner::step(live_episode& le, const env_turn& t) {
  const auto at = where(le.ep.session, "step (turn " + std::to_string(t.turn) + ")");
  auto t0 = steady::now();
  auto env = env_;
  auto got = bounded_call<std::vector<step_result>>(opts_.timeout_s,
                                                    [env, t] { return env->step(std::vector{t}); });
  {
    std::lock_guard lock{mu_};
    stats_.step_seconds.push_back(seconds_since(t0));
  }
  if (!got)
    return with_prefix(got.error(), at);
  if (got->size() != 1)
    return make_error(errc::corrupted,
                      at + ": " + std::to_string(got->size()) + " results for one turn");
  auto& r = got->front();
  if (auto ok = check_step_answer(r, t.session); !ok)
    return with_prefix(ok.error(), at);
  return std::move(r);
}

void runner::end(live_episode& le, episode_end why, bool close) {
  le.ep.end = why;
  if (close && le.open) {
    auto env = env_;
    std::vector<std::string> ids{le.ep.session};
    auto reason = std::string{to_string(why)};
    (void)bounded_call<bool>(opts_.timeout_s, [env, ids, reason]() -> expected<bool> {
      env->close(ids, reason);
      return true;
    });
  }
  le.open = false;
}

void runner::close_open(std::string_view reason) {
  std::vector<std::string> ids;
  for (auto& le : live_)
    if (std::exchange(le.open, false))
      ids.push_back(le.ep.session);
  if (ids.empty())
    return;
  auto env = env_;
  (void)bounded_call<bool>(opts_.timeout_s,
                           [env, ids, r = std::string{reason}]() -> expected<bool> {
                             env->close(ids, r);
                             return true;
                           });
}

// NOTE [tool calls]: a turn with a malformed or invalid call is told why,
// without a Step; otherwise the environment answers. nullopt = done.
expected<std::optional<observation>> runner::respond(live_episode& le, const read_turn& read,
                                                     const inference::sample_output& out) {
  auto& ep = le.ep;
  observation obs;
  if (!read.errors.empty()) {
    ep.tool_errors += static_cast<int32_t>(read.errors.size());
    for (const auto& why : read.errors)
      obs.messages.push_back({"tool", "error: " + why, "", ""});
    return std::optional{std::move(obs)};
  }
  auto r = step(le, env_turn_of(ep.session, ep.turns, read, out.finish_reason));
  if (!r)
    return r.error();
  for (const auto& [name, v] : r->info)
    ep.info[name] += v;
  if (r->done) {
    ep.reward = r->reward;
    le.open = false;
    end(le, episode_end::done, false);
    return std::optional<observation>{};
  }
  if (r->reward != 0) { // shaping, at the turn's last token
    ep.shaping.resize(ep.tokens.size(), 0.0f);
    ep.shaping.back() += static_cast<float>(r->reward);
  }
  return std::optional{std::move(r->next)};
}

expected<std::optional<inference::generate_request>>
runner::take_turn(live_episode& le, inference::sample_output out) {
  auto& ep = le.ep;
  append_model_tokens(ep, out);
  const auto turn = ep.turns;
  const auto phase = "turn " + std::to_string(turn);
  auto read = read_model_turn(enc_, out.tokens, opts_.tool_format, le.tools);
  if (!read)
    return with_prefix(read.error(), where(ep.session, phase));
  const auto calls = read->parsed.calls.size() + read->parsed.malformed.size();
  ep.tool_turns += calls > 0 ? 1 : 0;
  ep.tool_calls += static_cast<int32_t>(calls);
  ep.transcript.push_back({{"role", "assistant"}, {"content", read->text}, {"turn", turn}});
  auto obs = respond(le, *read, out);
  if (!obs || !*obs)
    return obs ? expected<std::optional<inference::generate_request>>{std::nullopt} : obs.error();
  if (out.finish_reason == "length") {
    end(le, episode_end::length, true);
    return std::nullopt;
  }
  if (turn >= opts_.max_turns) {
    end(le, episode_end::max_turns, true);
    return std::nullopt;
  }
  auto obs_tokens = render_observation(enc_, **obs, le.tools);
  if (!obs_tokens)
    return with_prefix(obs_tokens.error(), where(ep.session, "observation after " + phase));
  const auto used = static_cast<int64_t>(ep.prompt.size() + ep.tokens.size() + obs_tokens->size());
  if (obs_tokens->empty() || used + 1 >= opts_.max_context) {
    end(le, episode_end::context, true);
    return std::nullopt;
  }
  append_observation_tokens(ep, *obs_tokens);
  for (auto m : (*obs)->messages.empty()
                    ? nlohmann::ordered_json::array({{{"role", "user"}, {"content", (*obs)->text}}})
                    : (*obs)->messages_json()) {
    m["turn"] = turn;
    ep.transcript.push_back(std::move(m));
  }
  inference::generate_request q;
  q.id = ep.session + "/t" + std::to_string(turn + 1);
  q.prompt = std::move(*obs_tokens);
  q.extends = le.extends;
  q.sampling = le.sampling;
  q.sampling.max_tokens = std::min(le.sampling.max_tokens, opts_.max_context - used);
  if (le.seed)
    q.sampling.seed = mix_seed({*le.seed, 62, le.sample, static_cast<uint64_t>(turn + 1)});
  return std::optional{std::move(q)};
}

double percentile(std::vector<double> xs, double q) {
  if (xs.empty())
    return 0;
  std::sort(xs.begin(), xs.end());
  auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(xs.size())));
  return xs[std::min(xs.size() - 1, rank == 0 ? 0 : rank - 1)];
}

} // namespace

expected<episode_batch> run_episodes(caf::actor_system& sys,
                                     const inference::rollout_actor& rollout,
                                     std::shared_ptr<environment> env, const prompt_encoder& enc,
                                     const std::vector<episode_prompt>& prompts,
                                     const episode_options& opts) {
  if (!env)
    return make_error(errc::invalid_argument, "run_episodes: no environment");
  for (const auto& p : prompts)
    if (p.sampling.n < 1)
      return make_error(errc::invalid_argument, "run_episodes: prompt '" + p.id + "': n < 1");
  return runner{sys, rollout, std::move(env), enc, opts}.run(prompts);
}

std::map<std::string, double> episode_metrics(const episode_batch& b) {
  std::map<std::string, double> m;
  const auto n = static_cast<double>(b.episodes.size());
  if (b.episodes.empty())
    return m;
  double turns = 0, tool_turns = 0, calls = 0, errors = 0, generated = 0, observed = 0, reward = 0,
         max_turns = 0;
  std::map<std::string, double> info;
  std::map<episode_end, double> ends;
  for (const auto& e : b.episodes) {
    turns += e.turns;
    max_turns = std::max(max_turns, static_cast<double>(e.turns));
    tool_turns += e.tool_turns;
    calls += e.tool_calls;
    errors += e.tool_errors;
    observed += static_cast<double>(e.observation_tokens);
    generated += static_cast<double>(e.tokens.size()) - static_cast<double>(e.observation_tokens);
    reward += e.reward;
    ends[e.end] += 1;
    for (const auto& [k, v] : e.info)
      info[k] += v;
  }
  m["env/episodes"] = n;
  m["env/turns/mean"] = turns / n;
  m["env/turns/max"] = max_turns;
  m["env/tool_call_rate"] = turns > 0 ? tool_turns / turns : 0;
  m["env/tool_calls/mean"] = calls / n;
  m["env/tool_error_rate"] = calls > 0 ? errors / calls : 0;
  m["env/generated_tokens/mean"] = generated / n;
  m["env/observation_tokens/mean"] = observed / n;
  m["env/reward/mean"] = reward / n;
  m["env/step_latency_ms/p50"] = 1000 * percentile(b.stats.step_seconds, 0.50);
  m["env/step_latency_ms/p99"] = 1000 * percentile(b.stats.step_seconds, 0.99);
  m["env/reset_s"] = b.stats.reset_seconds;
  for (auto e :
       {episode_end::done, episode_end::max_turns, episode_end::context, episode_end::length})
    m["env/finish/" + std::string{to_string(e)}] = ends[e] / n;
  for (const auto& [k, v] : info)
    m["env/info/" + k] = v / n;
  return m;
}

} // namespace troupe::actors::rl
