#include "cluster/agent_gateway.hpp"

#include "cluster/credentials.hpp"
#include "models/tokenizer.hpp"
#include "runtime/jsonl.hpp"
#include "runtime/utf8.hpp"

#include <caf/all.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <regex>
#include <thread>
#include <variant>

// NOTE [agent gateway] in agent_gateway.hpp.
namespace troupe::cluster {

namespace {

using json = nlohmann::ordered_json;
namespace inf = actors::inference;

constexpr size_t max_body = 4 << 20;
constexpr size_t max_messages = 4096;
const std::regex episode_id{R"([A-Za-z0-9_.:-]{1,128})"};

// An error in OpenAI's form.
void reply_error(httplib::Response& res, int status, const std::string& message,
                 const std::string& param = "", const std::string& code = "") {
  const char* type = status == 401   ? "authentication_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  json e{{"error",
          {{"message", message},
           {"type", type},
           {"param", param.empty() ? json(nullptr) : json(param)},
           {"code", code.empty() ? json(nullptr) : json(code)}}}};
  res.status = status;
  res.set_content(e.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// The book's refusal of a call as an answer: an episode not of this
// iteration (404), one past its calls (429), else the request's `param`.
void reply_book_error(httplib::Response& res, const caf::error& err, const std::string& param,
                      int status = 400, const std::string& code = "") {
  switch (code_of(err)) {
  case errc::not_found:
    return reply_error(res, 404, context_of(err), "", "unknown_episode");
  case errc::out_of_range:
    return reply_error(res, 429, context_of(err), "", "too_many_calls");
  default:
    return reply_error(res, status, context_of(err), param, code);
  }
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A call's fields that are not the messages or prompt: what sampling it
// asks for, and how to answer.
struct call_options {
  inf::sampling_params sampling;
  bool stream = false;
  bool logprobs = false;
};

// A field error: the message and the parameter it is about.
struct field_error {
  std::string message, param;
};

std::optional<field_error> number_in(const json& body, const char* key, double lo, double hi,
                                     bool lo_open, double& out) {
  if (!body.contains(key) || body[key].is_null())
    return std::nullopt;
  const auto& v = body[key];
  if (!v.is_number())
    return field_error{std::string{key} + ": a number is needed", key};
  double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
    return field_error{std::string{key} + ": must be in " + (lo_open ? "(" : "[") +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]",
                       key};
  out = x;
  return std::nullopt;
}

std::optional<field_error> integer_in(const json& body, const char* key, int64_t lo, int64_t hi,
                                      int64_t& out) {
  if (!body.contains(key) || body[key].is_null())
    return std::nullopt;
  const auto& v = body[key];
  if (!v.is_number_integer())
    return field_error{std::string{key} + ": an integer is needed", key};
  auto x = v.get<int64_t>();
  if (x < lo || x > hi)
    return field_error{std::string{key} + ": must be in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]",
                       key};
  out = x;
  return std::nullopt;
}

std::optional<field_error> flag_in(const json& body, const char* key, bool& out) {
  if (!body.contains(key) || body[key].is_null())
    return std::nullopt;
  if (!body[key].is_boolean())
    return field_error{std::string{key} + ": true or false is needed", key};
  out = body[key].get<bool>();
  return std::nullopt;
}

// The call's options over the gateway's defaults (NOTE [agent gateway]).
std::variant<call_options, field_error> options_of(const json& body,
                                                   const inf::sampling_params& defaults) {
  call_options o;
  o.sampling = defaults;
  o.sampling.n = 1;
  o.sampling.seed.reset();
  int64_t n = 1, max_tokens = defaults.max_tokens, seed = -1, top_k = defaults.top_k;
  for (auto e : {number_in(body, "temperature", 0, 2, false, o.sampling.temperature),
                 number_in(body, "top_p", 0, 1, true, o.sampling.top_p),
                 integer_in(body, "top_k", 0, 1 << 20, top_k), integer_in(body, "n", 1, 1, n),
                 integer_in(body, "max_tokens", 1, std::numeric_limits<int32_t>::max(), max_tokens),
                 integer_in(body, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max(),
                            max_tokens),
                 integer_in(body, "seed", 0, std::numeric_limits<int64_t>::max(), seed),
                 flag_in(body, "stream", o.stream)})
    if (e)
      return *e;
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    // chat: true/false; completions: a number of alternatives (0-5).
    if (body["logprobs"].is_boolean())
      o.logprobs = body["logprobs"].get<bool>();
    else if (body["logprobs"].is_number_integer())
      o.logprobs = body["logprobs"].get<int64_t>() >= 0;
    else
      return field_error{"logprobs: true/false or a count is needed", "logprobs"};
  }
  if (body.contains("stop") && !body["stop"].is_null() &&
      !(body["stop"].is_array() && body["stop"].empty()))
    return field_error{"stop: stop sequences are not supported (the model's end-of-turn token "
                       "ends a completion)",
                       "stop"};
  o.sampling.top_k = top_k;
  o.sampling.max_tokens = std::min(max_tokens, defaults.max_tokens);
  if (seed >= 0)
    o.sampling.seed = static_cast<uint64_t>(seed);
  return o;
}

std::string sse(const json& chunk) {
  return "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

} // namespace

struct agent_gateway::impl {
  impl(caf::actor_system& s, inf::rollout_actor r, std::shared_ptr<actors::rl::agent_book> b,
       gateway_options o)
      : sys(s), rollout(std::move(r)), book(std::move(b)), opt(std::move(o)) {}

