// Fuzz target: the OpenAI-compatible endpoint (NOTE [agent gateway],
// [agent book]) — what agent code, or anything that reaches its port,
// sends. A real gateway on an ephemeral loopback port serves a real rollout
// actor (a tiny random Llama over the byte tokenizer) and a book opened for
// two episodes with a bound on calls, as a job's iteration has it.
//
// Input: byte 0 picks the route (mod 8: chat/completions by the episode's
// base URL, by X-Troupe-Episode, without an episode; completions by base
// URL; a reward under the base URL and at /v1/episodes/<id>/reward; the
// models list; chat/completions of an episode not opened), byte 1 the key
// (odd: the right one, even: a wrong one, 0: none); the rest is the body as
// sent.
// Invariants: every request is answered; without the key with 401, never
// 2xx; a status is one of 200, 400, 401, 404, 409, 429 and 503, never a
// 500; an error's body is OpenAI's {"error": {"message", "type", "param",
// "code"}}; a 200 to a call that is not streamed is a JSON object; the
// gateway answers the next request.
#include "actors/actor_system.hpp"
#include "actors/inference/rollout.hpp"
#include "actors/rl/agent_book.hpp"
#include "cluster/agent_gateway.hpp"
#include "models/llama.hpp"
#include "models/tokenizer.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <caf/all.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <memory>
#include <string>

using namespace troupe;

namespace {

const std::string key = "fuzz-key";

struct gateway_fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  actors::inference::rollout_actor rollout;
  std::shared_ptr<actors::rl::agent_book> book;
  std::unique_ptr<cluster::agent_gateway> gateway;

  static gateway_fixture& get() {
    static auto* f = new gateway_fixture(); // lives for the process
    return *f;
  }

  gateway_fixture() {
    actors::configure(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
    auto tok = std::make_shared<models::byte_tokenizer>();
    models::llama_config c;
    c.vocab_size = tok->vocab_size();
    c.hidden_size = 32;
    c.intermediate_size = 64;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.max_position_embeddings = 512;
    c.eos_token_ids = {models::byte_tokenizer::eos_token};
    torch::manual_seed(3);
    auto m = models::make_llama(c, models::head_kind::lm);
    if (!m)
      fuzz::broken("the model");
    (*m)->eval();
    actors::inference::engine_config ec;
    ec.num_blocks = 256;
    ec.block_size = 4;
    auto r = actors::inference::spawn_rollout(*sys, *m, ec);
    if (!r)
      fuzz::broken("the rollout");
    rollout = *r;
    book = std::make_shared<actors::rl::agent_book>(actors::rl::prompt_encoder{tok, false},
                                                    models::tool_call_format::hermes);
    book->open({"ep-1", "ep-2"}, 1000000);
    cluster::gateway_options o;
    o.key = key;
    o.defaults.max_tokens = 4;
    o.max_context = 512;
    o.threads = 2;
    auto g = cluster::agent_gateway::start(*sys, rollout, book, o);
    if (!g)
      fuzz::broken("the gateway");
    gateway = std::move(*g);
  }
};

bool openai_error(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_object())
    return false;
  const auto& e = j["error"];
  return e.contains("message") && e["message"].is_string() && e.contains("type") &&
         e.contains("param") && e.contains("code");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2)
    return 0;
  auto& f = gateway_fixture::get();
  const auto route = data[0] % 8;
  const auto key_byte = data[1];
  const std::string body{fuzz::text_of(data + 2, size - 2)};
  httplib::Headers h;
  if (key_byte != 0)
    h.emplace("Authorization", "Bearer " + (key_byte % 2 ? key : std::string{"wrong"}));
  std::string path;
  switch (route) {
  case 0:
    path = "/e/ep-1/v1/chat/completions";
    break;
  case 1:
    path = "/v1/chat/completions";
    h.emplace("X-Troupe-Episode", "ep-2");
    break;
  case 2:
    path = "/v1/chat/completions";
    break;
  case 3:
    path = "/e/ep-2/v1/completions";
    break;
  case 4:
    path = "/e/ep-1/v1/episodes/ep-1/reward";
    break;
  case 5:
    path = "/v1/episodes/ep-2/reward";
    break;
  case 6:
    path = "/v1/models";
    break;
  default:
    path = "/e/ep-9/v1/chat/completions";
    break;
  }
  httplib::Client cli{"127.0.0.1", f.gateway->port()};
  cli.set_read_timeout(60, 0);
  auto res = route == 6 ? cli.Get(path, h) : cli.Post(path, h, body, "application/json");
  if (!res)
    fuzz::broken("no answer");
  const int s = res->status;
  if (s != 200 && s != 400 && s != 401 && s != 404 && s != 409 && s != 429 && s != 503)
    fuzz::broken("an unexpected status");
  if (key_byte % 2 == 0 && s != 401)
    fuzz::broken("a call without the key was not refused");
  if (s != 200 && !openai_error(res->body))
    fuzz::broken("an error not in OpenAI's form");
  const bool streamed = res->get_header_value("Content-Type").find("text/event-stream") == 0;
  if (s == 200 && !streamed && !nlohmann::json::parse(res->body, nullptr, false).is_object())
    fuzz::broken("a 200 that is not a JSON object");
  auto alive = cli.Get("/v1/models", httplib::Headers{{"Authorization", "Bearer " + key}});
  if (!alive || alive->status != 200)
    fuzz::broken("the gateway stopped answering");
  return 0;
}
