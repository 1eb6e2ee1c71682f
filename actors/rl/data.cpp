#include "actors/rl/data.hpp"

#include "actors/rl/datasets.hpp"
#include "models/tokenizer.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

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

expected<job_data> load_job_data(const data_config& c) {
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
  d.train = c.train_file.empty() ? splits->train : std::vector<example>{};
  if (!c.train_file.empty()) {
    auto rows = load_examples(c.train_file);
    if (!rows)
      return with_prefix(rows.error(), "data.train_file");
    d.train = std::move(*rows);
  }
  d.eval = splits->eval;
  if (!c.eval_file.empty()) {
    auto rows = load_examples(c.eval_file);
    if (!rows)
      return with_prefix(rows.error(), "data.eval_file");
    d.eval = std::move(*rows);
  }
  if (!c.sft_file.empty()) {
    auto rows = load_demonstrations(c.sft_file);
    if (!rows)
      return with_prefix(rows.error(), "data.sft_file");
    d.sft = std::move(*rows);
  } else {
    d.sft = to_demonstrations(d.train);
  }
  if (!c.preference_file.empty()) {
    auto rows = load_preferences(c.preference_file);
    if (!rows)
      return with_prefix(rows.error(), "data.preference_file");
    d.preferences = std::move(*rows);
  } else {
    d.preferences = to_preferences(**t, d.train, mix_seed({seed, 1}));
  }
  d.eval_preferences = to_preferences(**t, d.eval, mix_seed({seed, 2}));
  return d;
}

std::vector<int64_t> encode_prompt(const models::tokenizer& tok, const std::string& prompt) {
  std::vector<int64_t> out;
  if (auto bos = tok.bos_id())
    out.push_back(*bos);
  auto ids = tok.encode(prompt);
  out.insert(out.end(), ids.begin(), ids.end());
  return out;
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

} // namespace troupe::actors::rl
