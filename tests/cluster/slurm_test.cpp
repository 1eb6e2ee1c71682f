// What a Slurm allocation offers, read from the variables sbatch sets: host
// lists and per-node counts in Slurm's compressed syntax, and a clear error
// outside an allocation.
#include "cluster/slurm.hpp"

#include <gtest/gtest.h>

#include <map>

using namespace troupe;
using namespace troupe::cluster;

TEST(Slurm, HostListsExpandAsSlurmWritesThem) {
  auto l = expand_hostlist("node[01-03,7],gpu-a,rack2-[9-10]x");
  ASSERT_TRUE(l) << describe(l.error());
  EXPECT_EQ(*l, (std::vector<std::string>{"node01", "node02", "node03", "node7", "gpu-a", "rack2-9x", "rack2-10x"}));
  EXPECT_EQ(*expand_hostlist("vm"), std::vector<std::string>{"vm"});
  for (const char* bad : {"", "a,,b", "n[1-", "n[3-1]", "n[a]", "n]1[", "n[1][2]", "n[1-999999999]"}) {
    auto r = expand_hostlist(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(describe(r.error()).find("host list '"), std::string::npos) << describe(r.error());
  }
}

TEST(Slurm, CountsPerNodeExpand) {
  auto c = expand_counts("2(x3),1");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(*c, (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(*expand_counts("64"), std::vector<int>{64});
  for (const char* bad : {"", "2(x)", "2(x0)", "x", "2(3)", "-1"})
    EXPECT_FALSE(expand_counts(bad)) << bad;
}

TEST(Slurm, TheAllocationComesFromTheEnvironment) {
  std::map<std::string, std::string> env{{"SLURM_JOB_ID", "77"},
                                         {"SLURM_JOB_NODELIST", "n[1-2]"},
                                         {"SLURM_JOB_CPUS_PER_NODE", "8(x2)"},
                                         {"SLURM_SUBMIT_DIR", "/shared/me"}};
  auto look = [&](const char* k) -> const char* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto a = read_allocation(look);
  ASSERT_TRUE(a) << describe(a.error());
  EXPECT_EQ(a->job_id, "77");
  EXPECT_EQ(a->nodes, (std::vector<std::string>{"n1", "n2"}));
  EXPECT_EQ(a->cpus, (std::vector<int>{8, 8}));
  EXPECT_EQ(a->submit_dir, "/shared/me");

  env["SLURM_JOB_CPUS_PER_NODE"] = "8";
  a = read_allocation(look);
  ASSERT_FALSE(a);
  EXPECT_NE(describe(a.error()).find("SLURM_JOB_CPUS_PER_NODE lists 1 nodes, SLURM_JOB_NODELIST 2"), std::string::npos);
  env.erase("SLURM_JOB_ID");
  a = read_allocation(look);
  ASSERT_FALSE(a);
  EXPECT_NE(describe(a.error()).find("not inside a Slurm allocation"), std::string::npos);
}
