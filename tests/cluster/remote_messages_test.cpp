// Messages that cross processes: a tensor_batch and a weight channel travel
// between two actor systems through CAF's middleman (serialised, sent over
// loopback TCP, rebuilt) and come back equal.
#include "actors/actor_system.hpp"
#include "actors/inference/rollout.hpp"
#include "cluster/workers.hpp"
#include "runtime/tensor_batch.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace troupe;

namespace {

struct node {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  node() {
    actors::configure(cfg);
    cluster::configure_network(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

} // namespace

TEST(RemoteMessages, TensorBatchesAndChannelsCrossTheMiddleman) {
  node server;
  node client;
  auto echo = server.sys->spawn([](caf::event_based_actor*) -> caf::behavior {
    return {
        [](const runtime::tensor_batch& b) { return b; },
        [](const actors::inference::weight_channel& c) { return c; },
    };
  });
  // The systems wait for their actors when destroyed: stop the echo actor
  // on every way out of the test.
  struct stop_at_exit {
    caf::actor a;
    ~stop_at_exit() { caf::anon_send_exit(a, caf::exit_reason::user_shutdown); }
  } stop{echo};
  auto port = server.sys->middleman().publish(echo, 0, "127.0.0.1");
  ASSERT_TRUE(port) << server.sys->render(port.error());
  auto remote = client.sys->middleman().remote_actor("127.0.0.1", *port);
  ASSERT_TRUE(remote) << client.sys->render(remote.error());

  runtime::tensor_batch b;
  ASSERT_TRUE(b.set("tokens", torch::arange(10, torch::kLong).view({2, 5})));
  ASSERT_TRUE(b.set("old_logp", torch::randn({2, 5})));
  caf::scoped_actor self{*client.sys};
  bool answered = false;
  self->request(*remote, std::chrono::seconds(10), b)
      .receive(
          [&](const runtime::tensor_batch& got) {
            answered = true;
            ASSERT_EQ(got.tensors().size(), 2u);
            for (const auto& [name, t] : b.tensors()) {
              auto g = got.get(name);
              ASSERT_TRUE(g) << name;
              EXPECT_TRUE(torch::equal(*g, t)) << name;
              // A real copy: the reply does not share the sender's storage.
              EXPECT_NE(g->data_ptr(), t.data_ptr()) << name;
            }
          },
          [&](caf::error& e) { ADD_FAILURE() << client.sys->render(e); });
  EXPECT_TRUE(answered);

  actors::inference::weight_channel c;
  c.kind = "shm";
  c.channel = "job-7-rl";
  c.keep = 3;
  self->request(*remote, std::chrono::seconds(10), c)
      .receive(
          [&](const actors::inference::weight_channel& got) {
            EXPECT_EQ(got.kind, "shm");
            EXPECT_EQ(got.channel, "job-7-rl");
            EXPECT_EQ(got.keep, 3);
          },
          [&](caf::error& e) { ADD_FAILURE() << client.sys->render(e); });
}
