// The chat template API: parse once, render many (NOTE [chat template
// engine] in chat_template.hpp); engine failures become troupe errors here.
#include "models/chat_template.hpp"
#include "models/chat_template_detail.hpp"
#include "runtime/jsonl.hpp"

#include <algorithm>
#include <exception>
#include <new>
#include <utility>
#include <vector>

namespace troupe::models {

namespace {

// How deep arrays and objects nest in `j`, without recursion: at most
// runtime::max_json_depth + 1 (it stops counting there).
int json_depth(const nlohmann::ordered_json& j) {
  int deepest = 0;
  std::vector<std::pair<const nlohmann::ordered_json*, int>> todo{{&j, 0}};
  while (!todo.empty()) {
    auto [v, d] = todo.back();
    todo.pop_back();
    if (!v->is_structured())
      continue;
    deepest = std::max(deepest, d + 1);
    if (deepest > runtime::max_json_depth)
      return deepest;
    for (const auto& e : *v)
      todo.push_back({&e, d + 1});
  }
  return deepest;
}

caf::error to_error(const jinja::failure& f, const std::string& name) {
  std::string where = f.line > 0 ? name + ":" + std::to_string(f.line) : name;
  return make_error(f.code, where + ": " + f.message);
}

/// The globals each symbol resolves to when no scope defines it.
void resolve_globals(jinja::program& p) {
  p.globals.resize(p.symbols.size());
  for (size_t i = 0; i < p.symbols.size(); ++i)
    p.globals[i] = jinja::find_global(p.symbols[i]);
  auto loop = p.symbol_ids.find("loop");
  p.loop_symbol = loop == p.symbol_ids.end() ? -1 : loop->second;
}

} // namespace

chat_template::chat_template(std::shared_ptr<const jinja::program> program,
                             std::shared_ptr<const std::string> source)
    : program_(std::move(program)), source_(std::move(source)) {}

expected<chat_template> chat_template::parse(const std::string& source, const std::string& name) {
  try {
    auto program = jinja::parse_tokens(jinja::tokenize(source), name);
    resolve_globals(*program);
    return chat_template(std::move(program), std::make_shared<const std::string>(source));
  } catch (const jinja::failure& f) {
    return to_error(f, name);
  } catch (const std::bad_alloc&) {
    return make_error(errc::out_of_range, name + ": out of memory while parsing");
  } catch (const std::exception& e) { // a bug: still no exception crosses the API
    return make_error(errc::internal, name + ": " + e.what());
  }
}

expected<std::string> chat_template::render(const nlohmann::ordered_json& variables,
                                            const chat_template_limits& limits) const {
  if (!variables.is_object())
    return make_error(errc::invalid_argument, program_->name +
                                                  ": render variables must be a JSON object, got " +
                                                  std::string(variables.type_name()));
  try {
    jinja::renderer r(*program_, limits);
    return r.run(variables);
  } catch (const jinja::failure& f) {
    return to_error(f, program_->name);
  } catch (const std::bad_alloc&) {
    return make_error(errc::out_of_range, program_->name + ": out of memory while rendering");
  } catch (const std::exception& e) { // a bug: still no exception crosses the API
    return make_error(errc::internal, program_->name + ": " + e.what());
  }
}

const std::string& chat_template::name() const {
  return program_->name;
}

expected<std::string> render_chat(const chat_template& t, const chat_render_request& req,
                                  const chat_template_limits& limits) {
  // Copying a value recurses once a level (NOTE [json nesting]).
  for (auto [name, v] :
       {std::pair{"messages", &req.messages}, {"tools", &req.tools}, {"extra", &req.extra}})
    if (json_depth(*v) > runtime::max_json_depth)
      return make_error(errc::out_of_range, std::string{"chat_render_request."} + name +
                                                ": nests arrays and objects deeper than " +
                                                std::to_string(runtime::max_json_depth) +
                                                " levels (the limit)");
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = req.messages;
  vars["tools"] = req.tools;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = req.add_generation_prompt;
  if (!req.bos_token.empty())
    vars["bos_token"] = req.bos_token;
  if (!req.eos_token.empty())
    vars["eos_token"] = req.eos_token;
  if (!req.extra.is_null() && !req.extra.is_object())
    return make_error(errc::invalid_argument,
                      "chat_render_request.extra must be a JSON object, got " +
                          std::string(req.extra.type_name()));
  if (req.extra.is_object())
    for (const auto& [k, v] : req.extra.items())
      vars[k] = v;
  return t.render(vars, limits);
}

} // namespace troupe::models