  caf::actor_system& sys;
  inf::rollout_actor rollout;
  std::shared_ptr<actors::rl::agent_book> book;
  gateway_options opt;
  std::unique_ptr<httplib::Server> server;
  std::thread thread;
  std::string host;
  int port = -1;
  bool tls = false;
  std::atomic<int64_t> calls{0};

  bool authorized(const httplib::Request& req, httplib::Response& res) const {
    const std::string bearer = "Bearer ";
    auto auth = req.get_header_value("Authorization");
    if (auth.rfind(bearer, 0) == 0 &&
        same_secret(std::string_view{auth}.substr(bearer.size()), opt.key))
      return true;
    reply_error(res, 401, "send the API key as 'Authorization: Bearer <key>'", "",
                "invalid_api_key");
    return false;
  }

  // The call's episode: its path's (/e/<id>/v1/...) or X-Troupe-Episode.
  std::optional<std::string> episode_of(const httplib::Request& req, httplib::Response& res,
                                        const std::string& from_path) const {
    auto id = from_path.empty() ? req.get_header_value("X-Troupe-Episode") : from_path;
    if (id.empty()) {
      reply_error(res, 400,
                  "no episode: call through the base URL the driver gave (/e/<episode>/v1) or "
                  "send X-Troupe-Episode",
                  "", "missing_episode");
      return std::nullopt;
    }
    if (!std::regex_match(id, episode_id)) {
      reply_error(res, 400, "episode: 1 to 128 letters, digits and _ . : - are allowed", "",
                  "invalid_episode");
      return std::nullopt;
    }
    return id;
  }

  std::optional<json> body_of(const httplib::Request& req, httplib::Response& res) const {
    if (auto at = runtime::json_too_deep_at(req.body); at != std::string_view::npos) {
      reply_error(res, 400,
                  "body: JSON nested deeper than " + std::to_string(runtime::max_json_depth) +
                      " levels at byte " + std::to_string(at));
      return std::nullopt;
    }
    auto body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      reply_error(res, 400, "body: a JSON object is needed");
      return std::nullopt;
    }
    return body;
  }

  // The engine's completion of `prompt`, named for the episode.
  expected<inf::sample_output> generate(const std::string& episode, int64_t call,
                                        std::vector<int64_t> prompt,
                                        const inf::sampling_params& sampling) {
    inf::generate_request q;
    q.id = "agent/" + episode + "/" + std::to_string(call);
    q.prompt = std::move(prompt);
    q.sampling = sampling;
    caf::scoped_actor self{sys};
    expected<inf::sample_output> out = make_error(errc::internal, "no reply");
    self->request(rollout,
                  std::chrono::milliseconds(static_cast<int64_t>(opt.generate_timeout_s * 1000)),
                  inf::generate_atom::value, std::vector{std::move(q)})
        .receive(
            [&](inf::generation& g) {
              if (g.outputs.size() == 1 && g.outputs[0].samples.size() == 1)
                out = std::move(g.outputs[0].samples[0]);
              else
                out = make_error(errc::internal, "rollout: an answer of another shape");
            },
            [&](caf::error& e) { out = with_prefix(e, "rollout"); });
    return out;
  }

