// Fuzz target: troupe.v1.NodeService (cluster/node_service.hpp), where node
// agents join the controller — a bidirectional stream anyone who reaches
// the port can open. Each input is one Attach stream through a real server
// and its real authentication (fuzz/control_plane.hpp): the first byte
// picks the credentials (mod 3: the cluster secret, a wrong one, none);
// the rest is a sequence of agent messages, each a 2-byte little-endian
// length and the AgentMessage in protobuf's wire form (a part that does
// not parse is skipped). The controller answers or ends the stream with a
// status; without the secret that status is UNAUTHENTICATED; no stream
// ends UNKNOWN (an exception escaping a handler). LibTorch-linked: a
// replay executable of the normal build (scripts/fuzz.sh).
#include "tests/fuzz/control_plane.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include "troupe/v1/node_service.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

using namespace troupe;
namespace v1 = troupe::v1;

namespace {

v1::NodeService::Stub& stub() {
  static auto s = v1::NodeService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(fuzz::control_plane::get().api->port()),
                          grpc::InsecureChannelCredentials()));
  return *s;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const int creds = data[0] % 3;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (creds == 0)
    ctx.AddMetadata("authorization", "Bearer " + fuzz::control_plane::get().secret);
  else if (creds == 1)
    ctx.AddMetadata("authorization", "Bearer not-the-secret-0123456789abcdef");
  auto s = stub().Attach(&ctx);
  for (size_t at = 1; at + 2 <= size;) {
    const size_t n = data[at] | (size_t{data[at + 1]} << 8);
    at += 2;
    const size_t take = std::min(n, size - at);
    v1::AgentMessage m;
    if (m.ParseFromArray(data + at, static_cast<int>(take)) && !s->Write(m))
      break;
    at += take;
  }
  s->WritesDone();
  v1::ControllerMessage reply;
  int replies = 0;
  while (replies < 16 && s->Read(&reply))
    ++replies;
  if (replies == 16) // still open: ours to end
    ctx.TryCancel();
  const auto st = s->Finish();
  if (creds != 0 && st.error_code() != grpc::StatusCode::UNAUTHENTICATED) {
    std::fprintf(stderr, "node_service_fuzz: without the secret: status %d (%s)\n",
                 static_cast<int>(st.error_code()), st.error_message().c_str());
    fuzz::broken();
  }
  if (st.error_code() == grpc::StatusCode::UNKNOWN)
    fuzz::broken();
  return 0;
}
