#pragma once
// NOTE [pipeline parallelism]: a Llama model cut into stages by layers. A
// PP group of `size` ranks holds contiguous runs of the transformer layers
// (an even split, the first stages one more when it does not divide, or
// the counts the placement lists); the first stage also holds the token
// embedding, the last the final norm and the head. Parameters keep their
// troupe names ("layers.5.…" stays layer 5 on whichever stage holds it).
// A stage's forward takes the previous stage's hidden states [B, T,
// hidden] (the first embeds the ids) and hands its own to the next; the
// last answers the head's output. Every stage sees the whole batch (the
// masks and positions are computed from it), and micro-batches move
// through the stages under the 1F1B schedule (NOTE [1F1B] in
// runtime/pipeline_schedule.hpp; the training engine runs it: NOTE
// [pipeline execution] in actors/train/train_engine.cpp). A tied embedding
// lives on the first and the last stage (NOTE [tied embedding under PP]).

#include "models/config.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::runtime {
class process_group;
} // namespace troupe::runtime

namespace troupe::models {

/// This rank's stage of a Llama model under PP (NOTE [pipeline parallelism]).
struct pp_stage {
  int rank = 0, size = 1;
  /// Layers [layer0, layer0 + layers); layers < 0: every layer (no PP).
  int64_t layer0 = 0, layers = -1;
  /// The PP group (null when size is 1).
  runtime::process_group* group = nullptr;

  bool active() const { return size > 1; }
  bool first() const { return rank == 0; }
  bool last() const { return rank == size - 1; }
  /// Whether the stage holds layer `i` (of a model of `total` layers).
  bool holds_layer(int64_t i, int64_t total) const {
    return layers < 0 ? i >= 0 && i < total : i >= layer0 && i < layer0 + layers;
  }
};

/// The layers of each of `stages` stages: `listed` when given (one count a
/// stage, each >= 1, summing to `layers`), else an even split (the first
/// layers % stages stages one more). invalid_argument naming the numbers
/// otherwise (more stages than layers, a count that does not add up).
expected<std::vector<int64_t>> split_layers(int64_t layers, int stages,
                                            const std::vector<int64_t>& listed = {});

/// Stage `rank` of `size` of a model of config `c` (split_layers with
/// `listed`): its layers, and the rank and size of the pipeline.
expected<pp_stage> stage_of(const llama_config& c, int rank, int size,
                            const std::vector<int64_t>& listed = {});
/// The same over `group`'s ranks, keeping the group for the passes.
expected<pp_stage> stage_of(const llama_config& c, runtime::process_group& group,
                            const std::vector<int64_t>& listed = {});

/// Whether the parameter named `name` (troupe name) lives on stage `s` of a
/// model of config `c` with an LM head (a tied embedding on two stages).
bool on_stage(const std::string& name, const pp_stage& s, const llama_config& c);

} // namespace troupe::models