  // Fits the completion into the context; false (answered) when the
  // prompt alone does not fit.
  bool fit(std::vector<int64_t>& prompt, inf::sampling_params& s, httplib::Response& res) const {
    const auto room = opt.max_context - static_cast<int64_t>(prompt.size());
    if (room < 1) {
      reply_error(res, 400,
                  "the prompt is " + std::to_string(prompt.size()) + " tokens: the context is " +
                      std::to_string(opt.max_context),
                  "messages", "context_length_exceeded");
      return false;
    }
    s.max_tokens = std::min(s.max_tokens, room);
    return true;
  }

  json logprobs_of(const inf::sample_output& out) const {
    const auto& tok = book->encoder().tokenizer();
    auto content = json::array();
    for (size_t i = 0; i < out.tokens.size(); ++i) {
      auto piece = tok.decode({out.tokens[i]});
      content.push_back({{"token", runtime::valid_utf8(piece ? *piece : "")},
                         {"logprob", i < out.logprobs.size() ? out.logprobs[i] : 0.0f},
                         {"bytes", nullptr}});
    }
    return {{"content", std::move(content)}};
  }

  // What every call does first: the key, its episode, its body and
  // options; nullopt once an error is answered.
  struct call_state {
    std::string episode;
    json body;
    call_options options;
    int64_t number = 0;
  };
  std::optional<call_state> begin_call(const httplib::Request& req, httplib::Response& res,
                                       const std::string& path_episode) const {
    if (!authorized(req, res))
      return std::nullopt;
    auto episode = episode_of(req, res, path_episode);
    auto body = episode ? body_of(req, res) : std::nullopt;
    if (!body)
      return std::nullopt;
    auto parsed = options_of(*body, opt.defaults);
    if (auto* e = std::get_if<field_error>(&parsed)) {
      reply_error(res, 400, e->message, e->param);
      return std::nullopt;
    }
    return call_state{*episode, std::move(*body), std::get<call_options>(parsed)};
  }

  // The completion of the call's prompt; nullopt once an error is answered.
  std::optional<inf::sample_output> complete(call_state& c, const actors::rl::agent_prompt& p,
                                             httplib::Response& res) {
    auto ids = p.ids;
    if (!fit(ids, c.options.sampling, res))
      return std::nullopt;
    c.number = ++calls;
    auto out = generate(c.episode, c.number, std::move(ids), c.options.sampling);
    if (!out) {
      reply_error(res, 503, describe(out.error()), "", "rollout_unavailable");
      return std::nullopt;
    }
    return std::move(*out);
  }

  void chat(const httplib::Request& req, httplib::Response& res, const std::string& path_episode) {
    auto c = begin_call(req, res, path_episode);
    if (!c)
      return;
    const auto& o = c->options;
    const json messages = c->body.value("messages", json());
    if (messages.is_array() && messages.size() > max_messages)
      return reply_error(res, 400, "messages: more than " + std::to_string(max_messages),
                         "messages");
    const json tools = c->body.value("tools", json());
    auto p = book->chat_prompt(c->episode, messages, tools);
    if (!p)
      return reply_book_error(res, p.error(), "messages");
    auto out = complete(*c, *p, res);
    if (!out)
      return;
    const auto& episode = c->episode;
    auto a = book->record_chat(episode, *p, *out, messages);
    if (!a)
      return reply_error(res, 500, describe(a.error()));
    const auto id = "chatcmpl-" + std::to_string(c->number);
    const auto created = unix_seconds();
    json usage{{"prompt_tokens", p->ids.size()},
               {"completion_tokens", out->tokens.size()},
               {"total_tokens", p->ids.size() + out->tokens.size()}};
    if (!o.stream) {
      json choice{{"index", 0},
                  {"message", a->message},
                  {"logprobs", nullptr},
                  {"finish_reason", a->finish_reason}};
      if (o.logprobs)
        choice["logprobs"] = logprobs_of(*out);
      json reply{{"id", id},           {"object", "chat.completion"},      {"created", created},
                 {"model", opt.model}, {"choices", json::array({choice})}, {"usage", usage}};
      return res.set_content(reply.dump(-1, ' ', false, json::error_handler_t::replace),
                             "application/json");
    }
    auto chunk = [&](json delta, json finish) {
      json c{{"id", id},
             {"object", "chat.completion.chunk"},
             {"created", created},
             {"model", opt.model},
             {"choices", json::array({{{"index", 0},
                                       {"delta", std::move(delta)},
                                       {"logprobs", nullptr},
                                       {"finish_reason", std::move(finish)}}})}};
      return sse(c);
    };
    std::string stream =
        chunk({{"role", "assistant"}, {"content", a->message["content"]}}, nullptr);
    if (a->message.contains("tool_calls")) {
      auto calls_delta = json::array();
      int index = 0;
      for (auto c : a->message["tool_calls"]) {
        c["index"] = index++;
        calls_delta.push_back(std::move(c));
      }
      stream += chunk({{"tool_calls", std::move(calls_delta)}}, nullptr);
    }
    stream += chunk(json::object(), a->finish_reason);
    stream += "data: [DONE]\n\n";
    res.set_content(stream, "text/event-stream");
  }

