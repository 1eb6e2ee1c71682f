#include "actors/rl/agent_book.hpp"

#include "models/tokenizer.hpp"
#include "runtime/utf8.hpp"

#include <algorithm>

// NOTE [agent book] in agent_book.hpp.
namespace troupe::actors::rl {

namespace {

using json = nlohmann::ordered_json;

// The same message as far as the conversation goes: role, content's text,
// and (assistant) the calls.
bool same_message(const json& a, const json& b) {
  if (!a.is_object() || !b.is_object() || a.value("role", "") != b.value("role", ""))
    return false;
  return message_text(a) == message_text(b) && tool_calls_of(a) == tool_calls_of(b) &&
         a.value("tool_call_id", "") == b.value("tool_call_id", "");
}

// Whether `messages` begins with `earlier` and goes on.
bool extends_conversation(const json& earlier, const json& messages) {
  if (!earlier.is_array() || earlier.empty() || messages.size() <= earlier.size())
    return false;
  for (size_t i = 0; i < earlier.size(); ++i)
    if (!same_message(earlier[i], messages[i]))
      return false;
  return true;
}

expected<void> check_messages(const json& messages) {
  if (!messages.is_array() || messages.empty())
    return make_error(errc::invalid_argument, "messages: a non-empty list of messages is needed");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return make_error(errc::invalid_argument,
                        "messages[" + std::to_string(i) + "]: an object with a role is needed");
  }
  return {};
}

} // namespace

void agent_book::open(const std::vector<std::string>& episodes, int64_t max_calls) {
  std::lock_guard lock{mu_};
  episodes_.clear();
  open_.emplace(episodes.begin(), episodes.end());
  max_calls_ = max_calls;
}

expected<void> agent_book::admitted(const std::string& episode) const {
  if (open_ && !open_->count(episode))
    return make_error(errc::not_found, "episode '" + episode + "' is not one of this iteration's");
  return {};
}

expected<const agent_book::trajectory*> agent_book::admit_call(const std::string& episode) {
  if (auto ok = admitted(episode); !ok)
    return ok.error();
  auto& st = episodes_[episode];
  if (max_calls_ > 0 && st.calls >= max_calls_)
    return make_error(errc::out_of_range, "episode '" + episode + "' made its " +
                                              std::to_string(max_calls_) + " calls");
  ++st.calls;
  return st.trajectories.empty() ? nullptr : &st.trajectories.back();
}

std::vector<int64_t> agent_book::served(const trajectory& t) {
  auto ids = t.ep.prompt;
  ids.insert(ids.end(), t.ep.tokens.begin(), t.ep.tokens.end());
  return ids;
}

expected<agent_prompt> agent_book::chat_prompt(const std::string& episode, const json& messages,
                                               const json& tools) {
  if (auto ok = check_messages(messages); !ok)
    return ok.error();
  if (!tools.is_null() && !tools.is_array())
    return make_error(errc::invalid_argument, "tools: a list is needed");
  std::vector<int64_t> sequence;
  bool extends = false;
  size_t known = 0;
  {
    std::lock_guard lock{mu_};
    auto last = admit_call(episode);
    if (!last)
      return last.error();
    if (*last && extends_conversation((*last)->messages, messages)) {
      extends = true;
      known = (*last)->messages.size();
      sequence = served(**last);
    }
  }
  agent_prompt p;
  p.extends = extends;
  p.tools = tools.is_array() && !tools.empty();
  if (extends) {
    auto obs = render_observation(enc_, observation_from_messages(messages, known), tools);
    if (!obs)
      return with_prefix(obs.error(), "messages");
    p.appended = std::move(*obs);
    p.ids = std::move(sequence);
    p.ids.insert(p.ids.end(), p.appended.begin(), p.appended.end());
    return p;
  }
  if (enc_.tokenizer().chat()) {
    auto text = enc_.render(messages, true, tools);
    if (!text)
      return with_prefix(text.error(), "messages");
    p.ids = enc_.tokenizer().encode(*text);
  } else {
    auto ids = render_first_prompt(enc_, observation_from_messages(messages, 0), tools);
    if (!ids)
      return with_prefix(ids.error(), "messages");
    p.ids = std::move(*ids);
  }
  p.appended = p.ids;
  return p;
}

expected<agent_prompt> agent_book::text_prompt(const std::string& episode,
                                               const std::string& text) {
  if (text.empty())
    return make_error(errc::invalid_argument, "prompt: an empty prompt");
  agent_prompt p;
  {
    std::lock_guard lock{mu_};
    auto last = admit_call(episode);
    if (!last)
      return last.error();
    const trajectory* t = *last;
    if (t && !t->text.empty() && text.size() > t->text.size() &&
        text.compare(0, t->text.size(), t->text) == 0) {
      p.extends = true;
      p.ids = served(*t);
      p.appended = enc_.tokenizer().encode(std::string_view{text}.substr(t->text.size()));
      p.ids.insert(p.ids.end(), p.appended.begin(), p.appended.end());
      return p;
    }
  }
  p.ids = encode_prompt(enc_.tokenizer(), text);
  p.appended = p.ids;
  return p;
}

