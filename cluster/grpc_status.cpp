#include "cluster/grpc_status.hpp"

#include "cluster/credentials.hpp"

#include "troupe/v1/job_service.pb.h"

#include <grpcpp/server_context.h>

#include <string_view>

namespace troupe::cluster {

grpc::StatusCode grpc_code_of(errc code) noexcept {
  using grpc::StatusCode;
  // A switch without default: the compiler names an errc left out.
  switch (code) {
  case errc::none: return StatusCode::OK;
  case errc::invalid_argument: return StatusCode::INVALID_ARGUMENT;
  case errc::invalid_config: return StatusCode::INVALID_ARGUMENT;
  case errc::parse_error: return StatusCode::INVALID_ARGUMENT;
  case errc::io_error: return StatusCode::INTERNAL;
  case errc::not_found: return StatusCode::NOT_FOUND;
  case errc::out_of_range: return StatusCode::OUT_OF_RANGE;
  case errc::unsupported: return StatusCode::UNIMPLEMENTED;
  case errc::shape_mismatch: return StatusCode::INVALID_ARGUMENT;
  case errc::timeout: return StatusCode::DEADLINE_EXCEEDED;
  case errc::unavailable: return StatusCode::UNAVAILABLE;
  case errc::cancelled: return StatusCode::CANCELLED;
  case errc::version_mismatch: return StatusCode::FAILED_PRECONDITION;
  case errc::corrupted: return StatusCode::DATA_LOSS;
  case errc::process_failed: return StatusCode::ABORTED;
  case errc::internal: return StatusCode::INTERNAL;
  case errc::illegal_state: return StatusCode::FAILED_PRECONDITION;
  case errc::lost:
    return StatusCode::UNAVAILABLE;
  }
  return StatusCode::INTERNAL;
}

int http_status_of(grpc::StatusCode code) noexcept {
  switch (code) {
  case grpc::StatusCode::OK: return 200;
  case grpc::StatusCode::CANCELLED: return 499;
  case grpc::StatusCode::INVALID_ARGUMENT:
  case grpc::StatusCode::FAILED_PRECONDITION:
  case grpc::StatusCode::OUT_OF_RANGE: return 400;
  case grpc::StatusCode::UNAUTHENTICATED: return 401;
  case grpc::StatusCode::PERMISSION_DENIED: return 403;
  case grpc::StatusCode::NOT_FOUND: return 404;
  case grpc::StatusCode::ALREADY_EXISTS:
  case grpc::StatusCode::ABORTED: return 409;
  case grpc::StatusCode::RESOURCE_EXHAUSTED: return 429;
  case grpc::StatusCode::UNIMPLEMENTED: return 501;
  case grpc::StatusCode::UNAVAILABLE: return 503;
  case grpc::StatusCode::DEADLINE_EXCEEDED: return 504;
  default: return 500;
  }
}

std::string grpc_status_name(grpc::StatusCode code) {
  static const char* names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
                                "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  auto c = static_cast<int>(code);
  return c >= 0 && c < 17 ? names[c] : "CODE_" + std::to_string(c);
}

namespace {

grpc::Status make_status(errc code, const std::string& message,
                         const std::vector<std::string>& violations) {
  auto grpc_code = grpc_code_of(code);
  v1::ErrorDetail detail;
  detail.set_code(std::string{to_string(code)});
  for (const auto& v : violations)
    detail.add_violations(v);
  v1::Status status;
  status.set_code(static_cast<int32_t>(grpc_code));
  status.set_message(message);
  status.add_details()->PackFrom(detail);
  return grpc::Status{grpc_code, message, status.SerializeAsString()};
}

// The troupe code a client falls back to when a status has no details (one
// sent by gRPC itself: a deadline, a dropped connection).
errc closest_errc(grpc::StatusCode code) noexcept {
  using grpc::StatusCode;
  switch (code) {
  case StatusCode::OK: return errc::none;
  case StatusCode::INVALID_ARGUMENT: return errc::invalid_argument;
  case StatusCode::NOT_FOUND: return errc::not_found;
  case StatusCode::OUT_OF_RANGE: return errc::out_of_range;
  case StatusCode::UNIMPLEMENTED: return errc::unsupported;
  case StatusCode::DEADLINE_EXCEEDED: return errc::timeout;
  case StatusCode::UNAVAILABLE: return errc::unavailable;
  case StatusCode::CANCELLED: return errc::cancelled;
  case StatusCode::FAILED_PRECONDITION: return errc::illegal_state;
  case StatusCode::DATA_LOSS: return errc::corrupted;
  case StatusCode::ABORTED: return errc::process_failed;
  case StatusCode::RESOURCE_EXHAUSTED: return errc::out_of_range;
  case StatusCode::UNAUTHENTICATED:
  case StatusCode::PERMISSION_DENIED: return errc::invalid_argument;
  default: return errc::internal;
  }
}

} // namespace

grpc::Status to_grpc_status(const caf::error& err) {
  if (!err)
    return grpc::Status::OK;
  auto code = code_of(err);
  auto message = context_of(err);
  if (message.empty())
    message = describe(err);
  return make_status(code, message, violations_of(err));
}

grpc::Status grpc_status(errc code, const std::string& message) {
  return make_status(code, message, {});
}

status_detail detail_of(const grpc::Status& status) {
  status_detail out;
  out.message = status.error_message();
  out.code = closest_errc(status.error_code());
  v1::Status s;
  if (status.error_details().empty() || !s.ParseFromString(status.error_details()))
    return out;
  for (const auto& any : s.details()) {
    v1::ErrorDetail d;
    if (!any.UnpackTo(&d))
      continue;
    for (uint8_t i = 0; i < errc_count; ++i)
      if (to_string(static_cast<errc>(i)) == d.code())
        out.code = static_cast<errc>(i);
    out.violations.assign(d.violations().begin(), d.violations().end());
  }
  return out;
}

// ---- the server side of every service -----------------------------------

std::string metadata_of(const grpc::ServerContextBase* ctx, const std::string& key) {
  auto it = ctx->client_metadata().find(key);
  if (it == ctx->client_metadata().end())
    return {};
  return std::string{it->second.data(), it->second.size()};
}

std::string caller_of(const grpc::ServerContextBase* ctx) {
  std::string out = ctx->peer();
  if (auto auth = ctx->auth_context(); auth && auth->IsPeerAuthenticated())
    for (const auto& id : auth->GetPeerIdentity())
      out += " cert=" + std::string{id.data(), id.size()};
  auto user = metadata_of(ctx, "x-troupe-user");
  if (!user.empty())
    out += " user=" + user.substr(0, 64);
  return out;
}

std::string result_of(const grpc::Status& st) {
  if (st.ok())
    return "ok";
  return grpc_status_name(st.error_code()) + ": " + st.error_message().substr(0, 500);
}

grpc::Status check_bearer(const grpc::ServerContextBase* ctx, const std::string& secret,
                          const std::string& name, const std::string& hint) {
  auto header = metadata_of(ctx, "authorization");
  constexpr std::string_view bearer = "Bearer ";
  if (header.size() <= bearer.size() || header.compare(0, bearer.size(), bearer) != 0)
    return {grpc::StatusCode::UNAUTHENTICATED,
            "missing 'authorization: Bearer <" + name + ">' metadata (" + hint + ")"};
  if (!same_secret(std::string_view{header}.substr(bearer.size()), secret))
    return {grpc::StatusCode::UNAUTHENTICATED, "wrong " + name};
  return grpc::Status::OK;
}

} // namespace troupe::cluster
