#pragma once
// Chat templates: the Jinja program a model ships in tokenizer_config.json
// ("chat_template") that spells a conversation as the text the model was
// trained on.
//
// NOTE [chat template engine]: a Jinja2 subset written for chat templates,
// byte-equal to what Hugging Face transformers renders. The reference is
// Python's jinja2 (3.1) configured as transformers' _compile_jinja_template
// configures it: ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True, extensions=[loopcontrols]) plus transformers' own
// `{% generation %}` block (renders its body); the filter `tojson` replaced by
// json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False) (no HTML escaping, key order kept, Python float repr); and
// the globals raise_exception(message) and strftime_now(format) (local
// time). tests/reference/chat_template_reference.py is that configuration;
// the tests compare against it.
//
// Design: `parse` lexes (jinja2's whitespace rules: `{%- -%}`, lstrip_blocks,
// trim_blocks, one trailing newline dropped) and builds a tree once; filters
// and tests are resolved then, so a construct outside the subset is refused at
// parse time with its line ("chat_template:3: unsupported filter
// 'wordwrap'"). `render` walks the tree over Python-like values (None, bool,
// int, float, str, list, tuple, dict, jinja2's Undefined, namespaces, loop
// objects, macros): Python truthiness, str() and repr(), int/float arithmetic,
// str operations on code points, jinja2's scoping (each for-loop iteration
// and each macro call is a scope of its own; `if` is not), the sandbox's rules
// (dunder attributes and the methods that mutate a dict, or a list except
// pop/clear, are refused; range() is capped at 100000 items). Errors are
// values: the engine throws internally and converts at this API. No regex
// runs while rendering; rendering a four-turn Qwen3 conversation takes tens
// of microseconds.
//
// The full list of what is supported and refused is in
// models/chat_template_detail.hpp (NOTE [chat template subset]).

#include "runtime/error.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace troupe::models {

namespace jinja {
struct program;
} // namespace jinja

/// Bounds on one render: a hostile template fails with errc::out_of_range
/// instead of exhausting memory or time.
struct chat_template_limits {
  /// The rendered text, and any one string or list built on the way.
  size_t max_output_bytes = size_t{64} << 20;
  /// Loop iterations over the whole render.
  uint64_t max_loop_iterations = 10'000'000;
  /// Nested macro calls.
  uint32_t max_call_depth = 200;
};

/// A parsed Jinja chat template; immutable, cheap to copy, and safe to render
/// from several threads at once.
class chat_template {
public:
  /// Parses `source`. A construct outside the supported subset is an
  /// errc::unsupported error, malformed source an errc::parse_error; the
  /// message reads "<name>:<line>: <what>".
  static expected<chat_template> parse(const std::string& source,
                                       const std::string& name = "chat_template");

  /// Renders with `variables` (a JSON object: each member becomes a template
  /// variable). Failures name the line: raise_exception's message verbatim
  /// and template errors (undefined attribute of an undefined value, type
  /// errors, a filter named at run time that does not exist) are
  /// errc::invalid_argument, a Python feature outside the subset met at run
  /// time errc::unsupported, a limit exceeded errc::out_of_range.
  expected<std::string> render(const nlohmann::ordered_json& variables,
                               const chat_template_limits& limits = {}) const;

  /// The name errors carry.
  const std::string& name() const;
  /// The text it was parsed from.
  const std::string& source() const { return *source_; }

private:
  chat_template(std::shared_ptr<const jinja::program> program,
                std::shared_ptr<const std::string> source);
  std::shared_ptr<const jinja::program> program_;
  std::shared_ptr<const std::string> source_;
};

/// What transformers' apply_chat_template passes a chat template.
struct chat_render_request {
  /// The conversation: [{"role": ..., "content": ..., ...}, ...].
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  /// Tool schemas; null passes None, as transformers does without tools.
  nlohmann::ordered_json tools;
  bool add_generation_prompt = false;
  /// Special tokens from tokenizer_config.json; "" = the tokenizer has none
  /// (the variable is then not passed, as transformers' special_tokens_map
  /// leaves out unset tokens).
  std::string bos_token, eos_token;
  /// Further variables (enable_thinking, date_string, pad_token, ...); they
  /// override the ones above of the same name, as kwargs do in transformers.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

/// Renders `req` as transformers does: messages, tools (None when null),
/// documents (None), add_generation_prompt, the non-empty special tokens,
/// then `extra`.
expected<std::string> render_chat(const chat_template& t, const chat_render_request& req,
                                  const chat_template_limits& limits = {});

} // namespace troupe::models
