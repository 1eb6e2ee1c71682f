#include "cluster/prometheus.hpp"

#include "runtime/host.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include <unistd.h>

namespace troupe::cluster {

namespace {

// VmRSS of a live process, in bytes; -1 when it is gone.
int64_t rss_of(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stoll(line.substr(6)) * 1024;
  return -1;
}

std::string escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"')
      out += '\\', out += c;
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v))
    return "NaN";
  if (std::isinf(v))
    return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

using labels = std::vector<std::pair<std::string, std::string>>;

// One metric family: HELP and TYPE once, then its samples.
class family {
public:
  family(std::string& out, const char* name, const char* type, const char* help) : out_(out), name_(name) {
    out_ += std::string{"# HELP "} + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const labels& ls, double v) {
    out_ += name_;
    if (!ls.empty()) {
      out_ += '{';
      for (size_t i = 0; i < ls.size(); ++i)
        out_ += (i ? "," : "") + ls[i].first + "=\"" + escape(ls[i].second) + "\"";
      out_ += '}';
    }
    out_ += " " + number(v) + "\n";
  }

private:
  std::string& out_;
  const char* name_;
};

bool live(const job_view& v) {
  return !is_final(v.state) && v.state != ctl_state::queued;
}

// A gauge of one metric key of each live job's last step.
void last_metric(std::string& out, const std::vector<job_view>& jobs, const char* name, const char* help,
                 std::initializer_list<const char*> keys) {
  family f{out, name, "gauge", help};
  for (const auto& v : jobs) {
    if (!live(v))
      continue;
    for (const char* k : keys)
      if (auto it = v.status.last_metrics.find(k); it != v.status.last_metrics.end()) {
        f.sample({{"job_id", v.status.id}}, it->second);
        break;
      }
  }
}

template <class Get>
void per_job(std::string& out, const std::vector<job_view>& jobs, const char* name, const char* type,
             const char* help, Get get) {
  family f{out, name, type, help};
  for (const auto& v : jobs)
    if (live(v))
      f.sample({{"job_id", v.status.id}}, get(v));
}

} // namespace

std::vector<process_info> processes_of(const job_view& v) {
  std::vector<process_info> out;
  std::set<int64_t> seen;
  auto node = runtime::host_name();
  std::set<std::pair<std::string, int64_t>> remote;
  auto add = [&](const std::string& process, int64_t pid) {
    if (pid <= 0 || !seen.insert(pid).second)
      return;
    auto rss = rss_of(pid);
    out.push_back({node, process, pid, rss >= 0 && !is_final(v.state), std::max<int64_t>(rss, 0)});
  };
  add("driver", v.driver_pid);
  for (const auto& r : v.roles) {
    if (r.node.empty()) {
      add(r.process, r.pid);
    } else if (remote.insert({r.node, r.pid}).second) {
      // On another machine: its memory is not ours to read (the dashboard
      // shows where it runs; its agent knows more).
      out.push_back({r.node, r.process, r.pid, !is_final(v.state) && r.status != "failed", 0});
    }
  }
  return out;
}

