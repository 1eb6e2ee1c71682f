#include "actors/rl/data.hpp"

#include "actors/rl/datasets.hpp"
#include "actors/rl/environment.hpp"
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
    if (!d.turns.empty() && l.demonstration_tokens) {
      auto n = l.demonstration_tokens(d);
      if (!n)
        return n.error();
      return *n <= l.context;
    }
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

// Derived tool demonstrations that fit the context; a note counts the others.
expected<std::vector<demonstration>> fitting_rows(std::vector<demonstration> rows,
                                                  const data_limits& limits,
                                                  std::vector<std::string>& notes) {
  if (limits.context <= 0)
    return rows;
  std::vector<demonstration> kept;
  for (auto& r : rows) {
    auto ok = fits{limits}(r);
    if (!ok)
      return with_prefix(ok.error(), "data.sft_tool_calls");
    if (*ok)
      kept.push_back(std::move(r));
  }
  const auto dropped = rows.size() - kept.size();
  const auto why = " (the episode > the context of " + std::to_string(limits.context) + " tokens)";
  if (kept.empty())
    return make_error(errc::invalid_argument, "data.sft_tool_calls: all " +
                                                  std::to_string(dropped) +
                                                  " demonstrations are too long" + why);
  if (dropped > 0)
    notes.push_back("data.sft_tool_calls: " + std::to_string(dropped) + " of " +
                    std::to_string(rows.size()) + " demonstrations dropped as too long" + why);
  return kept;
}

// data.sft_tool_call_share: all but that share of the tool demonstrations
// (drawn by seed) answer in one turn, with the tool still offered, so the
// policy starts RL from a mix of calling and not calling.
void answer_some_directly(std::vector<demonstration>& demos, double share, uint64_t seed) {
  const auto n = static_cast<int64_t>(demos.size());
  const auto direct = n - static_cast<int64_t>(std::llround(share * static_cast<double>(n)));
  // The stream tag spells "tool_sha".
  const auto order = runtime::seeded_permutation(n, mix_seed({seed, 0x746f6f6c5f736861ULL}));
  for (int64_t k = 0; k < direct; ++k) {
    auto& d = demos[static_cast<size_t>(order[static_cast<size_t>(k)])];
    using json = nlohmann::ordered_json;
    d.turns = json::array({json{{"role", "assistant"}, {"content", d.response}}}).dump();
  }
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
    if (c.sft_tool_calls) {
      auto demos = to_tool_demonstrations(**train);
      if (!demos)
        return with_prefix(demos.error(), "data.sft_tool_calls");
      answer_some_directly(*demos, c.sft_tool_call_share, seed);
      auto kept = fitting_rows(std::move(*demos), limits, d.notes);
      if (!kept)
        return kept.error();
      d.sft = row_table<demonstration>{std::move(*kept)};
    } else {
      d.sft = row_table<demonstration>{to_demonstrations(**train)};
    }
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

} // namespace troupe::actors::rl
