#include "actors/rl/data.hpp"

#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <numeric>

// Token ids to the padded tensors the engines train on.
namespace troupe::actors::rl {

expected<runtime::tensor_batch>
collate_sequences(const std::vector<std::vector<int64_t>>& prompts,
                  const std::vector<std::vector<int64_t>>& responses, int64_t pad) {
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
    length =
        std::max<int64_t>(length, static_cast<int64_t>(prompts[i].size() + responses[i].size()));
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
    length = std::max<int64_t>(
        {length, static_cast<int64_t>(chosen[i].size()), static_cast<int64_t>(rejected[i].size())});
  return guarded("collate_pairs", [&]() -> expected<runtime::tensor_batch> {
    auto b = static_cast<int64_t>(chosen.size());
    runtime::tensor_batch out;
    auto fill = [&](const std::vector<std::vector<int64_t>>& rows,
                    const std::string& name) -> expected<void> {
      auto ids = torch::full({b, length}, pad, torch::kLong);
      auto mask = torch::zeros({b, length}, torch::kLong);
      auto ia = ids.accessor<int64_t, 2>();
      auto ma = mask.accessor<int64_t, 2>();
      for (int64_t r = 0; r < b; ++r) {
        const auto& row = rows[static_cast<size_t>(r)];
        if (row.empty())
          return make_error(errc::invalid_argument,
                            "collate_pairs: " + name + " row " + std::to_string(r) + " is empty");
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