std::string prometheus_text(const std::vector<job_view>& jobs) {
  std::string out;
  {
    family f{out, "troupe_jobs", "gauge", "Jobs the controller knows, by state."};
    std::map<ctl_state, int> by_state;
    for (const auto& v : jobs)
      ++by_state[v.state];
    for (auto s : {ctl_state::queued, ctl_state::pending, ctl_state::preparing, ctl_state::running,
                   ctl_state::paused, ctl_state::succeeded, ctl_state::failed, ctl_state::cancelled,
                   ctl_state::lost})
      f.sample({{"state", std::string{to_string(s)}}}, by_state[s]);
  }
  {
    family f{out, "troupe_job_info", "gauge", "A live job: its name, stage and state (value 1)."};
    for (const auto& v : jobs)
      if (live(v))
        f.sample({{"job_id", v.status.id},
                  {"name", v.status.name},
                  {"stage", v.status.stage},
                  {"state", std::string{to_string(v.state)}}},
                 1);
  }
  per_job(out, jobs, "troupe_job_step", "gauge", "The step (iteration) the job's stage has reached.",
          [](const job_view& v) { return static_cast<double>(v.status.iteration); });
  per_job(out, jobs, "troupe_job_steps", "gauge", "The steps of the job's current stage.",
          [](const job_view& v) { return static_cast<double>(v.status.total); });
  per_job(out, jobs, "troupe_job_eta_seconds", "gauge", "Estimated seconds until the stage ends.",
          [](const job_view& v) { return v.status.eta_s; });
  last_metric(out, jobs, "troupe_job_score", "Mean score of the last step (val/score/mean, else critic/score/mean).",
              {"val/score/mean", "critic/score/mean"});
  last_metric(out, jobs, "troupe_job_kl", "KL of the policy to its sampling policy in the last step (actor/ppo_kl).",
              {"actor/ppo_kl"});
  last_metric(out, jobs, "troupe_job_throughput_tokens_per_second",
              "Tokens per second of the last step's time (perf/throughput).", {"perf/throughput"});
  last_metric(out, jobs, "troupe_job_rollout_tokens_per_second",
              "Generated tokens per engine-busy second in the last step (rollout/tokens_per_s).",
              {"rollout/tokens_per_s"});
  last_metric(out, jobs, "troupe_job_rollout_kv_utilization_ratio",
              "Peak use of the rollout's KV pool in the last step (rollout/kv_utilization).",
              {"rollout/kv_utilization"});
  last_metric(out, jobs, "troupe_job_rollout_prefix_hit_ratio",
              "Prompt tokens served from the prefix cache in the last step (rollout/prefix_hit_rate).",
              {"rollout/prefix_hit_rate"});
  {
    family f{out, "troupe_job_phase_seconds", "gauge", "Seconds of each phase of the last step (timing_s/*)."};
    for (const auto& v : jobs) {
      if (!live(v))
        continue;
      for (const auto& [k, x] : v.status.last_metrics)
        if (k.rfind("timing_s/", 0) == 0)
          f.sample({{"job_id", v.status.id}, {"phase", k.substr(9)}}, x);
    }
  }
  per_job(out, jobs, "troupe_job_weight_syncs_total", "counter", "Weight syncs from trainer to rollout.",
          [](const job_view& v) { return static_cast<double>(v.totals.weight_syncs); });
  per_job(out, jobs, "troupe_job_weight_sync_seconds_total", "counter", "Seconds spent in weight syncs.",
          [](const job_view& v) { return v.totals.weight_sync_seconds; });
  per_job(out, jobs, "troupe_job_weight_sync_bytes_total", "counter", "Bytes of weights synced.",
          [](const job_view& v) { return static_cast<double>(v.totals.weight_sync_bytes); });
  per_job(out, jobs, "troupe_job_checkpoints_total", "counter", "Checkpoints committed.",
          [](const job_view& v) { return static_cast<double>(v.totals.checkpoints); });
  {
    // NOTE [supervision]: each role of the job's cast, restarted or not.
    family f{out, "troupe_role_restarts_total", "counter",
             "Restarts of a lost role (supervision)."};
    for (const auto& v : jobs) {
      if (!live(v))
        continue;
      std::set<std::string> roles;
      for (const auto& r : v.roles)
        roles.insert(r.role);
      for (const auto& [role, n] : v.totals.role_restarts)
        roles.insert(role);
      for (const auto& role : roles) {
        auto it = v.totals.role_restarts.find(role);
        f.sample({{"job_id", v.status.id}, {"role", role}},
                 it == v.totals.role_restarts.end() ? 0.0 : it->second);
      }
    }
  }
  {
    family f{out, "troupe_process_resident_memory_bytes", "gauge",
             "Resident memory of each process of a live job on this machine."};
    for (const auto& v : jobs)
      if (live(v))
        for (const auto& p : processes_of(v))
          if (p.alive)
            f.sample({{"job_id", v.status.id}, {"process", p.process}}, static_cast<double>(p.rss_bytes));
  }
  return out;
}

} // namespace troupe::cluster