// The trajectory a call's answer goes to (under the lock): the episode's
// current one when the call extends it, else a new one (a rewrite when the
// episode had one).
agent_book::trajectory& agent_book::trajectory_for(const std::string& episode,
                                                   const agent_prompt& p) {
  auto& st = episodes_[episode];
  if (!p.extends || st.trajectories.empty()) {
    if (!st.trajectories.empty())
      ++rewrites_;
    st.trajectories.emplace_back();
    st.trajectories.back().ep.session = episode;
    st.trajectories.back().ep.transcript = json::array();
  }
  return st.trajectories.back();
}

void agent_book::append(trajectory& t, const agent_prompt& p, const inference::sample_output& out) {
  if (!p.extends)
    t.ep.prompt = p.ids;
  else
    append_observation_tokens(t.ep, p.appended);
  append_model_tokens(t.ep, out);
  t.ep.end = out.finish_reason == "length" ? episode_end::length : episode_end::done;
}

expected<agent_book::chat_answer> agent_book::record_chat(const std::string& episode,
                                                          const agent_prompt& p,
                                                          const inference::sample_output& out,
                                                          const json& messages) {
  const auto& tok = enc_.tokenizer();
  auto eos = tok.eos_id();
  auto end = eos ? std::find(out.tokens.begin(), out.tokens.end(), *eos) : out.tokens.end();
  std::vector<int64_t> cut(out.tokens.begin(), end);
  auto text = tok.decode(cut, {.skip_special_tokens = true});
  auto raw = tok.decode(cut, {.skip_special_tokens = false});
  if (!text || !raw)
    return text ? raw.error() : text.error();
  chat_answer a;
  a.message = {{"role", "assistant"}, {"content", runtime::valid_utf8(*text)}};
  std::vector<models::tool_call> calls;
  if (p.tools) {
    auto parsed = models::parse_tool_calls(runtime::valid_utf8(*raw), format_);
    calls = std::move(parsed.calls);
    if (!calls.empty()) {
      a.message["content"] = parsed.content.empty() ? json(nullptr) : json(parsed.content);
      auto list = json::array();
      for (size_t i = 0; i < calls.size(); ++i)
        list.push_back({{"id", "call_" + std::to_string(i + 1)},
                        {"type", "function"},
                        {"function",
                         {{"name", calls[i].name},
                          {"arguments", calls[i].arguments.dump(
                                            -1, ' ', false, json::error_handler_t::replace)}}}});
      a.message["tool_calls"] = std::move(list);
    }
  }
  a.finish_reason = out.finish_reason == "length" ? "length"
                    : calls.empty()               ? "stop"
                                                  : "tool_calls";
  std::lock_guard lock{mu_};
  auto& t = trajectory_for(episode, p);
  append(t, p, out);
  t.ep.tool_turns += calls.empty() ? 0 : 1;
  t.ep.tool_calls += static_cast<int32_t>(calls.size());
  const auto turn = t.ep.turns;
  for (size_t i = p.extends ? t.messages.size() : 0; i < messages.size(); ++i) {
    json m{{"role", messages[i].value("role", "")}, {"content", message_text(messages[i])}};
    if (turn > 1)
      m["turn"] = turn - 1;
    t.ep.transcript.push_back(std::move(m));
  }
  t.ep.transcript.push_back(
      {{"role", "assistant"},
       {"content", a.message["content"].is_string() ? a.message["content"].get<std::string>()
                                                    : runtime::valid_utf8(*raw)},
       {"turn", turn}});
  t.messages = messages;
  t.messages.push_back(a.message);
  return a;
}

expected<std::string> agent_book::record_text(const std::string& episode, const agent_prompt& p,
                                              const inference::sample_output& out,
                                              const std::string& prompt) {
  auto text = enc_.tokenizer().decode(out.tokens, {.skip_special_tokens = true});
  if (!text)
    return text.error();
  auto answer = runtime::valid_utf8(*text);
  std::lock_guard lock{mu_};
  auto& t = trajectory_for(episode, p);
  append(t, p, out);
  t.text = prompt + answer;
  t.ep.transcript.push_back({{"role", "assistant"}, {"content", answer}, {"turn", t.ep.turns}});
  return answer;
}

expected<void> agent_book::set_reward(const std::string& episode, double reward) {
  std::lock_guard lock{mu_};
  if (auto ok = admitted(episode); !ok)
    return ok;
  auto& st = episodes_[episode];
  if (st.reward)
    return make_error(errc::invalid_argument,
                      "episode '" + episode + "': its reward is set already");
  st.reward = reward;
  return {};
}

bool agent_book::rewarded(const std::string& episode) const {
  std::lock_guard lock{mu_};
  auto it = episodes_.find(episode);
  return it != episodes_.end() && it->second.reward.has_value();
}

std::optional<agent_episode> agent_book::take(const std::string& episode) {
  std::lock_guard lock{mu_};
  auto it = episodes_.find(episode);
  if (it == episodes_.end() || it->second.trajectories.empty())
    return std::nullopt;
  agent_episode out;
  out.id = episode;
  out.reward = it->second.reward;
  for (auto& t : it->second.trajectories) {
    t.ep.reward = out.reward.value_or(0.0);
    out.trajectories.push_back(std::move(t.ep));
  }
  episodes_.erase(it);
  return out;
}

int64_t agent_book::history_rewrites() const {
  std::lock_guard lock{mu_};
  return rewrites_;
}

} // namespace troupe::actors::rl
