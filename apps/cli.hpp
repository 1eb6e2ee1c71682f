#pragma once
// The CLI's commands register themselves on the app; after parsing, the
// runner of the parsed one answers its exit status (the others nullopt).

#include <functional>
#include <optional>
#include <vector>

namespace CLI {
class App;
} // namespace CLI

namespace troupe::apps {

using runner = std::function<std::optional<int>()>;

/// controller, submit, jobs, status, logs, watch, cancel, pause, resume,
/// checkpoint, set, metrics (apps/control.hpp).
std::vector<runner> add_control_commands(CLI::App& app);

} // namespace troupe::apps
