// Launcher detection from fake environments (no real variables are read or set), and the
// single-process runtime that needs neither MPI nor NCCL.
#include <gtest/gtest.h>
#include <map>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/core/error.h"

using namespace megadlm;
using namespace megadlm::comm;

namespace {

using Env = std::map<std::string, std::string>;

EnvLookup fake(const Env& env) {
  return [env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

/// The error detect_launch_environment raises for `env`, or "" when it accepts it.
std::string rejection(const Env& env) {
  try {
    detect_launch_environment(fake(env));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_rejected(const Env& env, const std::vector<std::string>& parts) {
  const std::string msg = rejection(env);
  ASSERT_FALSE(msg.empty()) << "accepted an inconsistent environment";
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing from: " << msg;
}

const Env kOpenMpi = {{"OMPI_COMM_WORLD_RANK", "5"},
                      {"OMPI_COMM_WORLD_SIZE", "16"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"}};

const Env kTorchRun = {{"RANK", "3"},       {"WORLD_SIZE", "4"},         {"LOCAL_RANK", "1"},
                       {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "node-0"}, {"MASTER_PORT", "29500"}};

const Env kSrun = {{"SLURM_PROCID", "9"},   {"SLURM_NTASKS", "16"},  {"SLURM_LOCALID", "1"},
                   {"SLURM_NTASKS_PER_NODE", "8"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NODEID", "1"}};

Env with(Env env, const Env& changes) {
  for (const auto& [k, v] : changes) env[k] = v;
  return env;
}
Env without(Env env, const std::string& key) {
  env.erase(key);
  return env;
}

}  // namespace

TEST(LaunchEnvironment, NoLauncherVariablesMeanASingleProcess) {
  const LaunchEnvironment e = detect_launch_environment(fake({{"HOME", "/root"}}));
  EXPECT_EQ(e.launcher, Launcher::Single);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world_size, 1);
}

TEST(LaunchEnvironment, ReadsOpenMpiVariables) {
  const LaunchEnvironment e = detect_launch_environment(fake(kOpenMpi));
  EXPECT_EQ(e.launcher, Launcher::MpiRun);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 8);
}

TEST(LaunchEnvironment, ReadsTorchRunVariables) {
  const LaunchEnvironment e = detect_launch_environment(fake(kTorchRun));
  EXPECT_EQ(e.launcher, Launcher::TorchRun);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "node-0");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnvironment, TorchRunsAgentStoreKeepsMasterPortSoTheRendezvousTakesTheNext) {
  // torchrun (agent store) serves its own store on MASTER_PORT: ours must not bind it.
  EXPECT_EQ(detect_launch_environment(fake(with(kTorchRun, {{"TORCHELASTIC_USE_AGENT_STORE", "True"}})))
                .master_port,
            29501);
  EXPECT_EQ(detect_launch_environment(fake(with(kTorchRun, {{"TORCHELASTIC_USE_AGENT_STORE", "False"}})))
                .master_port,
            29500);
  EXPECT_EQ(detect_launch_environment(fake(with(kTorchRun, {{"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                            {"MEGADLM_RENDEZVOUS_PORT", "41000"}})))
                .master_port,
            41000);
}

TEST(LaunchEnvironment, ReadsSlurmVariables) {
  const LaunchEnvironment e = detect_launch_environment(fake(kSrun));
  EXPECT_EQ(e.launcher, Launcher::Slurm);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.rank, 9);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 8);
  EXPECT_TRUE(e.master_addr.empty());
}

TEST(LaunchEnvironment, SlurmTaskListsAreReadAtThisNode) {
  // 2 tasks on each of 3 nodes, then 1: node 3 runs one task.
  const Env uneven = with(without(kSrun, "SLURM_NTASKS_PER_NODE"),
                          {{"SLURM_TASKS_PER_NODE", "2(x3),1"}, {"SLURM_NTASKS", "7"},
                           {"SLURM_PROCID", "6"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "3"}});
  EXPECT_EQ(detect_launch_environment(fake(uneven)).local_world_size, 1);
  EXPECT_EQ(detect_launch_environment(fake(with(uneven, {{"SLURM_NODEID", "1"}, {"SLURM_PROCID", "2"}})))
                .local_world_size, 2);
  // The step's own count wins over the job's.
  EXPECT_EQ(detect_launch_environment(fake(with(kSrun, {{"SLURM_STEP_TASKS_PER_NODE", "4"}})))
                .local_world_size, 4);
  expect_rejected(with(uneven, {{"SLURM_NODEID", "4"}}), {"SLURM_TASKS_PER_NODE", "SLURM_NODEID=4"});
}

TEST(LaunchEnvironment, ABatchScriptWithoutSrunIsNotALaunch) {
  // sbatch sets SLURM_PROCID=0 and the job's task count in the script itself; only srun steps
  // (SLURM_STEP_ID) start ranks.
  const LaunchEnvironment e = detect_launch_environment(fake(without(kSrun, "SLURM_STEP_ID")));
  EXPECT_EQ(e.launcher, Launcher::Single);
  EXPECT_EQ(e.world_size, 1);
}

TEST(LaunchEnvironment, OpenMpiWinsInsideASlurmAllocation) {
  Env both = kSrun;
  for (const auto& [k, v] : kOpenMpi) both[k] = v;
  EXPECT_EQ(detect_launch_environment(fake(both)).launcher, Launcher::MpiRun);
}

TEST(LaunchEnvironment, TorchRunWinsOverTheSrunThatStartedIt) {
  Env both = kSrun;
  for (const auto& [k, v] : kTorchRun) both[k] = v;
  const LaunchEnvironment e = detect_launch_environment(fake(both));
  EXPECT_EQ(e.launcher, Launcher::TorchRun);
  EXPECT_EQ(e.rank, 3);
}

TEST(LaunchEnvironment, RejectsARankOutsideTheWorldNamingTheVariables) {
  expect_rejected(with(kTorchRun, {{"RANK", "4"}}), {"RANK=4", "WORLD_SIZE=4", "0..3"});
  expect_rejected(with(kOpenMpi, {{"OMPI_COMM_WORLD_RANK", "-1"}}), {"OMPI_COMM_WORLD_RANK=-1"});
  expect_rejected(with(kSrun, {{"SLURM_PROCID", "16"}}), {"SLURM_PROCID=16", "SLURM_NTASKS=16"});
}

TEST(LaunchEnvironment, RejectsInconsistentLocalRanks) {
  expect_rejected(with(kTorchRun, {{"LOCAL_RANK", "2"}}), {"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"});
  expect_rejected(with(kOpenMpi, {{"OMPI_COMM_WORLD_LOCAL_SIZE", "17"}}),
                  {"OMPI_COMM_WORLD_LOCAL_SIZE=17", "OMPI_COMM_WORLD_SIZE=16"});
  expect_rejected(with(kSrun, {{"SLURM_LOCALID", "8"}}), {"SLURM_LOCALID=8", "SLURM_NTASKS_PER_NODE=8"});
  expect_rejected(with(kTorchRun, {{"WORLD_SIZE", "0"}, {"RANK", "0"}}), {"WORLD_SIZE=0"});
}

TEST(LaunchEnvironment, RejectsValuesThatAreNotIntegers) {
  expect_rejected(with(kTorchRun, {{"RANK", "three"}}), {"RANK='three'", "not an integer"});
  expect_rejected(with(kOpenMpi, {{"OMPI_COMM_WORLD_SIZE", "16x"}}), {"OMPI_COMM_WORLD_SIZE='16x'"});
  expect_rejected(with(kTorchRun, {{"MASTER_PORT", ""}}), {"MASTER_PORT=''"});
  expect_rejected(with(kTorchRun, {{"MASTER_PORT", "70000"}}), {"MASTER_PORT=70000", "1..65535"});
}

TEST(LaunchEnvironment, RejectsAPartialLaunchNamingTheMissingVariable) {
  expect_rejected(without(kTorchRun, "WORLD_SIZE"), {"WORLD_SIZE is not set"});
  expect_rejected(without(kTorchRun, "LOCAL_RANK"), {"LOCAL_RANK is not set"});
  expect_rejected(without(kOpenMpi, "OMPI_COMM_WORLD_LOCAL_RANK"), {"OMPI_COMM_WORLD_LOCAL_RANK is not set"});
  expect_rejected(without(kSrun, "SLURM_NTASKS"), {"SLURM_NTASKS is not set"});
  expect_rejected(without(kSrun, "SLURM_NTASKS_PER_NODE"), {"SLURM_NTASKS_PER_NODE"});
  // A one-process torchrun-style world needs no local variables.
  const LaunchEnvironment e = detect_launch_environment(fake({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  EXPECT_EQ(e.launcher, Launcher::TorchRun);
  EXPECT_EQ(e.local_world_size, 1);
}

TEST(LaunchEnvironment, LauncherNamesForMessages) {
  EXPECT_STREQ(launcher_name(Launcher::MpiRun), "mpirun");
  EXPECT_STREQ(launcher_name(Launcher::Slurm), "srun");
  EXPECT_STREQ(launcher_name(Launcher::TorchRun), "torchrun");
  EXPECT_STREQ(launcher_name(Launcher::Single), "single process");
}

TEST(DistributedRuntime, ASingleProcessNeedsNoMpi) {
  DistributedRuntime rt(LaunchEnvironment{}, Transport::Mpi, std::chrono::seconds(5));
  EXPECT_EQ(rt.device(), Device::cpu());
  EXPECT_EQ(rt.world().size(), 1);
  EXPECT_EQ(rt.world().rank(), 0);
  EXPECT_EQ(rt.world().name(), "world");
  EXPECT_EQ(rt.world().timeout(), std::chrono::seconds(5));
  Tensor t = Tensor::from_floats({1.0f, -2.0f}, {2});
  rt.world().all_reduce(t, ReduceOp::Avg, Stream::cpu());
  EXPECT_EQ(t.to_floats(Stream::cpu()), (std::vector<float>{1.0f, -2.0f}));
}

TEST(DistributedRuntime, RejectsANonPositiveTimeoutAndAnInconsistentEnvironment) {
  EXPECT_THROW(DistributedRuntime(LaunchEnvironment{}, Transport::Mpi, std::chrono::milliseconds(0)), Error);
  LaunchEnvironment bad;
  bad.rank = 2;
  try {
    DistributedRuntime rt(bad, Transport::Mpi, std::chrono::seconds(1));
    ADD_FAILURE() << "accepted rank 2 of 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank=2"), std::string::npos) << e.what();
  }
}

TEST(DistributedRuntime, ACpuRunUnderTorchRunIsRefusedWithTheReason) {
  LaunchEnvironment env;
  env.launcher = Launcher::TorchRun;
  env.world_size = 2;
  env.rank = 1;
  env.local_world_size = 2;
  env.local_rank = 1;
  try {
    DistributedRuntime rt(env, Transport::Mpi, std::chrono::seconds(1));
    ADD_FAILURE() << "a 2-process CPU run under torchrun was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(mpi_compiled() ? "mpirun or srun" : "without it"), std::string::npos) << msg;
  }
}

TEST(DistributedRuntime, ACudaRunWithoutAGpuSaysSo) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  try {
    DistributedRuntime rt(LaunchEnvironment{}, Transport::Nccl, std::chrono::seconds(1));
    ADD_FAILURE() << "the NCCL transport started without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a GPU"), std::string::npos) << e.what();
  }
}
