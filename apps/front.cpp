// troupe: the command people type (NOTE [lean client] in apps/cli.hpp). It
// runs the client commands itself and hands the engine's commands to
// troupe-engine beside it; it never loads LibTorch.
#include "apps/cli.hpp"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>

namespace {

// The engine binary: troupe-engine in this executable's directory.
std::string engine_path() {
  char self[PATH_MAX];
  auto n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    return "troupe-engine";
  std::string path{self, static_cast<size_t>(n)};
  auto slash = path.rfind('/');
  return (slash == std::string::npos ? std::string{} : path.substr(0, slash + 1)) + "troupe-engine";
}

bool is_engine_command(const char* arg) {
  for (const auto& c : troupe::apps::engine_commands())
    if (std::strcmp(arg, c.name) == 0)
      return true;
  return false;
}

// Replaces this process with the engine, argv unchanged but argv[0].
int exec_engine(int argc, char** argv) {
  auto path = engine_path();
  std::vector<char*> args(argv, argv + argc);
  args[0] = path.data();
  args.push_back(nullptr);
  ::execv(path.c_str(), args.data());
  std::fprintf(stderr, "troupe: cannot start the engine %s: %s\n", path.c_str(), std::strerror(errno));
  return 127;
}

} // namespace

int main(int argc, char** argv) {
  if (argc > 1 && is_engine_command(argv[1]))
    return exec_engine(argc, argv);
  CLI::App app{"troupe: actor-based distributed RLHF"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string{"troupe "} + TROUPE_VERSION);
  auto runners = troupe::apps::add_client_commands(app);
  // The engine's commands, for the help only: main() hands them over above.
  for (const auto& c : troupe::apps::engine_commands()) {
    auto* sub = app.add_subcommand(c.name, c.help);
    if (*c.help == '\0')
      sub->group("");
  }
  CLI11_PARSE(app, argc, argv);
  for (auto& r : runners)
    if (auto code = r())
      return *code;
  return 0;
}
