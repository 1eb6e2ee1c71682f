#pragma once
// troupe.v1.NodeService: where node agents join the controller (NOTE [node
// membership] in node_registry.hpp). It is served on the API's port, behind
// the same TLS, and authenticates agents by the cluster secret (not the API
// token: an agent cannot submit or cancel jobs). Joins, leaves, losses and
// refusals are written to the audit log.

#include "cluster/node_registry.hpp"

#include <memory>
#include <string>

namespace grpc {
class Service;
} // namespace grpc

namespace troupe::cluster {

class job_store;

class node_service {
public:
  /// Serves `nodes`, checking agents against `secret`; audits to `store`.
  /// Starts the sweep that finds silent nodes.
  node_service(node_registry& nodes, job_store& store, std::string secret);
  ~node_service(); ///< Stops the sweep.
  node_service(const node_service&) = delete;
  node_service& operator=(const node_service&) = delete;

  /// To register on a grpc::ServerBuilder.
  grpc::Service* service();

  struct impl;

private:
  std::unique_ptr<impl> impl_;
};

} // namespace troupe::cluster
