#pragma once
// What agent code did through the OpenAI-compatible endpoint
// (cluster/agent_gateway.hpp), episode by episode, as token ids.
//
// NOTE [agent book]: the OpenAI API is stateless — every call resends the
// conversation — but training needs the exact tokens the engine sampled.
// So each episode keeps its current trajectory: the token sequence so far
// (first prompt, then completions and the rendered messages between them)
// and the conversation it stands for (the messages of the last call plus the
// assistant message answered). A call whose messages extend that
// conversation — the same messages, the answered assistant message, then new
// ones (tool results, a user turn) — is that trajectory's next turn: its
// prompt is the trajectory's tokens plus the new messages rendered as an
// observation (render_observation: once, with the chat template's role
// markers), and nothing earlier is rendered or tokenised again. A call
// whose messages do not (the agent rewrote or dropped history) starts a new
// trajectory of the same episode, and counts in history_rewrites(). For the
// completions API the same holds with text: a prompt that begins with the
// trajectory's text (the last prompt and its completion) extends it by the
// rest, tokenised once. Each trajectory's tokens carry a loss mask that is 1
// on completions only, and the engine's log-probs and weight versions.
// An episode's calls are sequential (an agent loop); its reward is set once
// (the environment's, or POST /v1/episodes/{id}/reward). A job's book is
// opened per iteration with its episodes (open): calls and rewards of any
// other episode are refused (not_found), and so is an episode's call past
// max_calls (out_of_range), so a runaway agent cannot grow it without end.

#include "actors/inference/engine.hpp"
#include "actors/rl/data.hpp"
#include "actors/rl/episodes.hpp"
#include "models/tool_calls.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace troupe::actors::rl {

/// A call's prompt, and what recording its answer needs.
struct agent_prompt {
  std::vector<int64_t> ids;
  /// Extends the episode's trajectory (else starts one).
  bool extends = false;
  /// The tokens this call adds to the trajectory before the completion
  /// (the rendered new messages; the whole prompt for a new trajectory).
  std::vector<int64_t> appended;
  /// The call offered tools: the answer's tool calls are read.
  bool tools = false;
};

/// An episode's trajectories and reward, taken for training.
struct agent_episode {
  std::string id;
  /// Each as an episode (prompt, tokens, loss mask, log-probs, versions,
  /// turns, transcript); the last is the current one.
  std::vector<episode> trajectories;
  std::optional<double> reward;
};

class agent_book {
public:
  agent_book(prompt_encoder enc, models::tool_call_format format)
      : enc_(std::move(enc)), format_(format) {}

  /// Admits only `episodes` from now on (forgetting what was recorded),
  /// each for `max_calls` calls at most (0 = no bound).
  void open(const std::vector<std::string>& episodes, int64_t max_calls);

  /// The prompt of a chat call of `episode` with `messages` and `tools`
  /// (OpenAI's formats): its trajectory extended, or a new one.
  expected<agent_prompt> chat_prompt(const std::string& episode,
                                     const nlohmann::ordered_json& messages,
                                     const nlohmann::ordered_json& tools);
  /// The prompt of a completions call: text, extending the trajectory when
  /// it begins with the trajectory's text.
  expected<agent_prompt> text_prompt(const std::string& episode, const std::string& text);

  /// Records the engine's answer to a chat call (`p` from chat_prompt, its
  /// `messages`); answers the assistant message in OpenAI's format (content
  /// and tool_calls read in the book's format) and the finish reason.
  struct chat_answer {
    nlohmann::ordered_json message;
    std::string finish_reason;
  };
  expected<chat_answer> record_chat(const std::string& episode, const agent_prompt& p,
                                    const inference::sample_output& out,
                                    const nlohmann::ordered_json& messages);
  /// Records the answer to a completions call; answers its text.
  expected<std::string> record_text(const std::string& episode, const agent_prompt& p,
                                    const inference::sample_output& out, const std::string& prompt);

  /// Sets the episode's reward (once; an unknown episode is opened).
  expected<void> set_reward(const std::string& episode, double reward);
  /// Whether an episode has its reward.
  bool rewarded(const std::string& episode) const;
  /// Takes (and forgets) an episode; nullopt when it made no call.
  std::optional<agent_episode> take(const std::string& episode);
  /// Episodes whose calls started a new trajectory, so far.
  int64_t history_rewrites() const;
  const prompt_encoder& encoder() const { return enc_; }

private:
  struct trajectory {
    episode ep;
    /// The conversation it stands for (chat), or its text (completions).
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    std::string text;
  };
  struct state {
    std::vector<trajectory> trajectories;
    std::optional<double> reward;
    int64_t calls = 0;
  };
  /// A call of `episode` may go on (counted; under the lock): the
  /// episode's current trajectory, null before its first call.
  expected<const trajectory*> admit_call(const std::string& episode);
  /// What a trajectory has served so far: its prompt and completions.
  static std::vector<int64_t> served(const trajectory& t);
  /// The episode is one of the opened ones (under the lock).
  expected<void> admitted(const std::string& episode) const;
  trajectory& trajectory_for(const std::string& episode, const agent_prompt& p);
  void append(trajectory& t, const agent_prompt& p, const inference::sample_output& out);

  prompt_encoder enc_;
  models::tool_call_format format_;
  mutable std::mutex mu_;
  std::map<std::string, state> episodes_;
  int64_t rewrites_ = 0;
  /// Set by open: the episodes admitted, and their calls at most.
  std::optional<std::set<std::string>> open_;
  int64_t max_calls_ = 0;
};

} // namespace troupe::actors::rl
