#include "cluster/job_proto.hpp"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include <cctype>
#include <stdexcept>
#include <utility>

namespace troupe::cluster {

namespace j = actors::job;
namespace pb = google::protobuf;

v1::JobState to_proto(ctl_state s) noexcept {
  // JOB_STATE_QUEUED = 1 ... JOB_STATE_LOST = 9, in ctl_state's order
  // (checked by the round-trip test).
  return static_cast<v1::JobState>(static_cast<int>(s) + 1);
}

expected<ctl_state> from_proto(v1::JobState s) {
  auto n = static_cast<int>(s);
  if (n < 1 || n > ctl_state_count)
    return make_error(errc::invalid_argument, "job state " + std::to_string(n) + " is not one of " +
                                                  "JOB_STATE_QUEUED .. JOB_STATE_LOST");
  return static_cast<ctl_state>(n - 1);
}

namespace {

// A field every payload struct's member has in its message: one missing
// is a .proto behind its struct (JobProto.EveryEventKindRoundTripsFieldForField
// finds it), named here rather than dereferenced as null.
const pb::FieldDescriptor* field_of(const pb::Message& m, const char* name) {
  const auto* f = m.GetDescriptor()->FindFieldByName(name);
  if (!f)
    throw std::logic_error("job_proto: " + m.GetDescriptor()->full_name() + " has no field '" +
                           name + "'");
  return f;
}

// Writes the fields of a payload struct into its message (by name).
struct proto_writer {
  pb::Message* m;

  const pb::FieldDescriptor* f(const char* name) const { return field_of(*m, name); }
  const pb::Reflection* r() const { return m->GetReflection(); }

  void operator()(const char* name, std::string& v) const { r()->SetString(m, f(name), v); }
  void operator()(const char* name, int64_t& v) const { r()->SetInt64(m, f(name), v); }
  void operator()(const char* name, int32_t& v) const { r()->SetInt32(m, f(name), v); }
  void operator()(const char* name, double& v) const { r()->SetDouble(m, f(name), v); }
  void operator()(const char* name, bool& v) const { r()->SetBool(m, f(name), v); }
  void operator()(const char* name, j::job_state& v) const {
    r()->SetEnumValue(m, f(name), to_proto(ctl_state_of(v)));
  }
  void operator()(const char* name, j::metric_map& v) const {
    for (const auto& [key, value] : v) {
      auto* entry = r()->AddMessage(m, f(name));
      auto* er = entry->GetReflection();
      er->SetString(entry, entry->GetDescriptor()->FindFieldByNumber(1), key);
      er->SetDouble(entry, entry->GetDescriptor()->FindFieldByNumber(2), value);
    }
  }
  void operator()(const char* name, std::vector<j::eval_sample>& v) const {
    for (auto& s : v) {
      proto_writer w{r()->AddMessage(m, f(name))};
      w("prompt", s.prompt), w("response", s.response), w("score", s.score),
          w("conversation_json", s.conversation);
    }
  }
  template <class T>
  void operator()(const char* name, j::added_field<T> v) const {
    (*this)(name, v.value);
  }
};

// Reads them back; a field the message lacks leaves the struct's default.
struct proto_reader {
  const pb::Message* m;
  std::string* error;

  const pb::FieldDescriptor* f(const char* name) const { return field_of(*m, name); }
  const pb::Reflection* r() const { return m->GetReflection(); }

