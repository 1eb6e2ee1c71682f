#include "actors/rl/data.hpp"

#include "actors/rl/datasets.hpp"
#include "models/chat_template.hpp"
#include "models/tokenizer.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <tuple>
#include <type_traits>

namespace troupe::actors::rl {

std::vector<int64_t> batch_indices(int64_t n, uint64_t seed, int64_t start, int64_t count) {
  std::vector<int64_t> out;
  if (n <= 0)
    return out;
  out.reserve(static_cast<size_t>(count));
  int64_t epoch = -1;
  std::vector<int64_t> perm;
  for (int64_t r = start; r < start + count; ++r) {
    auto e = r / n;
    if (e != epoch) {
      epoch = e;
      perm = runtime::seeded_permutation(n, mix_seed({seed, static_cast<uint64_t>(e)}));
    }
    out.push_back(perm[static_cast<size_t>(r % n)]);
  }
  return out;
}

namespace {

// Length checks of each row kind (data_limits); true = the row fits.
struct fits {
  const data_limits& l;

  expected<int64_t> prompt(const std::string& text, const std::string& messages) const {
    return l.prompt_tokens(text, messages);
  }
  expected<bool> operator()(const example& e) const {
    auto p = prompt(e.prompt, e.messages);
    if (!p)
      return p.error();
    return *p + l.max_new_tokens <= l.context;
  }
  expected<bool> operator()(const demonstration& d) const {
    auto p = prompt(d.prompt, d.messages);
    if (!p)
      return p.error();
    return *p + l.response_tokens(d.response) <= l.context;
  }
  expected<bool> operator()(const preference_pair& pp) const {
    auto p = prompt(pp.prompt, pp.messages);
    if (!p)
      return p.error();
    return *p + std::max(l.response_tokens(pp.chosen), l.response_tokens(pp.rejected)) <= l.context;
  }
};

constexpr const char* what_rows_are(const example*) {
  return "prompts";
}
constexpr const char* what_rows_are(const demonstration*) {
  return "demonstrations";
}
constexpr const char* what_rows_are(const preference_pair*) {
  return "preference pairs";
}

// The rows of `key`'s file that fit the context; a note counts the others.
template <class Row>
expected<row_table<Row>> open_fitting(const data_config& c, const data_limits& limits,
                                      const std::string& key, const std::string& path,
                                      std::vector<std::string>& notes) {
  keep_row<Row> keep;
  if (limits.context > 0)
    keep = [f = fits{limits}](const Row& r) { return f(r); };
  int64_t dropped = 0;
  auto t = open_rows<Row>(path, c.fields, keep, &dropped);
  if (!t)
    return with_prefix(t.error(), key);
  auto kind = what_rows_are(static_cast<const Row*>(nullptr));
  auto why =
      std::is_same_v<Row, example>
          ? " (prompt + rl.generation.max_tokens " + std::to_string(limits.max_new_tokens) +
                " > the context of " + std::to_string(limits.context) + " tokens)"
          : " (prompt + response > the context of " + std::to_string(limits.context) + " tokens)";
  if (t->empty())
    return make_error(errc::invalid_argument, key + ": " + path + ": all " +
                                                  std::to_string(dropped) + " " + kind +
                                                  " are too long" + why);
  if (dropped > 0)
    notes.push_back(key + ": " + std::to_string(dropped) + " of " +
                    std::to_string(dropped + t->size()) + " " + kind + " dropped as too long" +
                    why);
  return t;
}

// eval_split: a seeded share of the train rows held out.
expected<void> split_off_eval(const data_config& c, job_data& d) {
  auto n = d.train.size();
  auto held = static_cast<int64_t>(std::llround(c.eval_split * static_cast<double>(n)));
  if (held < 1 || held >= n)
    return make_error(errc::invalid_argument,
                      "data.eval_split: " + std::to_string(c.eval_split) + " of " +
                          std::to_string(n) + " rows holds out " + std::to_string(held) +
                          ": expected at least one held-out and one training row");
  auto perm = runtime::seeded_permutation(n, mix_seed({static_cast<uint64_t>(c.seed), 3}));
  std::vector<int64_t> eval_rows(perm.begin(), perm.begin() + held);
  std::vector<int64_t> train_rows(perm.begin() + held, perm.end());
  std::sort(eval_rows.begin(), eval_rows.end());
  std::sort(train_rows.begin(), train_rows.end());
  auto eval = d.train.rows(eval_rows);
  if (!eval)
    return eval.error();
  d.eval = std::move(*eval);
  d.train = d.train.subset(std::move(train_rows));
  return {};
}

} // namespace

expected<job_data> load_job_data(const data_config& c, const data_limits& limits,
                                 data_needs needs) {
  job_data d;
  task_options to;
  to.name = c.task;
  to.min_digits = c.min_digits;
  to.max_digits = c.max_digits;
  auto t = make_task(to);
  if (!t)
    return t.error();
  auto splits = make_splits(**t, static_cast<uint64_t>(c.seed), c.train_size, c.eval_size);
  if (!splits)
    return splits.error();
  auto seed = static_cast<uint64_t>(c.seed);
  d.train = row_table<example>{splits->train};
  if (!c.train_file.empty()) {
    auto rows = open_fitting<example>(c, limits, "data.train_file", c.train_file, d.notes);
    if (!rows)
      return rows.error();
    d.train = std::move(*rows);
  }
  d.eval = splits->eval;
  if (!c.eval_file.empty()) {
    auto rows = open_fitting<example>(c, limits, "data.eval_file", c.eval_file, d.notes);
    auto all = rows ? rows->all() : expected<std::vector<example>>{rows.error()};
    if (!all)
      return all.error();
    d.eval = std::move(*all);
  } else if (c.eval_split > 0) {
    if (auto ok = split_off_eval(c, d); !ok)
      return ok.error();
  }
  // Without their files, the sft and rm stages learn from the train rows
  // (held whole: give sft_file / preference_file for large data).
  std::optional<std::vector<example>> train_rows;
  auto derived_from_train = [&]() -> expected<const std::vector<example>*> {
    if (!train_rows) {
      auto all = d.train.all();
      if (!all)
        return all.error();
      train_rows = std::move(*all);
    }
    return &*train_rows;
  };
  if (!c.sft_file.empty()) {
    auto rows = open_fitting<demonstration>(c, limits, "data.sft_file", c.sft_file, d.notes);
    if (!rows)
      return rows.error();
    d.sft = std::move(*rows);
  } else if (needs.sft) {
    auto train = derived_from_train();
    if (!train)
      return train.error();
    d.sft = row_table<demonstration>{to_demonstrations(**train)};
  }
  if (!c.preference_file.empty()) {
    auto rows = open_fitting<preference_pair>(c, limits, "data.preference_file", c.preference_file,
                                              d.notes);
    if (!rows)
      return rows.error();
    d.preferences = std::move(*rows);
  } else if (needs.rm) {
    auto train = derived_from_train();
    if (!train)
      return train.error();
    d.preferences = row_table<preference_pair>{to_preferences(**t, **train, mix_seed({seed, 1}))};
  }
  d.eval_preferences = to_preferences(**t, d.eval, mix_seed({seed, 2}));
  return d;
}

expected<std::vector<std::string>> check_data_files(const data_config& c) {
  std::vector<std::string> out;
  for (auto [key, path, use] :
       {std::tuple{"data.train_file", &c.train_file, row_use::prompts},
        {"data.eval_file", &c.eval_file, row_use::prompts},
        {"data.sft_file", &c.sft_file, row_use::demos},
        {"data.preference_file", &c.preference_file, row_use::preferences}}) {
    if (path->empty())
      continue;
    auto rows = check_rows(*path, c.fields, use);
    if (!rows)
      return with_prefix(rows.error(), key);
    out.push_back(std::string{key} + ": " + *path + ": " + std::to_string(*rows) + " rows");
  }
  return out;
}

std::vector<int64_t> encode_prompt(const models::tokenizer& tok, const std::string& prompt) {
  std::vector<int64_t> out;
  if (auto bos = tok.bos_id())
    out.push_back(*bos);
  auto ids = tok.encode(prompt);
  out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

prompt_encoder::prompt_encoder(std::shared_ptr<const models::tokenizer> tok,
                               bool template_plain_prompts)
    : tok_(std::move(tok)), template_plain_(template_plain_prompts) {}

expected<std::string> prompt_encoder::render(const std::string& messages,
                                             bool add_generation_prompt) const {
  auto chat = tok_->chat();
  if (!chat)
    return with_prefix(chat.error(), "a conversation needs the model's chat template");
  models::chat_render_request req;
  req.messages = nlohmann::ordered_json::parse(messages, nullptr, false);
  if (req.messages.is_discarded())
    return make_error(errc::parse_error, "a conversation's messages are not valid JSON");
  req.add_generation_prompt = add_generation_prompt;
  req.bos_token = tok_->bos_text();
  req.eos_token = tok_->eos_text();
  return models::render_chat(**chat, req);
}

expected<std::vector<int64_t>> prompt_encoder::prompt(const std::string& text,
                                                      const std::string& messages) const {
  if (messages.empty() && !template_plain_)
    return encode_prompt(*tok_, text);
  std::string conversation = messages;
  if (conversation.empty())
    conversation = nlohmann::ordered_json::array({{{"role", "user"}, {"content", text}}}).dump();
  auto rendered = render(conversation, true);
  if (!rendered)
    return rendered.error();
  return tok_->encode(*rendered);
}

expected<std::optional<prompt_encoder::divergence>>
prompt_encoder::divergence_of(const std::string& messages) const {
  auto all = nlohmann::ordered_json::parse(messages, nullptr, false);
  if (all.is_discarded() || !all.is_array())
    return make_error(errc::parse_error, "a conversation's messages are not a JSON list");
  auto first_n = [&](size_t n) {
    return nlohmann::ordered_json(
               std::vector<nlohmann::ordered_json>(all.begin(), all.begin() + static_cast<long>(n)))
        .dump();
  };
  auto excerpt = [](const std::string& s, size_t at) { return s.substr(at, 24); };
  // The last step's longer render, the next one's shorter unless the
  // next message is the assistant's (then rendered with the generation prompt).
  std::optional<std::string> last;
  for (size_t k = 1; k < all.size(); ++k) {
    const bool answer = all[k].is_object() && all[k].value("role", "") == "assistant";
    auto before = last && !answer ? expected<std::string>{*last} : render(first_n(k), answer);
    if (!before)
      return before.error();
    auto after = render(first_n(k + 1), false);
    if (!after)
      return after.error();
    if (after->compare(0, before->size(), *before) == 0) {
      last = std::move(*after);
      continue;
    }
    size_t byte = 0;
    while (byte < before->size() && byte < after->size() && (*before)[byte] == (*after)[byte])
      ++byte;
    return std::optional<divergence>{
        divergence{k, byte, excerpt(*before, byte), excerpt(*after, byte)}};
  }
  return std::optional<divergence>{};
}

namespace {

// The first kPrefixCheckRows rows of a table.
template <class Row>
expected<std::vector<Row>> leading_rows(const row_table<Row>& t) {
  std::vector<int64_t> idx(static_cast<size_t>(std::min<int64_t>(t.size(), kPrefixCheckRows)));
  std::iota(idx.begin(), idx.end(), int64_t{0});
  return t.rows(idx);
}

std::string conversation_of(const example& r) {
  return r.messages;
}
std::string conversation_of(const demonstration& r) {
  if (r.messages.empty())
    return {};
  auto all = nlohmann::ordered_json::parse(r.messages, nullptr, false);
  if (all.is_discarded() || !all.is_array())
    return r.messages;
  all.push_back({{"role", "assistant"}, {"content", r.response}});
  return all.dump();
}

template <class Row>
expected<void> check_rows(const prompt_encoder& enc, const std::string& key,
                          const std::vector<Row>& rows, prefix_report& out) {
  for (size_t i = 0; i < rows.size(); ++i) {
    auto conversation = conversation_of(rows[i]);
    if (conversation.empty())
      continue;
    ++out.checked;
    auto d = enc.divergence_of(conversation);
    if (!d)
      return with_prefix(d.error(), key + " row " + std::to_string(i + 1));
    if (!*d)
      continue;
    if (out.divergent++ == 0) {
      auto all = nlohmann::ordered_json::parse(conversation);
      out.first = key + " row " + std::to_string(i + 1) + ": turn " + std::to_string((*d)->turn) +
                  " (" + all[(*d)->turn].value("role", "?") + ") rewrites earlier text from byte " +
                  std::to_string((*d)->byte) + ": " + nlohmann::json((*d)->before).dump() +
                  " became " + nlohmann::json((*d)->after).dump();
    }
  }
  return {};
}

} // namespace

expected<prefix_report> check_prefixes(const prompt_encoder& enc, const data_config& c,
                                       const job_data& d) {
  prefix_report out;
  auto train = leading_rows(d.train);
  if (!train)
    return train.error();
  if (auto ok = check_rows(enc, c.train_file.empty() ? "data" : "data.train_file", *train, out);
      !ok)
    return ok.error();
  std::vector<example> eval(d.eval.begin(),
                            d.eval.begin() +
                                std::min<long>(static_cast<long>(d.eval.size()), kPrefixCheckRows));
  if (auto ok = check_rows(enc, "data.eval_file", eval, out); !ok)
    return ok.error();
  if (!c.sft_file.empty()) {
    auto sft = leading_rows(d.sft);
    if (!sft)
      return sft.error();
    if (auto ok = check_rows(enc, "data.sft_file", *sft, out); !ok)
      return ok.error();
  }
  return out;
}

std::vector<int64_t> prompt_encoder::response(const std::string& text) const {
  return encode_response(*tok_, text);
}

std::vector<int64_t> encode_response(const models::tokenizer& tok, const std::string& response) {
  auto out = tok.encode(response);
  if (auto eos = tok.eos_id())
    out.push_back(*eos);
  return out;
}

expected<runtime::tensor_batch> collate_sequences(const std::vector<std::vector<int64_t>>& prompts,
                                                  const std::vector<std::vector<int64_t>>& responses,
                                                  int64_t pad) {
  if (prompts.size() != responses.size() || prompts.empty())
    return make_error(errc::invalid_argument,
                      "collate_sequences: " + std::to_string(prompts.size()) + " prompts and " +
                          std::to_string(responses.size()) + " responses");
  auto b = static_cast<int64_t>(prompts.size());
  int64_t length = 2;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty())
      return make_error(errc::invalid_argument,
                        "collate_sequences: prompt " + std::to_string(i) + " is empty");
    length = std::max<int64_t>(length, static_cast<int64_t>(prompts[i].size() + responses[i].size()));
  }
  return guarded("collate_sequences", [&]() -> expected<runtime::tensor_batch> {
    auto ids = torch::full({b, length}, pad, torch::kLong);
    auto mask = torch::zeros({b, length}, torch::kLong);
    auto rmask = torch::zeros({b, length - 1}, torch::kFloat);
    auto ids_a = ids.accessor<int64_t, 2>();
    auto mask_a = mask.accessor<int64_t, 2>();
    auto rmask_a = rmask.accessor<float, 2>();
    for (int64_t r = 0; r < b; ++r) {
      const auto& p = prompts[static_cast<size_t>(r)];
      const auto& s = responses[static_cast<size_t>(r)];
      int64_t col = 0;
      for (auto t : p) {
        ids_a[r][col] = t;
        mask_a[r][col++] = 1;
      }
      for (auto t : s) {
        ids_a[r][col] = t;
        mask_a[r][col] = 1;
        rmask_a[r][col - 1] = 1.0f;
        ++col;
      }
    }
    runtime::tensor_batch out;
    if (auto ok = out.set("input_ids", ids); !ok)
      return ok.error();
    if (auto ok = out.set("attention_mask", mask); !ok)
      return ok.error();
    if (auto ok = out.set("response_mask", rmask); !ok)
      return ok.error();
    return out;
  });
}