  void completions(const httplib::Request& req, httplib::Response& res,
                   const std::string& path_episode) {
    auto c = begin_call(req, res, path_episode);
    if (!c)
      return;
    const auto& o = c->options;
    if (!c->body.contains("prompt") || !c->body["prompt"].is_string())
      return reply_error(res, 400, "prompt: a string is needed", "prompt");
    const auto prompt = c->body["prompt"].get<std::string>();
    auto p = book->text_prompt(c->episode, prompt);
    if (!p)
      return reply_book_error(res, p.error(), "prompt");
    auto out = complete(*c, *p, res);
    if (!out)
      return;
    auto text = book->record_text(c->episode, *p, *out, prompt);
    if (!text)
      return reply_error(res, 500, describe(text.error()));
    const auto id = "cmpl-" + std::to_string(c->number);
    const auto created = unix_seconds();
    const std::string finish = out->finish_reason == "length" ? "length" : "stop";
    json logprobs = nullptr;
    if (o.logprobs) {
      auto lp = logprobs_of(*out);
      json tokens = json::array(), values = json::array();
      for (const auto& c : lp["content"]) {
        tokens.push_back(c["token"]);
        values.push_back(c["logprob"]);
      }
      logprobs = {{"tokens", tokens}, {"token_logprobs", values}};
    }
    json usage{{"prompt_tokens", p->ids.size()},
               {"completion_tokens", out->tokens.size()},
               {"total_tokens", p->ids.size() + out->tokens.size()}};
    auto reply = [&](const std::string& t, json fin) {
      return json{{"id", id},
                  {"object", "text_completion"},
                  {"created", created},
                  {"model", opt.model},
                  {"choices", json::array({{{"text", t},
                                            {"index", 0},
                                            {"logprobs", logprobs},
                                            {"finish_reason", std::move(fin)}}})}};
    };
    if (!o.stream) {
      auto r = reply(*text, finish);
      r["usage"] = usage;
      return res.set_content(r.dump(-1, ' ', false, json::error_handler_t::replace),
                             "application/json");
    }
    res.set_content(sse(reply(*text, nullptr)) + sse(reply("", finish)) + "data: [DONE]\n\n",
                    "text/event-stream");
  }

  void reward(const httplib::Request& req, httplib::Response& res, const std::string& episode) {
    if (!authorized(req, res))
      return;
    auto body = body_of(req, res);
    if (!body)
      return;
    double r = 0;
    if (!body->contains("reward"))
      return reply_error(res, 400, "reward: a number is needed", "reward");
    if (auto e = number_in(*body, "reward", -std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::max(), false, r))
      return reply_error(res, 400, e->message, e->param);
    if (auto ok = book->set_reward(episode, r); !ok)
      return reply_book_error(res, ok.error(), "reward", 409, "reward_already_set");
    res.set_content(json{{"episode", episode}, {"reward", r}}.dump(), "application/json");
  }

