// Fuzz target: the controller's gRPC API, troupe.v1.JobService
// (cluster/api_server.hpp) — what anyone who reaches the port sends. Each
// input is one call through a real server and the real authentication
// path (fuzz/control_plane.hpp): the first byte picks the method (mod 12)
// and the credentials (÷ 12 mod 3: the token, a wrong token, none); the
// rest is the request message in protobuf's wire form (inputs that do not
// parse as it are skipped). A call without the token is UNAUTHENTICATED,
// whatever it asks; no call ends UNKNOWN (an exception escaping a handler)
// (an in-process server that went down ends the process). LibTorch-linked: a replay executable of
// the normal build (scripts/fuzz.sh).
#include "tests/fuzz/control_plane.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include "troupe/v1/job_service.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>

using namespace troupe;
namespace v1 = troupe::v1;

namespace {

v1::JobService::Stub& stub() {
  static auto s = v1::JobService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(fuzz::control_plane::get().api->port()),
                          grpc::InsecureChannelCredentials()));
  return *s;
}

void set_credentials(grpc::ClientContext& ctx, int which) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (which == 0)
    ctx.AddMetadata("authorization", "Bearer " + fuzz::control_plane::get().token);
  else if (which == 1)
    ctx.AddMetadata("authorization", "Bearer not-the-token-0123456789abcdef");
}

template <class Req, class Call>
grpc::Status unary(const uint8_t* data, size_t size, int creds, bool* parsed, Call call) {
  Req req;
  *parsed = req.ParseFromArray(data, static_cast<int>(size));
  if (!*parsed)
    return grpc::Status::OK;
  grpc::ClientContext ctx;
  set_credentials(ctx, creds);
  return call(ctx, req);
}

template <class Req, class Msg, class Open>
grpc::Status stream(const uint8_t* data, size_t size, int creds, bool* parsed, Open open) {
  Req req;
  *parsed = req.ParseFromArray(data, static_cast<int>(size));
  if (!*parsed)
    return grpc::Status::OK;
  grpc::ClientContext ctx;
  set_credentials(ctx, creds);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  auto reader = open(ctx, req);
  Msg m;
  int read = 0;
  while (read < 64 && reader->Read(&m))
    ++read;
  if (read == 64) // still open: ours to end
    ctx.TryCancel();
  return reader->Finish();
}

grpc::Status call(int method, const uint8_t* d, size_t n, int c, bool* parsed) {
  auto& s = stub();
  v1::Job job;
  switch (method) {
  case 0:
    return unary<v1::ListJobsRequest>(d, n, c, parsed, [&](auto& ctx, auto& r) {
      v1::ListJobsResponse out;
      return s.ListJobs(&ctx, r, &out);
    });
  case 1:
    return unary<v1::JobRef>(d, n, c, parsed,
                             [&](auto& ctx, auto& r) { return s.GetJob(&ctx, r, &job); });
  case 2:
    return stream<v1::WatchJobRequest, v1::WatchJobResponse>(
        d, n, c, parsed, [&](auto& ctx, auto& r) { return s.WatchJob(&ctx, r); });
  case 3:
    return unary<v1::GetMetricsRequest>(d, n, c, parsed, [&](auto& ctx, auto& r) {
      v1::GetMetricsResponse out;
      return s.GetMetrics(&ctx, r, &out);
    });
  case 4:
    return stream<v1::TailLogsRequest, v1::LogLine>(
        d, n, c, parsed, [&](auto& ctx, auto& r) { return s.TailLogs(&ctx, r); });
  case 5:
    return unary<v1::ListNodesRequest>(d, n, c, parsed, [&](auto& ctx, auto& r) {
      v1::ListNodesResponse out;
      return s.ListNodes(&ctx, r, &out);
    });
  case 6:
    return unary<v1::SubmitJobRequest>(
        d, n, c, parsed, [&](auto& ctx, auto& r) { return s.SubmitJob(&ctx, r, &job); });
  case 7:
    return unary<v1::CancelJobRequest>(
        d, n, c, parsed, [&](auto& ctx, auto& r) { return s.CancelJob(&ctx, r, &job); });
  case 8:
    return unary<v1::JobRef>(d, n, c, parsed,
                             [&](auto& ctx, auto& r) { return s.PauseJob(&ctx, r, &job); });
  case 9:
    return unary<v1::JobRef>(d, n, c, parsed,
                             [&](auto& ctx, auto& r) { return s.ResumeJob(&ctx, r, &job); });
  case 10:
    return unary<v1::JobRef>(d, n, c, parsed,
                             [&](auto& ctx, auto& r) { return s.CheckpointJob(&ctx, r, &job); });
  default:
    return unary<v1::UpdateJobRequest>(
        d, n, c, parsed, [&](auto& ctx, auto& r) { return s.UpdateJob(&ctx, r, &job); });
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const int method = data[0] % 12, creds = data[0] / 12 % 3;
  bool parsed = false;
  const auto st = call(method, data + 1, size - 1, creds, &parsed);
  if (!parsed)
    return 0;
  const bool refused = st.error_code() == grpc::StatusCode::UNAUTHENTICATED;
  // (UNAVAILABLE is an answer too: a job whose driver is starting.)
  const bool failed = st.error_code() == grpc::StatusCode::UNKNOWN;
  if ((creds != 0 && !refused) || failed) {
    std::fprintf(stderr, "job_service_fuzz: method %d, credentials %d: status %d (%s)\n", method,
                 creds, static_cast<int>(st.error_code()), st.error_message().c_str());
    fuzz::broken();
  }
  return 0;
}
