// The NCCL process groups across forked ranks, one GPU each (N = min(GPUs, 4), skipped below 2),
// for every TP x PP x DP layout of N: each group's members in Megatron's order, and every check
// of the other files run on them.
#include "tests/gpu/nccl_harness.h"

namespace leantron::trainer::nccl_test {

struct Expected {
  std::vector<int> world, tp, cp, dp, pp, model, embedding;
};

// Megatron-Core's order tp-cp-ep-dp-pp written out: rank = t + TP·(c + CP·(e + EP·(d + DP·p))).
Expected ExpectedGroups(int rank, const ParallelSizes& s) {
  const int t0 = rank % s.tp, c0 = rank / s.tp % s.cp, e0 = rank / (s.tp * s.cp) % s.ep,
            d0 = rank / (s.tp * s.cp * s.ep) % s.dp, p0 = rank / (s.tp * s.cp * s.ep * s.dp);
  auto at = [&](int t, int c, int d, int p) {
    return t + s.tp * (c + s.cp * (e0 + s.ep * (d + s.dp * p)));
  };
  Expected e;
  for (int r = 0; r < s.world(); ++r) e.world.push_back(r);
  for (int t = 0; t < s.tp; ++t) e.tp.push_back(at(t, c0, d0, p0));
  for (int c = 0; c < s.cp; ++c) e.cp.push_back(at(t0, c, d0, p0));
  for (int d = 0; d < s.dp; ++d) e.dp.push_back(at(t0, c0, d, p0));
  for (int p = 0; p < s.pp; ++p) e.pp.push_back(at(t0, c0, d0, p));
  for (int p = 0; p < s.pp; ++p)
    for (int t = 0; t < s.tp; ++t) e.model.push_back(at(t, c0, d0, p));
  if (s.pp > 1 && (p0 == 0 || p0 == s.pp - 1))
    e.embedding = {at(t0, c0, d0, 0), at(t0, c0, d0, s.pp - 1)};
  return e;
}

int RunChecks(int rank, const ParallelSizes& sizes) {
  const LaunchInfo launch = LaunchInfoFromEnvironment();
  absl::StatusOr<ProcessGroups> groups = CreateNcclProcessGroups(launch, sizes);
  if (!groups.ok()) {
    std::fprintf(stderr, "rank %d: CreateNcclProcessGroups: %s\n", rank,
                 std::string(groups.status().message()).c_str());
    return 1;
  }
  Checker c;
  c.world_rank = rank;
  {
    ProcessGroups g = std::move(*groups);
    const Expected e = ExpectedGroups(rank, sizes);
    c.Expect(g.world_rank == rank, "world_rank");
    cudaStream_t user;
    LT_CUDA_CHECK(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
    CheckCollectives("world", g.world.get(), e.world, rank, user, c);
    CheckCollectives("tp", g.tp.get(), e.tp, rank, user, c);
    CheckCollectives("cp", g.cp.get(), e.cp, rank, user, c);
    CheckCollectives("dp", g.dp.get(), e.dp, rank, user, c);
    CheckCollectives("pp", g.pp.get(), e.pp, rank, user, c);
    CheckCollectives("model", g.model.get(), e.model, rank, user, c);
    c.Expect((g.embedding != nullptr) == !e.embedding.empty(), "embedding presence");
    if (g.embedding != nullptr && !e.embedding.empty()) {
      CheckCollectives("embedding", g.embedding.get(), e.embedding, rank, user, c);
    }
    // Pipeline neighbours (channels made at setup), and a pair made at first use.
    if (g.pp->size() > 1) CheckRing("pp", g.pp.get(), rank, user, c);
    if (g.tp->size() == 2) CheckRing("tp", g.tp.get(), rank, user, c);
    if (g.tp->size() > 1) CheckPeerExchange("tp", g.tp.get(), rank, c);
    if (g.world->size() > 1) CheckPeerExchange("world", g.world.get(), rank, c);
    if (g.dp->size() == 2) CheckGradReducer("dp", g.dp.get(), c);
    if (g.dp->size() == 2) CheckShardedGradReducer("dp", g.dp.get(), c);
    g.world->Barrier();
    LT_CUDA_CHECK(cudaStreamSynchronize(user));
    LT_CUDA_CHECK(cudaStreamDestroy(user));
  }  // destroying the groups: every rank says goodbye, rank 0 last
  if (c.failures == 0) std::fprintf(stderr, "rank %d: all checks passed\n", rank);
  return c.failures == 0 ? 0 : 1;
}

std::string Describe(const ParallelSizes& s) {
  return "tp=" + std::to_string(s.tp) + " pp=" + std::to_string(s.pp) +
         " dp=" + std::to_string(s.dp);
}

TEST(NcclComm, CollectivesAndPointToPoint) {
  const int gpus = DeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  const int n = std::min(gpus, 4);
  std::vector<ParallelSizes> configs;
  for (int tp : {2, 1}) {
    for (int pp = 1; pp <= n; ++pp) {
      if (n % (tp * pp) == 0) configs.push_back({.tp = tp, .dp = n / (tp * pp), .pp = pp});
    }
  }
  for (const ParallelSizes& sizes : configs) {
    SCOPED_TRACE(Describe(sizes));
    const std::string dir = TempDir();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Child> children =
        LaunchRanks(n, FreePort(), dir, [&](int rank) { return RunChecks(rank, sizes); });
    WaitAll(children, 120);
    std::printf("[ %s ] %d ranks: %.1f s\n", Describe(sizes).c_str(), n,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (const Child& c : children) {
      EXPECT_TRUE(c.exited && c.code == 0)
          << "rank " << c.rank << (c.exited ? " exited with " : " died of signal ") << c.code
          << " after " << c.seconds << " s; its stderr:\n"
          << ReadFile(c.log);
    }
  }
}

}  // namespace leantron::trainer::nccl_test