  void operator()(const char* name, std::string& v) const { v = r()->GetString(*m, f(name)); }
  void operator()(const char* name, int64_t& v) const { v = r()->GetInt64(*m, f(name)); }
  void operator()(const char* name, int32_t& v) const { v = r()->GetInt32(*m, f(name)); }
  void operator()(const char* name, double& v) const { v = r()->GetDouble(*m, f(name)); }
  void operator()(const char* name, bool& v) const { v = r()->GetBool(*m, f(name)); }
  void operator()(const char* name, j::job_state& v) const {
    auto s = from_proto(static_cast<v1::JobState>(r()->GetEnumValue(*m, f(name))));
    auto js = s ? j::parse_job_state(to_string(*s)) : std::nullopt;
    if (!js) {
      *error = std::string{name} + ": not a state of a job actor";
      return;
    }
    v = *js;
  }
  void operator()(const char* name, j::metric_map& v) const {
    v.clear();
    for (int i = 0, n = r()->FieldSize(*m, f(name)); i < n; ++i) {
      const auto& entry = r()->GetRepeatedMessage(*m, f(name), i);
      auto* er = entry.GetReflection();
      v[er->GetString(entry, entry.GetDescriptor()->FindFieldByNumber(1))] =
          er->GetDouble(entry, entry.GetDescriptor()->FindFieldByNumber(2));
    }
  }
  void operator()(const char* name, std::vector<j::eval_sample>& v) const {
    v.clear();
    for (int i = 0, n = r()->FieldSize(*m, f(name)); i < n; ++i) {
      proto_reader rd{&r()->GetRepeatedMessage(*m, f(name), i), error};
      auto& s = v.emplace_back();
      rd("prompt", s.prompt), rd("response", s.response), rd("score", s.score),
          rd("conversation_json", s.conversation);
    }
  }
  template <class T>
  void operator()(const char* name, j::added_field<T> v) const {
    (*this)(name, v.value);
  }
};

// The variant alternative whose kind is `kind`, read from `msg`.
template <size_t I = 0>
bool read_body(std::string_view kind, const pb::Message& msg, j::event_body& out, std::string& error) {
  if constexpr (I == std::variant_size_v<j::event_body>) {
    return false;
  } else {
    using T = std::variant_alternative_t<I, j::event_body>;
    if (kind != T::kind)
      return read_body<I + 1>(kind, msg, out, error);
    T x;
    proto_reader rd{&msg, &error};
    fields(rd, x);
    out = std::move(x);
    return true;
  }
}

} // namespace

void to_proto(const j::event& e, v1::Event* out) {
  out->set_seq(e.seq);
  out->set_time_us(e.time_us);
  auto body = e.body; // fields() takes its struct by reference
  std::visit(
      [&](auto& x) {
        auto* fd = field_of(*out, x.kind);
        proto_writer w{out->GetReflection()->MutableMessage(out, fd)};
        fields(w, x);
      },
      body);
}

expected<j::event> from_proto(const v1::Event& e) {
  j::event out;
  out.seq = e.seq();
  out.time_us = e.time_us();
  const auto* oneof = e.GetDescriptor()->FindOneofByName("body");
  const auto* fd = e.GetReflection()->GetOneofFieldDescriptor(e, oneof);
  if (!fd)
    return make_error(errc::invalid_argument, "event " + std::to_string(e.seq()) + ": no body");
  std::string error;
  if (!read_body(fd->name(), e.GetReflection()->GetMessage(e, fd), out.body, error))
    return make_error(errc::invalid_argument,
                      "event " + std::to_string(e.seq()) + ": unknown kind " + fd->name());
  if (!error.empty())
    return make_error(errc::invalid_argument, "event " + std::to_string(e.seq()) + ": " + error);
  return out;
}

void to_proto(const job_view& v, v1::Job* out) {
  const auto& s = v.status;
  out->set_id(s.id);
  out->set_name(s.name);
  out->set_state(to_proto(v.state));
  out->set_stage(s.stage);
  out->set_iteration(s.iteration);
  out->set_total(s.total);
  out->set_phase(s.phase);
  out->set_submit_time_us(v.submit_time_us);
  out->set_start_time_us(s.start_time_us);
  out->set_end_time_us(v.end_time_us);
  out->set_eta_s(s.eta_s);
  out->mutable_last_metrics()->insert(s.last_metrics.begin(), s.last_metrics.end());
  out->mutable_weight_versions()->insert(s.weight_versions.begin(), s.weight_versions.end());
  out->set_error(s.error);
  out->set_last_seq(s.last_seq);
  out->set_run_dir(v.run_dir);
  out->set_driver_pid(v.driver_pid);
  out->set_exit_reason(v.exit_reason);
  out->set_queue_position(v.queue_position);
  for (const auto& n : v.nodes)
    out->add_nodes(n);
  out->set_wait_reason(v.wait_reason);
  out->set_resumable(v.resumable);
  for (const auto& t : v.transitions) {
    auto* p = out->add_transitions();
    p->set_state(to_proto(t.state)), p->set_time_us(t.time_us), p->set_reason(t.reason);
  }
  for (const auto& r : v.roles) {
    auto copy = r;
    proto_writer w{out->add_roles()};
    fields(w, copy);
  }
  out->set_resolved_config(v.resolved_config);
  for (const auto& st : v.stages)
    out->add_stages(st);
  auto totals = v.totals;
  proto_writer tw{out->mutable_totals()};
  fields(tw, totals);
}

expected<job_view> from_proto(const v1::Job& j) {
  job_view v;
  auto state = from_proto(j.state());
  if (!state)
    return with_prefix(state.error(), "job " + j.id() + ": state");
  v.state = *state;
  auto& s = v.status;
  if (auto js = j::parse_job_state(to_string(*state)))
    s.state = *js;
  s.id = j.id(), s.name = j.name(), s.stage = j.stage(), s.iteration = j.iteration();
  s.total = j.total(), s.phase = j.phase(), s.start_time_us = j.start_time_us(), s.eta_s = j.eta_s();
  s.last_metrics.insert(j.last_metrics().begin(), j.last_metrics().end());
  s.weight_versions.insert(j.weight_versions().begin(), j.weight_versions().end());
  s.error = j.error(), s.last_seq = j.last_seq();
  v.submit_time_us = j.submit_time_us(), v.end_time_us = j.end_time_us(), v.run_dir = j.run_dir();
  v.driver_pid = j.driver_pid(), v.exit_reason = j.exit_reason();
  v.queue_position = j.queue_position(), v.resumable = j.resumable();
  v.nodes.assign(j.nodes().begin(), j.nodes().end());
  v.wait_reason = j.wait_reason();
  for (const auto& t : j.transitions()) {
    auto ts = from_proto(t.state());
    if (!ts)
      return with_prefix(ts.error(), "job " + j.id() + ": transition");
    v.transitions.push_back({*ts, t.time_us(), t.reason()});
  }
  for (const auto& r : j.roles()) {
    std::string error;
    proto_reader rd{&r, &error};
    fields(rd, v.roles.emplace_back());
  }
  v.resolved_config = j.resolved_config();
  v.stages.assign(j.stages().begin(), j.stages().end());
  std::string error;
  proto_reader tr{&j.totals(), &error};
  fields(tr, v.totals);
  return v;
}

// ---- nodes ---------------------------------------------------------------

namespace {

// node_state ↔ NodeState, in one table.
constexpr std::pair<node_state, v1::NodeState> node_states[] = {
    {node_state::ready, v1::NODE_STATE_READY},
    {node_state::lost, v1::NODE_STATE_LOST},
    {node_state::left, v1::NODE_STATE_LEFT},
};

} // namespace

void to_proto(const node_resources& r, v1::NodeResources* out) {
  out->set_cores(r.cores);
  out->set_memory_bytes(r.memory_bytes);
  out->set_gpus(r.gpus);
}

node_resources from_proto(const v1::NodeResources& r) {
  return {r.cores(), r.memory_bytes(), r.gpus()};
}

void to_proto(const node_hello& h, v1::NodeHello* out) {
  out->set_name(h.name);
  out->set_advertise_host(h.advertise_host);
  to_proto(h.resources, out->mutable_resources());
  out->set_version(h.version);
  out->set_pid(h.pid);
}

node_hello from_proto(const v1::NodeHello& h) {
  return {h.name(), h.advertise_host(), from_proto(h.resources()), h.version(), h.pid()};
}

void to_proto(const worker_start& s, v1::StartWorker* out) {
  out->set_job_id(s.job_id);
  out->set_rank(s.rank);
  out->set_world(s.world);
  out->set_label(s.label);
  out->set_driver(s.driver);
  out->set_cwd(s.cwd);
  out->set_timeout_ms(s.timeout_ms);
}

worker_start from_proto(const v1::StartWorker& s) {
  return {s.job_id(), s.rank(), s.world(), s.label(), s.driver(), s.cwd(), s.timeout_ms()};
}

void to_proto(const worker_exit& x, v1::WorkerExited* out) {
  out->set_job_id(x.job_id);
  out->set_rank(x.rank);
  out->set_pid(x.pid);
  out->set_code(x.code);
  out->set_signal(x.signal);
  out->set_description(x.description);
  out->set_output_tail(x.output_tail);
}

worker_exit from_proto(const v1::WorkerExited& x) {
  return {x.job_id(), x.rank(), x.pid(), x.code(), x.signal(), x.description(), x.output_tail()};
}

void to_proto(const node_view& n, v1::Node* out) {
  out->set_name(n.name);
  for (auto [mine, theirs] : node_states)
    if (mine == n.state)
      out->set_state(theirs);
  out->set_address(n.address);
  out->set_peer(n.peer);
  to_proto(n.resources, out->mutable_resources());
  out->set_joined_time_us(n.joined_time_us);
  out->set_last_heartbeat_us(n.last_heartbeat_us);
  out->set_reason(n.reason);
  out->set_version(n.version);
  out->set_agent_pid(n.agent_pid);
  out->set_state_time_us(n.state_time_us);
}

expected<node_view> from_proto(const v1::Node& n) {
  node_view out;
  bool known = false;
  for (auto [mine, theirs] : node_states)
    if (theirs == n.state())
      out.state = mine, known = true;
  if (!known)
    return make_error(errc::parse_error, "node '" + n.name() + "': state " + std::to_string(n.state()) +
                                             " is not a node state");
  out.name = n.name();
  out.address = n.address();
  out.peer = n.peer();
  out.resources = from_proto(n.resources());
  out.joined_time_us = n.joined_time_us();
  out.last_heartbeat_us = n.last_heartbeat_us();
  out.reason = n.reason();
  out.version = n.version();
  out.agent_pid = n.agent_pid();
  out.state_time_us = n.state_time_us();
  return out;
}

} // namespace troupe::cluster
