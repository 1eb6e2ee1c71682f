#pragma once
// troupe's error codes as gRPC status codes: the one mapping (ARCHITECTURE.md,
// rule 1). A troupe error becomes a grpc::Status whose message is the
// error's context and whose details (grpc-status-details-bin) hold a
// troupe.v1.Status with an ErrorDetail: the code's name and, for a list of
// violations (a spec that does not load), each violation on its own.

#include "runtime/error.hpp"

#include <grpcpp/support/status.h>

#include <optional>
#include <string>
#include <vector>

namespace grpc {
class ServerContextBase;
} // namespace grpc

namespace troupe::cluster {

/// The gRPC code of a troupe error code (every errc has one).
grpc::StatusCode grpc_code_of(errc code) noexcept;

/// "NOT_FOUND", "UNAUTHENTICATED", ... (the code's name in the gRPC docs).
std::string grpc_status_name(grpc::StatusCode code);

/// The HTTP status of a gRPC code (the dashboard's JSON API): the usual
/// gateway table (INVALID_ARGUMENT 400, NOT_FOUND 404, ...).
int http_status_of(grpc::StatusCode code) noexcept;

/// The status of `err` (OK for no error).
grpc::Status to_grpc_status(const caf::error& err);

/// A status without a troupe error behind it (auth, limits).
grpc::Status grpc_status(errc code, const std::string& message);

/// What a client reads back from a status: the troupe code (from the
/// details, else the closest code of the gRPC status) and the violations.
struct status_detail {
  errc code = errc::internal;
  std::string message;
  std::vector<std::string> violations;
};
status_detail detail_of(const grpc::Status& status);

// ---- the server side of every service (api_server, node_service)

/// A client metadata value ("" when absent).
std::string metadata_of(const grpc::ServerContextBase* ctx, const std::string& key);
/// The caller, for the audit log: its address, the certificate's name under
/// mutual TLS, and the user name it gave (x-troupe-user, not verified).
std::string caller_of(const grpc::ServerContextBase* ctx);
/// "ok", or "CODE: message" (an audit record's result).
std::string result_of(const grpc::Status& st);
/// OK when the call carries `authorization: Bearer <secret>` (compared in
/// constant time), else UNAUTHENTICATED saying what is missing or wrong;
/// `name` names the secret ("token"), `hint` where it is found.
grpc::Status check_bearer(const grpc::ServerContextBase* ctx, const std::string& secret,
                          const std::string& name, const std::string& hint);

} // namespace troupe::cluster
