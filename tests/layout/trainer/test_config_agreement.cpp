// Every rank must run the same configuration (docs/launching.md), as an SPMD program under
// mpirun: identical arguments pass (ranks differ only in their own rank), and one rank with a
// different flag makes every rank fail with a message that names that rank and the flag.
#include <gtest/gtest.h>
#include <map>
#include <string>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/training/arguments/config_agreement.h"
#include "support/scratch.h"
#include "support/spmd.h"

using namespace megadlm;

namespace {

std::map<std::string, std::string> arguments_of(int rank) {
  return {{"lr", "0.0002"}, {"micro_batch_size", "4"}, {"rank", std::to_string(rank)},
          {"local_rank", rank % 2 == 0 ? "None" : "1"}, {"tensor_model_parallel_size", "1"}};
}

std::string failure_of(const std::string& text) {
  comm::Communicator& world = test::spmd::mpi_runtime().world();
  return test::error_of([&] { training::check_same_configuration(world, text, Stream::cpu()); });
}

}  // namespace

TEST(ConfigAgreement, RanksWithTheSameArgumentsPass) {
  const int rank = test::spmd::mpi_runtime().world().rank();
  EXPECT_EQ(failure_of(training::configuration_text(arguments_of(rank))), "");
  EXPECT_NE(training::configuration_text(arguments_of(rank)).find(training::build_id()), std::string::npos);
}

TEST(ConfigAgreement, OneRankWithAnotherFlagStopsEveryRankNamingItAndTheFlag) {
  comm::Communicator& world = test::spmd::mpi_runtime().world();
  const int last = world.size() - 1;
  std::map<std::string, std::string> args = arguments_of(world.rank());
  if (world.rank() == last) {
    args["lr"] = "0.0003";
    args.erase("micro_batch_size");
  }
  const std::string err = failure_of(training::configuration_text(args));
  // Every rank, not only the differing one, fails with the differing rank's explanation.
  EXPECT_NE(err.find("failed on rank " + std::to_string(last)), std::string::npos) << err;
  const std::string on_last = " on rank " + std::to_string(last) + ", ";
  EXPECT_NE(err.find("lr: 0.0003" + on_last + "0.0002 on rank 0"), std::string::npos) << err;
  EXPECT_NE(err.find("micro_batch_size: absent" + on_last + "4 on rank 0"), std::string::npos) << err;
  EXPECT_EQ(err.find("local_rank"), std::string::npos) << err;
}

TEST(ConfigAgreement, ADifferentBuildIsADifference) {
  comm::Communicator& world = test::spmd::mpi_runtime().world();
  std::string text = training::configuration_text(arguments_of(world.rank()));
  if (world.rank() == 1) text.replace(text.find(training::build_id()), 7, "MEGADLM");
  const std::string err = failure_of(text);
  EXPECT_NE(err.find("failed on rank 1"), std::string::npos) << err;
  EXPECT_NE(err.find("megadlm build: MEGADLM"), std::string::npos) << err;
}
