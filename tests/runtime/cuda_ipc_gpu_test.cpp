// The cuda_ipc weight transport between two processes on one GPU: the
// receiver maps the publisher's device buffer and sees bit-identical
// tensors; a stale version and a CPU tensor are refused. Skips without a GPU
// (CUDA IPC handles cannot be opened in the process that made them, so the
// publisher is a forked child that touches CUDA only after the fork).
#include "kernels/cuda_device.hpp"
#include "runtime/weight_transport.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/wait.h>
#include <unistd.h>

using namespace troupe;
using namespace troupe::runtime;

namespace {

tensor_map cpu_weights() {
  torch::manual_seed(3);
  return {{"a.weight", torch::randn({64, 33})},
          {"b.bias", torch::randn({7}).to(torch::kHalf)},
          {"c.ids", torch::arange(0, 1000, torch::kLong)}};
}

transport_options ipc_options(const std::string& channel) {
  transport_options o;
  o.kind = transport_kind::cuda_ipc;
  o.channel = channel;
  o.keep = 2;
  o.timeout_ms = 20000;
  return o;
}

} // namespace

TEST(CudaIpcTransport, AnotherProcessSeesTheSameTensorsWithoutACopy) {
  if (!kernels::cuda_compiled())
    GTEST_SKIP() << "built without CUDA";
  if (kernels::cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device";
  auto channel = "cudaipctest-" + std::to_string(::getpid());
  int go[2], done[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(done), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The publisher: CUDA is first touched here, after the fork (and no
    // OpenMP pool of the parent's is used).
    torch::set_num_threads(1);
    auto t = make_weight_transport(ipc_options(channel));
    if (!t)
      ::_exit(10);
    tensor_map dev;
    for (const auto& [name, x] : cpu_weights())
      dev.emplace(name, x.to(torch::kCUDA));
    if (!(*t)->publish(1, dev))
      ::_exit(11);
    auto bad = (*t)->publish(2, cpu_weights()); // CPU tensors are refused
    if (bad)
      ::_exit(12);
    char c = 1;
    if (::write(go[1], &c, 1) != 1)
      ::_exit(13);
    (void)::read(done[0], &c, 1); // keep the buffer alive until the reader is done
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(go[0], &c, 1), 1);
  {
    auto t = make_weight_transport(ipc_options(channel));
    ASSERT_TRUE(t) << describe(t.error());
    auto stale = (*t)->receive(0);
    EXPECT_FALSE(stale);
    auto got = (*t)->receive(1);
    ASSERT_TRUE(got) << describe(got.error());
    auto want = cpu_weights();
    ASSERT_EQ(got->tensors.size(), want.size());
    for (const auto& [name, x] : want) {
      const auto& y = got->tensors.at(name);
      EXPECT_TRUE(y.is_cuda()) << name;
      EXPECT_TRUE(torch::equal(y.cpu(), x)) << name;
    }
  }
  c = 1;
  ASSERT_EQ(::write(done[1], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "publisher status " << status;
}

TEST(CudaIpcTransport, RefusesCpuTensorsOrSaysWhyItCannotRun) {
  auto t = make_weight_transport(ipc_options("cudaipccpu-" + std::to_string(::getpid())));
  if (!kernels::cuda_compiled()) {
    ASSERT_FALSE(t);
    EXPECT_NE(describe(t.error()).find("no CUDA"), std::string::npos) << describe(t.error());
    return;
  }
  ASSERT_TRUE(t) << describe(t.error());
  auto r = (*t)->publish(1, cpu_weights());
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("this transport carries CUDA tensors"), std::string::npos)
      << describe(r.error());
}
