#include "cluster/slurm.hpp"

#include <charconv>

namespace troupe::cluster {

namespace {

// Splits at the commas outside brackets.
std::vector<std::string> top_level_items(const std::string& list) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : list) {
    if (c == '[')
      ++depth;
    else if (c == ']')
      --depth;
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

bool number(const std::string& s, long& out) {
  if (s.empty() || s.size() > 9)
    return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && p == s.data() + s.size();
}

std::string padded(long v, size_t width) {
  auto s = std::to_string(v);
  return s.size() < width ? std::string(width - s.size(), '0') + s : s;
}

} // namespace

expected<std::vector<std::string>> expand_hostlist(const std::string& list) {
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_argument, "host list '" + list.substr(0, 200) + "': " + why);
  };
  std::vector<std::string> out;
  for (const auto& item : top_level_items(list)) {
    if (item.empty())
      return bad("an empty name");
    auto open = item.find('[');
    if (open == std::string::npos) {
      if (item.find(']') != std::string::npos)
        return bad("']' without '['");
      out.push_back(item);
      continue;
    }
    auto close = item.find(']', open);
    if (close == std::string::npos || item.find('[', open + 1) < close || item.find('[', close) != std::string::npos)
      return bad("one bracket per name, closed");
    auto prefix = item.substr(0, open), suffix = item.substr(close + 1);
    for (const auto& range : top_level_items(item.substr(open + 1, close - open - 1))) {
      auto dash = range.find('-');
      auto lo_text = range.substr(0, dash), hi_text = dash == std::string::npos ? lo_text : range.substr(dash + 1);
      long lo = 0, hi = 0;
      if (!number(lo_text, lo) || !number(hi_text, hi) || hi < lo)
        return bad("'" + range + "' is not a number or a range");
      if (out.size() + static_cast<size_t>(hi - lo) >= 100000)
        return bad("more than 100000 nodes");
      for (long v = lo; v <= hi; ++v)
        out.push_back(prefix + padded(v, lo_text.size()) + suffix);
    }
  }
  return out;
}

expected<std::vector<int>> expand_counts(const std::string& list) {
  std::vector<int> out;
  for (const auto& item : top_level_items(list)) {
    auto paren = item.find("(x");
    long value = 0, times = 1;
    bool ok = number(item.substr(0, paren), value);
    if (ok && paren != std::string::npos)
      ok = item.back() == ')' && number(item.substr(paren + 2, item.size() - paren - 3), times);
    if (!ok || value < 0 || times < 1 || times > 100000 || out.size() + static_cast<size_t>(times) > 100000)
      return make_error(errc::invalid_argument, "count list '" + list.substr(0, 200) + "': '" + item +
                                                    "' is neither N nor N(xM)");
    out.insert(out.end(), static_cast<size_t>(times), static_cast<int>(value));
  }
  return out;
}

expected<slurm_allocation> read_allocation(const std::function<const char*(const char*)>& env) {
  auto get = [&](const char* name) -> std::string {
    const char* v = env(name);
    return v ? v : "";
  };
  slurm_allocation a;
  a.job_id = get("SLURM_JOB_ID");
  if (a.job_id.empty())
    return make_error(errc::unavailable,
                      "not inside a Slurm allocation (SLURM_JOB_ID is unset): run it in a batch script "
                      "(sbatch) or under salloc");
  auto nodes = expand_hostlist(get("SLURM_JOB_NODELIST"));
  if (!nodes)
    return with_prefix(nodes.error(), "SLURM_JOB_NODELIST");
  a.nodes = std::move(*nodes);
  auto cpus = expand_counts(get("SLURM_JOB_CPUS_PER_NODE"));
  if (!cpus)
    return with_prefix(cpus.error(), "SLURM_JOB_CPUS_PER_NODE");
  if (cpus->size() != a.nodes.size())
    return make_error(errc::invalid_argument, "SLURM_JOB_CPUS_PER_NODE lists " + std::to_string(cpus->size()) +
                                                  " nodes, SLURM_JOB_NODELIST " + std::to_string(a.nodes.size()));
  a.cpus = std::move(*cpus);
  a.submit_dir = get("SLURM_SUBMIT_DIR");
  return a;
}

} // namespace troupe::cluster
