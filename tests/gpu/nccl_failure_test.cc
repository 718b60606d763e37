// A rank dying mid-run: the others must stop with the watchdog's message instead of hanging.
#include "tests/gpu/nccl_harness.h"

namespace leantron::trainer::nccl_test {

// `victim` exits right after the groups are built while the others enter an AllReduce: they must
// stop on their own (no launcher kills them here), non-zero, with the watchdog's message. One
// still running at WaitAll's limit is killed there and fails as hung (no timing is asserted).
void DeadRank(int victim) {
  const int gpus = DeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  const int n = std::min(gpus, 4);
  const ParallelSizes sizes{.dp = n};
  const std::string dir = TempDir();
  std::vector<Child> children = LaunchRanks(n, FreePort(), dir, [&](int rank) {
    absl::StatusOr<ProcessGroups> groups =
        CreateNcclProcessGroups(LaunchInfoFromEnvironment(), sizes);
    if (!groups.ok()) {
      std::fprintf(stderr, "rank %d: CreateNcclProcessGroups: %s\n", rank,
                   std::string(groups.status().message()).c_str());
      return 2;
    }
    ProcessGroups g = std::move(*groups);
    const size_t count = size_t{1} << 22;
    DeviceBuffer<float> d(count);
    g.world->Barrier();
    if (rank == victim) _exit(9);
    g.world->AllReduceSum(d.get(), count);
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
    std::fprintf(stderr, "rank %d: the AllReduce returned without rank %d\n", rank, victim);
    return 0;
  });
  WaitAll(children, 120);
  for (const Child& c : children) {
    const std::string log = ReadFile(c.log);
    if (c.rank == victim) {
      EXPECT_TRUE(c.exited && c.code == 9) << "victim: " << c.code << "\n" << log;
      continue;
    }
    EXPECT_TRUE(c.exited && c.code != 0)
        << "rank " << c.rank << (c.exited ? " exited with " : " killed (hung) or died of signal ")
        << c.code << " after " << c.seconds << " s; its stderr:\n"
        << log;
    const std::string prefix = "leantron: rank " + std::to_string(c.rank) + " ";
    EXPECT_NE(log.find(prefix), std::string::npos) << "rank " << c.rank << ":\n" << log;
    EXPECT_NE(log.find("; exiting"), std::string::npos) << "rank " << c.rank << ":\n" << log;
    const size_t at = log.find(prefix);
    const std::string line =
        at == std::string::npos ? "(no message)" : log.substr(at, log.find('\n', at) - at);
    std::printf("rank %d: exit %d after %.1f s: %s\n", c.rank, c.code, c.seconds, line.c_str());
  }
}

TEST(NcclComm, DeadRankStopsTheOthers) { DeadRank(1); }

// Rank 0 serves the store: its death shows as a store that stops answering.
TEST(NcclComm, DeadStoreStopsTheOthers) { DeadRank(0); }

}  // namespace leantron::trainer::nccl_test
