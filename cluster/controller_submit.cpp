#include "cluster/controller_impl.hpp"

#include "actors/rl/placement.hpp"
#include "runtime/config.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <mutex>
#include <random>

namespace troupe::cluster {

namespace {

std::string random_id() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard lock{mu};
  char buf[32];
  std::snprintf(buf, sizeof buf, "job-%010llx",
                static_cast<unsigned long long>(gen() & 0xffffffffffULL));
  return buf;
}

// Whether `p` (normalised) lies inside `root` (normalised, absolute).
bool inside(const fs::path& root, const fs::path& p) {
  auto r = root.lexically_normal();
  auto q = p.lexically_normal();
  auto rel = q.lexically_relative(r);
  return !rel.empty() && *rel.begin() != ".." && rel.is_relative();
}

} // namespace

// ---- submit ----

expected<job_record> controller::impl::validate(const submit_request& r,
                                                std::shared_ptr<actors::rl::job_config>& cfg_out) {
  const auto& lim = opt.limits;
  int64_t bytes = static_cast<int64_t>(r.spec_text.size());
  for (const auto& [name, text] : r.bases)
    bytes += static_cast<int64_t>(text.size());
  if (bytes > lim.spec_bytes)
    return make_error(errc::out_of_range, "spec: " + std::to_string(bytes) +
                                              " bytes with its base files; the limit is " +
                                              std::to_string(lim.spec_bytes));
  if (static_cast<int64_t>(r.overrides.size()) > lim.overrides)
    return make_error(errc::out_of_range, "overrides: " + std::to_string(r.overrides.size()) +
                                              " given; the limit is " + std::to_string(lim.overrides));
  for (size_t i = 0; i < r.overrides.size(); ++i)
    if (static_cast<int64_t>(r.overrides[i].size()) > lim.override_bytes)
      return make_error(errc::out_of_range, "overrides[" + std::to_string(i) + "]: " +
                                                std::to_string(r.overrides[i].size()) +
                                                " bytes; the limit is " +
                                                std::to_string(lim.override_bytes));
  if (r.name.size() > 128 ||
      !std::all_of(r.name.begin(), r.name.end(), [](unsigned char c) {
        return std::isalnum(c) || c == '-' || c == '_' || c == '.';
      }))
    return make_error(errc::invalid_argument,
                      "name: '" + r.name.substr(0, 128) +
                          "' is not a name (letters, digits, '-', '_', '.'; at most 128)");
  auto spec_name = r.spec_name.empty() ? std::string{"spec.yaml"} : r.spec_name;
  std::vector<runtime::yaml_document::source_file> bases;
  for (const auto& [name, text] : r.bases)
    bases.push_back({name, text});
  auto doc = runtime::yaml_document::from_sources({spec_name, r.spec_text}, bases);
  if (!doc)
    return doc.error();
  for (const auto& o : r.overrides)
    if (auto ok = doc->set(o); !ok)
      return ok.error();
  auto cfg = runtime::load_config<actors::rl::job_config>(*doc);
  if (!cfg)
    return cfg.error();
  auto plan = actors::rl::make_plan(*cfg);
  if (!plan)
    return plan.error();

  job_record rec;
  rec.id = random_id();
  rec.job_dir = (fs::path{jobs_root} / rec.id).string();
  // NOTE: run directories stay under the jobs root: a relative run.dir is
  // the job's own folder's, an absolute one must lie inside the root.
  fs::path run_dir = cfg->run.dir;
  if (run_dir.is_relative())
    run_dir = fs::path{rec.job_dir} / run_dir;
  run_dir = run_dir.lexically_normal();
  if (!inside(fs::path{jobs_root}, run_dir) || (fs::path{cfg->run.dir}.is_relative() &&
                                                !inside(fs::path{rec.job_dir}, run_dir)))
    return make_error(errc::invalid_config,
                      spec_name + ": run.dir: '" + cfg->run.dir +
                          "' lies outside the controller's jobs root (a relative run.dir is "
                          "placed in the job's own folder)");
  cfg->run.dir = run_dir.string();
  cfg->run.progress = actors::rl::progress_style::none;
  int64_t per_process = cfg->run.threads > 0 ? cfg->run.threads : adm.cores_total();
  int64_t processes = std::max<int64_t>(1, static_cast<int64_t>(plan->devices.size()));
  rec.cores = std::min(adm.cores_total(), per_process * processes);
  rec.name = r.name.empty() ? cfg->run.name : r.name;
  rec.spec_name = spec_name;
  rec.spec_text = r.spec_text;
  rec.resolved_config = runtime::to_yaml(*cfg, false);
  rec.run_dir = cfg->run.dir;
  rec.submitter = r.submitter;
  rec.submit_time_us = now_us();
  rec.state = "queued";
  cfg_out = std::make_shared<actors::rl::job_config>(std::move(*cfg));
  return rec;
}

} // namespace troupe::cluster
