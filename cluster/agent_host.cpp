#include "cluster/agent_host.hpp"

#include "actors/rl/job_config.hpp"
#include "cluster/agent_gateway.hpp"
#include "cluster/credentials.hpp"
#include "cluster/local_launcher.hpp"

#include <caf/actor_cast.hpp>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <unistd.h>

// NOTE [agent runs] in actors/rl/agent_runs.hpp.
namespace troupe::cluster {

namespace {

namespace fs = std::filesystem;
namespace rl = actors::rl;

class process_agent_host final : public rl::agent_host {
public:
  process_agent_host(std::unique_ptr<agent_gateway> gateway, std::string key)
      : gateway_(std::move(gateway)), key_(std::move(key)) {}
  ~process_agent_host() override {
    kill();
    gateway_->stop();
  }

  std::string base_url(const std::string& episode) const override {
    return gateway_->base_url(episode);
  }
  std::string api_base() const override { return gateway_->api_base(); }
  std::string key() const override { return key_; }

  expected<void> start(const std::vector<std::string>& argv,
                       const std::vector<std::pair<std::string, std::string>>& env,
                       const std::string& log) override {
    if (argv.empty())
      return make_error(errc::invalid_argument, "no command");
    auto program = find_program(argv.front());
    if (!program)
      return program.error();
    process_spec spec;
    spec.name = "agent " + argv.front();
    spec.argv = argv;
    spec.argv.front() = *program;
    spec.env = env;
    spec.output_path = log;
    spec.append_output = true;
    if (!log.empty()) {
      std::error_code ec;
      fs::create_directories(fs::path{log}.parent_path(), ec);
    }
    auto p = local_process::spawn(spec);
    if (!p)
      return p.error();
    process_ = std::move(*p);
    return {};
  }

  std::optional<std::string> ended() override {
    auto status = process_.poll();
    if (!status)
      return std::nullopt;
    return status->ok() ? std::string{} : status->describe();
  }

  // SIGTERM first, so an agent can end its calls; SIGKILL after a grace.
  void kill() override {
    if (!process_.running())
      return;
    process_.kill(SIGTERM);
    if (!process_.wait_for(2000))
      process_.kill(SIGKILL);
    (void)process_.wait_for(2000);
  }

private:
  std::unique_ptr<agent_gateway> gateway_;
  std::string key_;
  local_process process_;
};

} // namespace

expected<std::string> find_program(const std::string& name) {
  if (name.empty())
    return make_error(errc::invalid_argument, "an empty program name");
  if (name.find('/') != std::string::npos)
    return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t at = 0;
  while (at <= dirs.size()) {
    auto end = dirs.find(':', at);
    if (end == std::string::npos)
      end = dirs.size();
    auto dir = dirs.substr(at, end - at);
    auto candidate = (dir.empty() ? std::string{"."} : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate))
      return candidate;
    at = end + 1;
  }
  return make_error(errc::not_found, "'" + name + "' is not an executable on PATH");
}

expected<std::unique_ptr<rl::agent_host>> make_agent_host(caf::actor_system& sys,
                                                          caf::actor rollout,
                                                          std::shared_ptr<rl::agent_book> book,
                                                          const rl::agent_endpoint_spec& spec) {
  const auto& a = spec.job->rl.agent;
  auto key = make_token();
  if (!key)
    return with_prefix(key.error(), "rl.agent: the API key");
  gateway_options o;
  o.listen = a.listen;
  o.tls.cert_file = a.tls_cert_file;
  o.tls.key_file = a.tls_key_file;
  o.key = *key;
  o.defaults = spec.defaults;
  o.max_context = spec.max_context;
  o.generate_timeout_s = spec.generate_timeout_s;
  o.threads = a.threads;
  auto g = agent_gateway::start(sys, caf::actor_cast<actors::inference::rollout_actor>(rollout),
                                std::move(book), o);
  if (!g)
    return with_prefix(g.error(), "rl.agent");
  return std::unique_ptr<rl::agent_host>{
      std::make_unique<process_agent_host>(std::move(*g), std::move(*key))};
}

} // namespace troupe::cluster
