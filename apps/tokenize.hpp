#pragma once
// `troupe tokenize`: a model directory's tokenizer on text or ids — the tool
// to reach for when a reward, a template or a prompt looks wrong.

#include <string>

namespace troupe::apps {

struct tokenize_options {
  std::string model; ///< a directory with tokenizer.json, or the file itself
  std::string text;  ///< the input; stdin when empty and !text_given
  bool text_given = false;
  bool json = false;         ///< ids and pieces (or the decoded text) as JSON
  bool decode = false;       ///< the input is ids; print their text
  bool add_special = false;  ///< encode with the tokenizer's special tokens
  bool skip_special = false; ///< decode without special tokens
  /// A conversation (a JSON file: a list of messages, or {"messages": [...],
  /// "tools": [...]}) rendered through the model's chat template, then
  /// encoded: what the model sees.
  std::string chat;
  bool add_generation_prompt = false;
};

/// Runs the command; returns the process exit status (errors go to stderr).
int run_tokenize(const tokenize_options& options);

} // namespace troupe::apps
