#include "apps/cli.hpp"

namespace troupe::apps {

const std::vector<engine_command>& engine_commands() {
  static const std::vector<engine_command> commands{
      {"run", "Run an RLHF job (sft → rm → rl) from a YAML config"},
      {"plan", "Check a job's placement and print which worker hosts what, with memory estimates"},
      {"config", "Inspect job configs"},
      {"generate", "Generate with the inference engine from an HF model directory"},
      {"tokenize", "Show how a model's tokenizer cuts text into ids and pieces, or decode ids"},
      {"env", "Report versions, devices and c10d backends; run smoke tests"},
      {"controller", "Run the controller: the job API, queue and records"},
      {"node", "Join this machine to a controller as a node agent (docs/cluster.md)"},
      {"slurm", "Run jobs inside a Slurm allocation (docs/cluster.md)"},
      {"driver", "Run a controller's job (started by `troupe controller`, not by hand)"},
      {"worker", "Host rank actors for a driver (started by troupe's launchers, not by hand)"},
      {"_gloo-smoke", ""},
  };
  return commands;
}

const char* command_help(std::string_view name) {
  for (const auto& c : engine_commands())
    if (name == c.name)
      return c.help;
  return "";
}

} // namespace troupe::apps