at::Tensor scatter_response_values(const std::vector<std::vector<int64_t>>& prompts,
                                   const std::vector<std::vector<float>>& values, int64_t length) {
  auto b = static_cast<int64_t>(prompts.size());
  auto out = torch::zeros({b, length - 1}, torch::kFloat);
  auto a = out.accessor<float, 2>();
  for (int64_t r = 0; r < b; ++r) {
    auto start = static_cast<int64_t>(prompts[static_cast<size_t>(r)].size()) - 1;
    const auto& v = values[static_cast<size_t>(r)];
    for (size_t j = 0; j < v.size() && start + static_cast<int64_t>(j) < length - 1; ++j)
      a[r][start + static_cast<int64_t>(j)] = v[j];
  }
  return out;
}

expected<runtime::tensor_batch> collate_pairs(const std::vector<std::vector<int64_t>>& chosen,
                                              const std::vector<std::vector<int64_t>>& rejected,
                                              int64_t pad) {
  if (chosen.size() != rejected.size() || chosen.empty())
    return make_error(errc::invalid_argument, "collate_pairs: " + std::to_string(chosen.size()) +
                                                  " chosen and " + std::to_string(rejected.size()) +
                                                  " rejected rows");
  int64_t length = 1;
  for (size_t i = 0; i < chosen.size(); ++i)
    length = std::max<int64_t>({length, static_cast<int64_t>(chosen[i].size()),
                                static_cast<int64_t>(rejected[i].size())});
  return guarded("collate_pairs", [&]() -> expected<runtime::tensor_batch> {
    auto b = static_cast<int64_t>(chosen.size());
    runtime::tensor_batch out;
    auto fill = [&](const std::vector<std::vector<int64_t>>& rows, const std::string& name) -> expected<void> {
      auto ids = torch::full({b, length}, pad, torch::kLong);
      auto mask = torch::zeros({b, length}, torch::kLong);
      auto ia = ids.accessor<int64_t, 2>();
      auto ma = mask.accessor<int64_t, 2>();
      for (int64_t r = 0; r < b; ++r) {
        const auto& row = rows[static_cast<size_t>(r)];
        if (row.empty())
          return make_error(errc::invalid_argument, "collate_pairs: " + name + " row " +
                                                        std::to_string(r) + " is empty");
        for (size_t c = 0; c < row.size(); ++c) {
          ia[r][static_cast<int64_t>(c)] = row[c];
          ma[r][static_cast<int64_t>(c)] = 1;
        }
      }
      if (auto ok = out.set(name + "_ids", ids); !ok)
        return ok.error();
      return out.set(name + "_mask", mask);
    };
    if (auto ok = fill(chosen, "chosen"); !ok)
      return ok.error();
    if (auto ok = fill(rejected, "rejected"); !ok)
      return ok.error();
    return out;
  });
}

expected<runtime::tensor_batch> preference_layout(const runtime::tensor_batch& sequences,
                                                  int64_t pairs) {
  return guarded("preference_layout", [&]() -> expected<runtime::tensor_batch> {
    runtime::tensor_batch out;
    for (auto [from, side] : {std::pair{"input_ids", "ids"}, std::pair{"attention_mask", "mask"},
                              std::pair{"response_mask", "response_mask"}}) {
      auto t = value_or_throw(sequences.get(from));
      if (t.size(0) != 2 * pairs)
        return make_error(errc::shape_mismatch, std::string{"preference_layout: "} + from +
                                                    " has " + std::to_string(t.size(0)) +
                                                    " rows, expected 2 × " + std::to_string(pairs) +
                                                    " pairs");
      value_or_throw(out.set(std::string{"chosen_"} + side, t.narrow(0, 0, pairs)));
      value_or_throw(out.set(std::string{"rejected_"} + side, t.narrow(0, pairs, pairs)));
    }
    return out;
  });
}

} // namespace troupe::actors::rl
