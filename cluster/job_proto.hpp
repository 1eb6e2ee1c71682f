#pragma once
// The job API's messages (proto/troupe/v1/job_service.proto) from and to
// troupe's plain structs — the one place that knows both. Events convert
// field by field through protobuf reflection, driven by the same `fields`
// description as their JSON form (NOTE [job events]): each event kind is
// the name of a field of Event's `body` oneof, and each payload field keeps
// its name, so a new kind or field needs its .proto line and nothing here.

#include "cluster/controller.hpp"
#include "cluster/job_nodes.hpp"
#include "cluster/node_registry.hpp"

#include "troupe/v1/job_service.pb.h"

namespace troupe::cluster {

v1::JobState to_proto(ctl_state s) noexcept;
/// QUEUED..LOST; an unspecified or unknown value is an error.
expected<ctl_state> from_proto(v1::JobState s);

void to_proto(const actors::job::event& e, v1::Event* out);
/// Errors name what is missing (an empty body, an unknown state).
expected<actors::job::event> from_proto(const v1::Event& e);

void to_proto(const job_view& v, v1::Job* out);
expected<job_view> from_proto(const v1::Job& j);

void to_proto(const node_resources& r, v1::NodeResources* out);
node_resources from_proto(const v1::NodeResources& r);
void to_proto(const node_hello& h, v1::NodeHello* out);
node_hello from_proto(const v1::NodeHello& h);
void to_proto(const node_view& n, v1::Node* out);
expected<node_view> from_proto(const v1::Node& n);
void to_proto(const worker_start& s, v1::StartWorker* out);
worker_start from_proto(const v1::StartWorker& s);
void to_proto(const worker_exit& x, v1::WorkerExited* out);
worker_exit from_proto(const v1::WorkerExited& x);

} // namespace troupe::cluster
