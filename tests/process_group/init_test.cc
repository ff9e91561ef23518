// Launcher environment parsing and init-method URLs: pure functions, no network.
#include "loom/process_group/init.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "loom/common/error.h"

namespace loom {
namespace {

using ::testing::HasSubstr;

// Runs fn and returns the InvalidArgumentError's message ("" when nothing was thrown).
template <typename Fn>
std::string invalidArgumentMessage(Fn&& fn) {
  try {
    fn();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

TEST(ParseLaunchEnv, Torchrun) {
  const LaunchEnv env = parseLaunchEnv({{"RANK", "3"},
                                        {"WORLD_SIZE", "8"},
                                        {"LOCAL_RANK", "1"},
                                        {"LOCAL_WORLD_SIZE", "2"},
                                        {"MASTER_ADDR", "node7"},
                                        {"MASTER_PORT", "29500"}});
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.worldSize, 8);
  EXPECT_EQ(env.localRank, 1);
  EXPECT_EQ(env.localWorldSize, 2);
  EXPECT_EQ(env.masterAddr, "node7");
  EXPECT_EQ(env.masterPort, 29500);
}

TEST(ParseLaunchEnv, LocalVariablesDefaultToGlobalOnes) {
  const LaunchEnv env = parseLaunchEnv(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(env.localRank, 1);
  EXPECT_EQ(env.localWorldSize, 2);
}

TEST(ParseLaunchEnv, MissingAndInvalidVariablesAreNamed) {
  EXPECT_THAT(invalidArgumentMessage([] { parseLaunchEnv({}); }), HasSubstr("RANK is not set"));
  EXPECT_THAT(invalidArgumentMessage([] {
                parseLaunchEnv({{"RANK", "0"}});
              }),
              HasSubstr("WORLD_SIZE is not set; expected the number of processes"));
  EXPECT_THAT(invalidArgumentMessage([] {
                parseLaunchEnv({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
              }),
              HasSubstr("RANK='x' is not valid; expected this process's rank"));
  EXPECT_THAT(invalidArgumentMessage([] {
                parseLaunchEnv({{"RANK", "-1"}, {"WORLD_SIZE", "2"}});
              }),
              HasSubstr("RANK='-1' is not valid"));
  EXPECT_THAT(
      invalidArgumentMessage([] {
        parseLaunchEnv(
            {{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
      }),
      HasSubstr("RANK=2 is out of range for WORLD_SIZE=2"));
  EXPECT_THAT(invalidArgumentMessage([] {
                parseLaunchEnv({{"RANK", "0"}, {"WORLD_SIZE", "0"}});
              }),
              HasSubstr("WORLD_SIZE=0 is not valid"));
  EXPECT_THAT(invalidArgumentMessage([] {
                parseLaunchEnv({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
              }),
              HasSubstr("MASTER_ADDR is not set"));
  EXPECT_THAT(invalidArgumentMessage([] {
                parseLaunchEnv({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}});
              }),
              HasSubstr("MASTER_PORT is not set"));
  EXPECT_THAT(
      invalidArgumentMessage([] {
        parseLaunchEnv(
            {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}});
      }),
      HasSubstr("MASTER_PORT='70000' is not valid; expected a TCP port number (1-65535)"));
  // Without env:// the master address is not needed.
  EXPECT_NO_THROW(parseLaunchEnv({{"RANK", "0"}, {"WORLD_SIZE", "2"}}, /*needMaster=*/false));
}

TEST(ParseLaunchEnv, Slurm) {
  const LaunchEnv env = parseLaunchEnv({{"SLURM_PROCID", "5"},
                                        {"SLURM_NTASKS", "7"},
                                        {"SLURM_LOCALID", "1"},
                                        {"SLURM_NODEID", "2"},
                                        {"SLURM_TASKS_PER_NODE", "2(x2),3"},
                                        {"SLURM_JOB_NODELIST", "gpu[07-09],login1"},
                                        {"SLURM_JOB_ID", "123456"}});
  EXPECT_EQ(env.launcher, "slurm");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.worldSize, 7);
  EXPECT_EQ(env.localRank, 1);
  EXPECT_EQ(env.localWorldSize, 3);
  EXPECT_EQ(env.masterAddr, "gpu07");
  EXPECT_EQ(env.masterPort, 29500 + 456);
}

TEST(ParseLaunchEnv, SlurmJobIdsPast2To31) {
  const LaunchEnv env = parseLaunchEnv({{"SLURM_PROCID", "0"},
                                        {"SLURM_NTASKS", "1"},
                                        {"SLURM_JOB_NODELIST", "a1"},
                                        {"SLURM_JOB_ID", "3000000123"}});
  EXPECT_EQ(env.masterPort, 29500 + 123);
  EXPECT_THROW(
      parseLaunchEnv({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_ID", "-1"}}),
      InvalidArgumentError);
}

TEST(ParseLaunchEnv, ExplicitMasterWinsOverSlurmDefaults) {
  const LaunchEnv env = parseLaunchEnv({{"SLURM_PROCID", "0"},
                                        {"SLURM_NTASKS", "2"},
                                        {"SLURM_JOB_NODELIST", "a[1-2]"},
                                        {"SLURM_JOB_ID", "7"},
                                        {"MASTER_ADDR", "10.0.0.1"},
                                        {"MASTER_PORT", "4000"}});
  EXPECT_EQ(env.masterAddr, "10.0.0.1");
  EXPECT_EQ(env.masterPort, 4000);
}

TEST(ParseLaunchEnv, TorchrunVariablesWinOverSlurm) {
  const LaunchEnv env = parseLaunchEnv({{"RANK", "1"},
                                        {"WORLD_SIZE", "4"},
                                        {"SLURM_PROCID", "0"},
                                        {"SLURM_NTASKS", "1"},
                                        {"MASTER_ADDR", "h"},
                                        {"MASTER_PORT", "5"}});
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 1);
}

TEST(ParseLaunchEnv, OpenMpi) {
  const LaunchEnv env = parseLaunchEnv({{"OMPI_COMM_WORLD_RANK", "2"},
                                        {"OMPI_COMM_WORLD_SIZE", "4"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                        {"MASTER_ADDR", "head"},
                                        {"MASTER_PORT", "29501"}});
  EXPECT_EQ(env.launcher, "openmpi");
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.worldSize, 4);
  EXPECT_EQ(env.localRank, 0);
  EXPECT_EQ(env.localWorldSize, 2);
  EXPECT_THAT(invalidArgumentMessage([] {
                parseLaunchEnv({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
              }),
              HasSubstr("MASTER_ADDR is not set"));
}

TEST(SlurmHelpers, NodeListsAndTasksPerNode) {
  EXPECT_EQ(firstSlurmHost("node1"), "node1");
  EXPECT_EQ(firstSlurmHost("node[03-05,9],login1"), "node03");
  EXPECT_EQ(firstSlurmHost("login1,node[1-2]"), "login1");
  EXPECT_EQ(firstSlurmHost("rack[2]-gpu"), "rack2-gpu");
  EXPECT_THAT(invalidArgumentMessage([] { firstSlurmHost("node[1-2"); }),
              HasSubstr("SLURM node list 'node[1-2' is not valid"));
  EXPECT_EQ(slurmTasksOnNode("4", 0), 4);
  EXPECT_EQ(slurmTasksOnNode("2(x3),1", 2), 2);
  EXPECT_EQ(slurmTasksOnNode("2(x3),1", 3), 1);
  EXPECT_THAT(invalidArgumentMessage([] { slurmTasksOnNode("2(x3),1", 4); }),
              HasSubstr("lists 4 nodes but SLURM_NODEID is 4"));
}

TEST(ParseInitMethod, Schemes) {
  EXPECT_EQ(parseInitMethod("env://").kind, InitMethod::Kind::kEnv);
  const InitMethod tcp = parseInitMethod("tcp://10.1.2.3:29500");
  EXPECT_EQ(tcp.kind, InitMethod::Kind::kTcp);
  EXPECT_EQ(tcp.host, "10.1.2.3");
  EXPECT_EQ(tcp.port, 29500);
  const InitMethod v6 = parseInitMethod("tcp://[::1]:80");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 80);
  const InitMethod file = parseInitMethod("file:///shared/job/store");
  EXPECT_EQ(file.kind, InitMethod::Kind::kFile);
  EXPECT_EQ(file.path, "/shared/job/store");
  EXPECT_THAT(invalidArgumentMessage([] { parseInitMethod("tcp://host"); }),
              HasSubstr("init method 'tcp://host' is not valid (no host:port)"));
  EXPECT_THAT(invalidArgumentMessage([] { parseInitMethod("tcp://host:0"); }),
              HasSubstr("expected a TCP port number"));
  EXPECT_THAT(invalidArgumentMessage([] { parseInitMethod("file://relative"); }),
              HasSubstr("the path must be absolute"));
  EXPECT_THAT(invalidArgumentMessage([] { parseInitMethod("mpi://"); }),
              HasSubstr("expected env://, tcp://host:port or file:///absolute/path"));
}

TEST(DebugLevel, Parses) {
  EXPECT_EQ(parseDebugLevel(""), DebugLevel::kOff);
  EXPECT_EQ(parseDebugLevel("off"), DebugLevel::kOff);
  EXPECT_EQ(parseDebugLevel("INFO"), DebugLevel::kInfo);
  EXPECT_EQ(parseDebugLevel("Detail"), DebugLevel::kDetail);
  EXPECT_THAT(invalidArgumentMessage([] { parseDebugLevel("verbose"); }),
              HasSubstr("LOOM_DEBUG='verbose' is not a debug level; expected OFF, INFO or DETAIL"));
}

}  // namespace
}  // namespace loom
