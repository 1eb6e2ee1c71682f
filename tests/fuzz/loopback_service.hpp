#pragma once
// A gRPC service of a fuzz target's own on an ephemeral loopback port, for
// the targets that play a hostile peer (reward_service,
// environment_service): one per process, leaked on purpose (gRPC's threads
// outlive static destructors otherwise) and shut down at exit.

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace troupe::fuzz {

template <class Service>
struct loopback_peer {
  Service service;
  std::unique_ptr<grpc::Server> server;
  std::string address;

  static loopback_peer& get() {
    static loopback_peer* p = [] {
      auto* r = new loopback_peer;
      int port = 0;
      grpc::ServerBuilder b;
      b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      b.RegisterService(&r->service);
      r->server = b.BuildAndStart();
      if (!r->server || port == 0)
        std::abort();
      r->address = "127.0.0.1:" + std::to_string(port);
      std::atexit([] { get().server->Shutdown(); });
      return r;
    }();
    return *p;
  }
};

} // namespace troupe::fuzz
