#include "cluster/controller_impl.hpp"

#include "actors/rl/placement.hpp"
#include "runtime/config.hpp"
#include "runtime/file_io.hpp"

#include <algorithm>

namespace troupe::cluster {

// ---- restart ----

namespace {

// The kind of a journal line, read without parsing it; "" when it is not
// there. The line's keys are in name order and those before "kind" hold
// numbers or plain strings, so the first `"kind":"` is the event's (inside
// a string its quotes would be escaped).
std::string_view kind_of_line(std::string_view line) {
  constexpr std::string_view key = "\"kind\":\"";
  auto at = line.find(key);
  if (at == std::string_view::npos)
    return {};
  auto from = at + key.size();
  auto end = line.find('"', from);
  return end == std::string_view::npos ? std::string_view{} : line.substr(from, end - from);
}

// What a final job's status and totals need from its journal: every
// stage, weight-sync and checkpoint event, and only the last metrics and
// phase events (each replaces the one before it in the status), in journal
// order. A 10,000-step journal holds 150,000 events; this parses a few
// hundred of them.
std::vector<std::string_view> status_lines(std::string_view text) {
  std::vector<std::string_view> keep;
  std::string_view last_metrics, last_phase;
  size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string_view::npos)
      break;
    auto line = text.substr(start, end - start);
    start = end + 1;
    auto kind = kind_of_line(line);
    if (kind == j::metrics_reported::kind)
      last_metrics = line;
    else if (kind == j::phase_started::kind || kind == j::phase_finished::kind)
      last_phase = line;
    else if (kind == j::stage_started::kind || kind == j::weight_synced::kind ||
             kind == j::checkpoint_saved::kind || kind.empty())
      keep.push_back(line);
  }
  for (auto line : {last_metrics, last_phase})
    if (!line.empty())
      keep.push_back(line);
  // Views into `text`: their addresses are their order in the journal.
  std::sort(keep.begin(), keep.end(), [](std::string_view a, std::string_view b) { return a.data() < b.data(); });
  return keep;
}

} // namespace

void controller::impl::load_journal_status(job_entry& e) {
  auto text = runtime::read_file((fs::path{e.rec.run_dir} / "events.jsonl").string());
  if (!text)
    return;
  e.totals = {};
  for (auto line : status_lines(*text))
    if (auto ev = j::event_from_json(line)) {
      j::track(e.status, ev->body);
      count(e.totals, ev->body);
    }
  e.status_loaded = true;
}

void controller::impl::recover(job_entry& e) {
  auto info = read_driver_info(e.rec.job_dir);
  std::optional<driver_info> found;
  if (info)
    found = *info;
  bool running = found && is_driver_of(found->pid, e.rec.job_dir);
  switch (plan_recovery(e.state(), e.rec.driver_pid, found, running)) {
  case recovery_step::keep:
    return;
  case recovery_step::requeue:
    adm.enqueue(e.rec.id);
    return;
  case recovery_step::reattach:
    return reattach(e);
  case recovery_step::settle:
    break;
  }
  catch_up(e);
  if (!is_final(e.state())) {
    e.rec.exit_reason = "the driver went away while the controller was down";
    set_state(e, ctl_state::lost, e.rec.exit_reason, now_us());
  }
  finalize(e);
}

// Re-attach: the feed subscribes from the first event (the job actor
// replays its journal, and the job book lets through only the moves newer
// than the last recorded), so the in-memory history starts over. A job on
// nodes holds its nodes' devices again (its workers were asked for).
void controller::impl::reattach(job_entry& e) {
  if (auto jn = read_job_nodes(e.rec.job_dir)) {
    e.on_nodes = true;
    for (const auto& n : jn->nodes)
      e.nodes.push_back(n.name);
    if (auto plan = e.cfg ? actors::rl::make_plan(*e.cfg) : make_error(errc::internal, "no config");
        plan && plan->nodes == static_cast<int64_t>(e.nodes.size()))
      e.node_need = plan->devices_per_node();
    e.node_need.resize(e.nodes.size(), 1);
    e.need_known = true;
    e.workers_sent = true;
  }
  e.driver_alive = true;
  e.rec.last_seq = 0;
  e.status = {};
  e.attach_deadline_us = now_us() + static_cast<int64_t>(opt.driver_start_timeout_s * 1e6);
  watch_driver(e);
}

expected<void> controller::impl::load_records() {
  auto recs = store->jobs();
  if (!recs)
    return recs.error();
  for (auto& rec : *recs) {
    auto e = std::make_shared<job_entry>();
    auto state = parse_ctl_state(rec.state);
    e->rec = std::move(rec);
    e->status.stage = e->rec.stage;
    e->status.iteration = e->rec.iteration;
    e->status.total = e->rec.total;
    std::vector<transition_view> history;
    if (auto ts = store->transitions(e->rec.id))
      for (auto& t : *ts)
        if (auto s = parse_ctl_state(t.state))
          history.push_back({*s, t.time_us, t.reason});
    e->book.restore(state ? *state : ctl_state::lost, std::move(history));
    if (auto doc = runtime::yaml_document::from_text(e->rec.resolved_config, e->rec.spec_name))
      if (auto cfg = runtime::load_config<actors::rl::job_config>(*doc))
        e->cfg = std::make_shared<actors::rl::job_config>(std::move(*cfg));
    if (!is_final(e->state()) && e->state() != ctl_state::queued)
      e->rec.last_seq = 0, e->status.last_seq = 0; // the journal is read again
    jobs[e->rec.id] = e;
    recover(*e);
  }
  return {};
}

} // namespace troupe::cluster
