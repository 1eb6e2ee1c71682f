#pragma once
// The CLI's commands register themselves on the app; after parsing, the
// runner of the parsed one answers its exit status (the others nullopt).
//
// NOTE [lean client]: two executables share this CLI. `troupe` is the front
// that people type: it parses and runs the client commands (gRPC to a
// controller; no LibTorch, so it answers in milliseconds) and hands every
// other command, argv unchanged, to `troupe-engine` beside it (execv: the
// same process, pid and signals). The engine binary holds LibTorch and
// runs jobs, workers, drivers, generation, the controller and node agents;
// the processes it starts (drivers, workers) are engines themselves.

#include <functional>
#include <optional>
#include <string_view>
#include <vector>

namespace CLI {
class App;
} // namespace CLI

namespace troupe::apps {

struct client_flags;

using runner = std::function<std::optional<int>()>;

/// A command of the engine binary and its one-line help.
struct engine_command {
  const char* name;
  const char* help; ///< "" for hidden commands
};

/// The engine's commands (the front lists them in its help).
const std::vector<engine_command>& engine_commands();

/// The one-line help of engine command `name` ("" when unknown).
const char* command_help(std::string_view name);

/// submit, jobs, status, logs, watch, cancel, pause, resume, checkpoint,
/// set, metrics, nodes (apps/client_cli.cpp).
std::vector<runner> add_client_commands(CLI::App& app);

/// controller, node, slurm run (apps/control_cli.cpp).
std::vector<runner> add_daemon_commands(CLI::App& app);

/// The connection flags of a client command (--address, --token-file, ...).
void add_client_flags(CLI::App* cmd, client_flags& c);

} // namespace troupe::apps