  void models(const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res))
      return;
    json list{
        {"object", "list"},
        {"data",
         json::array(
             {{{"id", opt.model}, {"object", "model"}, {"created", 0}, {"owned_by", "troupe"}}})}};
    res.set_content(list.dump(), "application/json");
  }

  void routes() {
    auto& s = *server;
    const std::string ep = R"(/e/([A-Za-z0-9_.:-]{1,128}))";
    s.Post("/v1/chat/completions",
           [this](const httplib::Request& q, httplib::Response& r) { chat(q, r, ""); });
    s.Post(ep + "/v1/chat/completions",
           [this](const httplib::Request& q, httplib::Response& r) { chat(q, r, q.matches[1]); });
    s.Post("/v1/completions",
           [this](const httplib::Request& q, httplib::Response& r) { completions(q, r, ""); });
    s.Post(ep + "/v1/completions", [this](const httplib::Request& q, httplib::Response& r) {
      completions(q, r, q.matches[1]);
    });
    const std::string reward_of = R"(/v1/episodes/([A-Za-z0-9_.:-]{1,128})/reward)";
    s.Post(reward_of,
           [this](const httplib::Request& q, httplib::Response& r) { reward(q, r, q.matches[1]); });
    // Under an episode's base URL: that episode's reward only.
    s.Post(ep + reward_of, [this](const httplib::Request& q, httplib::Response& r) {
      if (q.matches[1] != q.matches[2])
        return reply_error(r, 400,
                           "the base URL of episode '" + std::string{q.matches[1]} +
                               "' sets only its own reward",
                           "", "invalid_episode");
      reward(q, r, q.matches[2]);
    });
    s.Get("/v1/models", [this](const httplib::Request& q, httplib::Response& r) { models(q, r); });
    s.Get(ep + "/v1/models",
          [this](const httplib::Request& q, httplib::Response& r) { models(q, r); });
  }

  void configure() {
    auto& s = *server;
    s.new_task_queue = [n = opt.threads] {
      return new httplib::ThreadPool(static_cast<size_t>(n));
    };
    s.set_payload_max_length(max_body);
    s.set_read_timeout(30, 0);
    s.set_write_timeout(30, 0);
    s.set_default_headers({{"X-Content-Type-Options", "nosniff"}});
    s.set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr) {
      reply_error(r, 500, "internal error");
    });
    s.set_error_handler([](const httplib::Request&, httplib::Response& r) {
      if (r.body.empty())
        reply_error(r, r.status, r.status == 404 ? "no such endpoint" : "refused");
    });
    routes();
  }
};

expected<std::unique_ptr<agent_gateway>>
agent_gateway::start(caf::actor_system& sys, inf::rollout_actor rollout,
                     std::shared_ptr<actors::rl::agent_book> book, const gateway_options& o) {
  if (o.key.empty())
    return make_error(errc::invalid_argument, "agent gateway: an API key is needed");
  if (!book)
    return make_error(errc::invalid_argument, "agent gateway: no agent book");
  auto addr = parse_listen_address(o.listen);
  if (!addr)
    return with_prefix(addr.error(), "agent gateway listen");
  auto [host, port] = *addr;
  if (!is_loopback_host(host) && !o.tls.enabled())
    return make_error(errc::invalid_argument,
                      "agent gateway listen " + o.listen +
                          ": refusing to serve a non-loopback address without TLS (cert and key)");
  std::unique_ptr<agent_gateway> g{new agent_gateway};
  g->impl_ = std::make_unique<impl>(sys, std::move(rollout), std::move(book), o);
  auto& m = *g->impl_;
  m.host = host;
  if (o.tls.enabled()) {
    if (o.tls.cert_file.empty() || o.tls.key_file.empty())
      return make_error(errc::invalid_argument, "agent gateway TLS needs both cert and key");
    auto ssl =
        std::make_unique<httplib::SSLServer>(o.tls.cert_file.c_str(), o.tls.key_file.c_str());
    if (!ssl->is_valid())
      return make_error(errc::invalid_argument, "agent gateway TLS: cannot load " +
                                                    o.tls.cert_file + " / " + o.tls.key_file);
    m.server = std::move(ssl);
    m.tls = true;
  } else {
    m.server = std::make_unique<httplib::Server>();
  }
  m.configure();
  m.port = port == 0 ? m.server->bind_to_any_port(host)
                     : (m.server->bind_to_port(host, port) ? port : -1);
  if (m.port <= 0)
    return make_error(errc::unavailable, "agent gateway: cannot listen on " + o.listen);
  m.thread = std::thread([&m] { m.server->listen_after_bind(); });
  return g;
}

agent_gateway::~agent_gateway() {
  stop();
}

int agent_gateway::port() const {
  return impl_->port;
}

std::string agent_gateway::api_base() const {
  const auto& m = *impl_;
  auto host = m.host.find(':') != std::string::npos ? "[" + m.host + "]" : m.host;
  return std::string{m.tls ? "https" : "http"} + "://" + host + ":" + std::to_string(m.port) +
         "/v1";
}

std::string agent_gateway::base_url(const std::string& episode) const {
  auto root = api_base();
  return root.substr(0, root.size() - 3) + "/e/" + episode + "/v1";
}

void agent_gateway::stop() {
  if (!impl_ || !impl_->server)
    return;
  impl_->server->stop();
  if (impl_->thread.joinable())
    impl_->thread.join();
}

} // namespace troupe::cluster
