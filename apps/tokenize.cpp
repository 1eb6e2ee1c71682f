#include "apps/tokenize.hpp"

#include "models/chat_template.hpp"
#include "models/tokenizer.hpp"
#include "runtime/error.hpp"
#include "runtime/file_io.hpp"
#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>

namespace troupe::apps {

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "troupe tokenize: %s\n", what.c_str());
  return 2;
}

// Ids written as a JSON array or separated by white space and commas.
expected<std::vector<int64_t>> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    if (auto at = runtime::json_too_deep_at(text); at != std::string::npos)
      return runtime::json_too_deep("the ids", at);
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_array())
      return make_error(errc::invalid_argument, "expected a JSON array of ids");
    for (size_t i = 0; i < j.size(); ++i) {
      if (!j[i].is_number_integer())
        return make_error(errc::invalid_argument, "element " + std::to_string(i) +
                                                      ": expected an integer id, got " +
                                                      j[i].dump());
      ids.push_back(j[i].get<int64_t>());
    }
    return ids;
  }
  std::string cleaned = text;
  for (auto& c : cleaned)
    if (c == ',')
      c = ' ';
  std::istringstream in(cleaned);
  std::string word;
  while (in >> word) {
    size_t used = 0;
    int64_t id = 0;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size())
      return make_error(errc::invalid_argument, "id " + std::to_string(ids.size()) +
                                                    ": expected an integer, got '" + word + "'");
    ids.push_back(id);
  }
  return ids;
}

int encode(const models::tokenizer& tok, const tokenize_options& o, const std::string& text) {
  auto ids = tok.encode(text, {o.add_special});
  if (!o.json) {
    for (size_t i = 0; i < ids.size(); ++i)
      std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
    return 0;
  }
  nlohmann::json pieces = nlohmann::json::array();
  for (auto id : ids)
    pieces.push_back(tok.id_to_token(id).value_or(""));
  nlohmann::json out{{"ids", ids}, {"pieces", pieces}, {"count", ids.size()}};
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}

int decode(const models::tokenizer& tok, const tokenize_options& o, const std::string& text) {
  auto ids = parse_ids(text);
  if (!ids)
    return fail(context_of(ids.error()));
  auto decoded = tok.decode(*ids, {o.skip_special});
  if (!decoded)
    return fail(context_of(decoded.error()));
  if (o.json)
    std::cout << nlohmann::json{{"text", *decoded}}.dump() << "\n";
  else
    std::cout << *decoded << "\n";
  return 0;
}

// The conversation of a --chat file as a render request.
expected<models::chat_render_request> chat_request(const tokenize_options& o,
                                                   const models::tokenizer& tok) {
  auto text = runtime::read_file(o.chat);
  if (!text)
    return text.error();
  if (auto at = runtime::json_too_deep_at(*text); at != std::string::npos)
    return runtime::json_too_deep(o.chat, at);
  auto j = nlohmann::ordered_json::parse(*text, nullptr, false);
  if (j.is_discarded())
    return make_error(errc::parse_error, o.chat + ": not valid JSON");
  models::chat_render_request req;
  if (j.is_object() && j.contains("messages")) {
    req.messages = j["messages"];
    if (j.contains("tools"))
      req.tools = j["tools"];
  } else {
    req.messages = j;
  }
  if (!req.messages.is_array())
    return make_error(errc::parse_error, o.chat + ": expected a list of messages or an object "
                                                  "with \"messages\"");
  req.add_generation_prompt = o.add_generation_prompt;
  req.bos_token = tok.bos_text();
  req.eos_token = tok.eos_text();
  return req;
}

// --chat: the rendered text, then its ids (or both as JSON).
int chat(const models::tokenizer& tok, const tokenize_options& o) {
  auto t = tok.chat();
  if (!t)
    return fail(context_of(t.error()));
  auto req = chat_request(o, tok);
  if (!req)
    return fail(context_of(req.error()));
  auto text = models::render_chat(**t, *req);
  if (!text)
    return fail(context_of(text.error()));
  auto ids = tok.encode(*text);
  if (!o.json) {
    std::cout << *text << (text->empty() || text->back() != '\n' ? "\n" : "");
    for (size_t i = 0; i < ids.size(); ++i)
      std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
    return 0;
  }
  nlohmann::json out{{"text", *text}, {"ids", ids}, {"count", ids.size()}};
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}

} // namespace

int run_tokenize(const tokenize_options& o) {
  auto tok = models::load_tokenizer(o.model);
  if (!tok)
    return fail(describe(tok.error()));
  if (!o.chat.empty())
    return chat(**tok, o);
  std::string input = o.text;
  if (!o.text_given)
    input.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  return o.decode ? decode(**tok, o, input) : encode(**tok, o, input);
}

} // namespace troupe::apps
